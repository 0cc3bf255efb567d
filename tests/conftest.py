"""Shared fixtures: a gateway state folder (on SQLite, or on the test's `db_url`) and a stdio session against `mcp-gateway serve`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forked_gateway
from tests.deadlines import time_scale
from tests.harness import GatewayHome, StdioSession

pytest_plugins = (
    "tests.pg_cluster",  # a throwaway PostgreSQL for the `postgres` tests, when one can run
    "tests.leftover_processes",  # the session's last check: no process the suite started is left running
    "tests.cpu_costs",  # `--cpu-costs=N`: the N costliest tests and fixtures, in CPU
)

SERIAL_GROUPS = {
    "tests/hosts/": "guest",  # one QEMU guest per worker that needs it: boot it once (about a minute under TCG)
    "tests/rootless/": "rootless",  # every test is USER_UID's: the shared arena and the NPROC tests of that one uid
    "tests/e2e/test_wheel.py": "wheel",  # the module builds and installs the wheel once
    # An ordinary uid of one module's own: its NPROC and "nothing of the uid is left" checks count every process of it.
    "tests/sandbox/test_userns.py": "uid-64072",
    "tests/e2e/test_doctor.py": "uid-64071",
    "tests/e2e/test_demo.py": "uid-64073",
    "tests/e2e/test_console.py": "console",  # one Chromium and one console for the module (its screenshots too)
    "tests/e2e/test_fleet.py": "fleet",  # one fleet of 16 gateways per engine for the module: starting one is most of its time
    "tests/e2e/test_database_saturation.py": "saturation",  # 100 calls behind a held lock, timed: one engine at a time
}
"""The tests that share one resource with each other, by where they are: `make test` runs the
suite in parallel (pytest-xdist), and each group goes whole to one worker, in order, while every
other test goes on its own to whichever worker is free. Everything else a test uses is its own:
temp folders, a SQLite file or a PostgreSQL database (`db_url`), a run uid held by flock
(sandbox/backends/identity.py)."""


CELL_GROUPS = ("tests/e2e/test_upstream_matrix.py",)
"""Modules of one module-scoped fixture per parameter (a gateway per cell of a matrix): the tests of one
parameter are a unit, built once on the worker that takes it, while the cells run side by side."""


def serial_group(nodeid: str) -> str:
    """The unit of work a test belongs to: its group, its module's cell, or the test alone."""
    for module in CELL_GROUPS:
        if nodeid.startswith(module + "::") and nodeid.endswith("]"):
            return module + nodeid[nodeid.rindex("[") :]
    return next((group for prefix, group in SERIAL_GROUPS.items() if nodeid.startswith(prefix)), nodeid)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without -n it is never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load-by-scope scheduler, with `serial_group` as the scope (largest units first).

    Not `--dist loadgroup`: it renames the tests' node ids, which pytest 9 no longer lets a plugin do."""
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroups(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            return serial_group(nodeid)

    return SerialGroups(config, log)


@pytest.hookimpl(tryfirst=True)  # before the leftover check (tests/leftover_processes.py) looks for processes
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop this process's CLI fork helper (tests/forked_gateway.py), if a test started one."""
    forked_gateway.stop_helper()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test's pytest-timeout limit (its marker's, else --timeout's, else pyproject's) times TEST_TIME_SCALE."""
    scale = time_scale()
    if scale == 1:
        return
    default = config.getoption("timeout", None) or config.getini("timeout") or 0
    for item in items:
        marker = item.get_closest_marker("timeout")
        limit = (
            default if marker is None else (marker.args[0] if marker.args else marker.kwargs.get("timeout", default))
        )
        if limit:
            options = {} if marker is None else {k: v for k, v in marker.kwargs.items() if k != "timeout"}
            item.add_marker(pytest.mark.timeout(float(limit) * scale, **options), append=False)


@pytest.fixture
def make_gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., GatewayHome]]:
    """Build state folders, each with a SQLite file of its own; when the test asks for `db_url`,
    on that database instead (every gateway of the test then shares it, as a fleet does)."""
    counter = iter(range(1000))
    engine_url = request.getfixturevalue("db_url") if "db_url" in request.fixturenames else None
    made: list[GatewayHome] = []

    def make(policy: dict[str, Any] | None = None, db_url: str | None = None) -> GatewayHome:
        root = tmp_path / f"gw{next(counter)}"
        root.mkdir()
        gateway = GatewayHome(root, policy or {}, db_url or engine_url)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.engine.dispose()


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
