"""A real database, migrated to the newest schema, for the store tests (SQLite and PostgreSQL), and the
MCP server in process for the server tests (tests/memory_session.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway.db import make_engine
from tests.harness import GatewayHome
from tests.memory_session import MemorySession, memory_session
from tests.sqlite_template import copy_migrated, migrated


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """Every test of a store runs on both engines (`db_url`, tests/conftest.py); on SQLite the file
    starts as a copy of the process's migrated template (tests/sqlite_template.py)."""
    copy_migrated(db_url)
    engine = make_engine(db_url)
    migrated(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def open_memory() -> Iterator[Callable[..., MemorySession]]:
    """Clients of `build_server` in process (tests/memory_session.py), each closed at the end of the test."""
    with ExitStack() as stack:

        def start(gateway: GatewayHome, **kwargs: Any) -> MemorySession:
            return stack.enter_context(memory_session(gateway, **kwargs))

        yield start
