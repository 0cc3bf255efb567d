"""gateway/users.py: user names (no control characters where a name is shown or signed)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from gateway.clock import SystemClock
from gateway.users import UserError, UserStore, check_user_name


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
