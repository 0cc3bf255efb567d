"""gateway/users.py: user names (no control characters where a name is shown or signed); the hash a sign-in without
a stored one is checked against."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from gateway.clock import SystemClock
from gateway.users import (
    NO_USER_HASH,
    UserError,
    UserStore,
    check_user_name,
    hash_password,
    no_password_matches,
    password_matches,
)


@pytest.mark.parametrize("name", ["alice", "first.last", "bob@example.com", "joão", "Ana Maria", "x"])
def test_ordinary_names_pass(name: str) -> None:
    check_user_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "alice\n",
        "alice\r\n",
        "al\nice",
        "alice\x00",
        "\x1b[31malice",
        "alice\u202e",
        "alice\u2028",
        " alice",
        "alice ",
    ],
    ids=["empty", "newline", "crlf", "embedded", "nul", "escape", "bidi", "line-separator", "leading", "trailing"],
)
def test_names_with_control_characters_are_refused(name: str, engine: Engine) -> None:
    with pytest.raises(UserError, match="control characters"):
        check_user_name(name)
    with pytest.raises(UserError):
        UserStore(engine, SystemClock()).add(name, "USER", ("default",))
    assert UserStore(engine, SystemClock()).list() == []


def test_a_sign_in_without_a_stored_hash_is_checked_at_the_gateways_own_rounds() -> None:
    """An unknown name costs what a wrong password does only while NO_USER_HASH names the scheme and rounds that
    `hash_password` stores: a change of rounds must change both (the cost of a check is the rounds its hash names)."""
    stored = hash_password("a password")
    scheme_and_rounds = stored.rsplit("$", 2)[0]
    assert NO_USER_HASH.rsplit("$", 2)[0] == scheme_and_rounds
    assert password_matches("a password", stored) and not password_matches("another", stored)
    assert not no_password_matches("a password") and not no_password_matches("")
