"""A real SQLite database, migrated to the newest schema, for the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway.db import make_engine, migrate


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path}/g.db")
    migrate(engine)
    yield engine
    engine.dispose()
