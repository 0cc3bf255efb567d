"""A real database, migrated to the newest schema, for the store tests: SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from gateway.db import make_engine, migrate


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """Every test of a store runs on both engines (`db_url`, tests/conftest.py)."""
    engine = make_engine(db_url)
    migrate(engine)
    yield engine
    engine.dispose()
