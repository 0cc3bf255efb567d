"""Shared fixtures: a gateway state folder and a stdio session against `mcp-gateway serve`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import GatewayHome, StdioSession

pytest_plugins = ("tests.pg_cluster",)  # a throwaway PostgreSQL for the `postgres` tests, when one can run


@pytest.fixture
def make_gateway(tmp_path: Path) -> Callable[..., GatewayHome]:
    counter = iter(range(1000))

    def make(policy: dict[str, Any] | None = None, db_url: str | None = None) -> GatewayHome:
        root = tmp_path / f"gw{next(counter)}"
        root.mkdir()
        return GatewayHome(root, policy or {}, db_url)

    return make


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    gw = make_gateway()
    gw.add_user("alice", "USER")
    gw.add_user("vic", "VIEWER")
    gw.add_user("root", "ADMIN")
    return gw


@pytest.fixture
def open_session() -> Iterator[Callable[..., StdioSession]]:
    sessions: list[StdioSession] = []

    def start(
        gw: GatewayHome, initialize: bool = True, capabilities: dict[str, Any] | None = None, **kwargs: Any
    ) -> StdioSession:
        session = StdioSession(gw, **kwargs)
        sessions.append(session)
        if initialize:
            response = session.initialize(capabilities)
            assert "result" in response, response
        return session

    yield start
    for session in sessions:
        session.close()
