"""Engine settings per dialect (gateway/db.py): PostgreSQL connections carry bounds on every wait (issue 12, item 1)."""

from __future__ import annotations

import pytest

from gateway.db import POSTGRES_BOUNDS, make_engine


def connect_kwargs(url: str) -> dict[str, object]:
    engine = make_engine(url)  # lazy: nothing connects here, this shows what libpq would be given
    return dict(engine.dialect.create_connect_args(engine.url)[1])


def test_a_postgresql_url_gets_timeouts_and_keepalives() -> None:
    given = connect_kwargs("postgresql+psycopg://gw:secret@127.0.0.1:5432/gateway")
    for name, value in POSTGRES_BOUNDS.items():
        assert given[name] == value
    options = str(given["options"])
    for setting in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout"):
        assert f"-c {setting}=" in options


@pytest.mark.parametrize(
    ("query", "kept"),
    [
        ("options=-c%20statement_timeout%3D5000", {"options": "-c statement_timeout=5000"}),
        ("connect_timeout=3&keepalives_idle=5", {"connect_timeout": "3", "keepalives_idle": "5"}),
    ],
)
def test_what_the_url_sets_itself_wins(query: str, kept: dict[str, str]) -> None:
    given = connect_kwargs(f"postgresql+psycopg://gw@127.0.0.1/gateway?{query}")
    for name, value in kept.items():
        assert given[name] == value
    assert given["keepalives"] == "1"


def test_sqlite_urls_are_left_alone() -> None:
    given = connect_kwargs("sqlite:///:memory:")
    assert not set(POSTGRES_BOUNDS) & set(given)
