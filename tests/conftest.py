"""Shared fixtures: a gateway state folder (on SQLite, or on the test's `db_url`) and a stdio session against `mcp-gateway serve`."""

from __future__ import annotations

import gc
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import forked_gateway
from tests.deadlines import time_scale
from tests.harness import REPO, GatewayHome, StdioSession

gc.disable()  # until the end of collection: `pytest_collection`

pytest_plugins = (
    "tests.pg_cluster",  # a throwaway PostgreSQL for the `postgres` tests, when one can run
    "tests.leftover_processes",  # the session's last check: no process the suite started is left running
    "tests.cpu_costs",  # `--cpu-costs=N`: the N costliest tests and fixtures, in CPU
    "tests.forked_workers",  # `--forks N`: workers forked after one collection (`make unit`)
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
    "tests/gateway/test_layers.py": "layers",  # the import graph, parsed once a process (0.3 s of CPU), read by five tests
}
"""The tests that share one resource with each other, by where they are: `make test` runs the
suite in parallel (pytest-xdist), and each group goes whole to one worker, in order, while every
other test goes on its own to whichever worker is free. Everything else a test uses is its own:
temp folders, a SQLite file or a PostgreSQL database (`db_url`), a run uid held by flock
(sandbox/backends/identity.py)."""


CELL_GROUPS = ("tests/e2e/test_upstream_matrix.py",)
"""Modules of one module-scoped fixture per parameter (a gateway per cell of a matrix): the tests of one
parameter are a unit, built once on the worker that takes it, while the cells run side by side."""


SLOW_FIRST = (
    "tests/gateway/test_visible.py",  # 6.9 s: every code point through a real terminal
    "tests/sandbox/test_pidns.py",  # 6.3 s: a watchdog ending a stuck gateway's run
    "tests/sandbox/test_patch_shown.py",  # 5.2 s: a diff's CPU bound over its line shapes
    "tests/gateway/test_call_trail.py",  # 3.3 s: open connections shown a period apart
    "tests/sandbox/test_leftovers.py",  # 3.2 s: the sweep while folders vanish
    "tests/sandbox/test_server.py",  # 3.1 s: a server living past its timeout
    "tests/gateway/test_server_progress_refusals.py",  # 3.1 s: consent timeouts
    "tests/gateway/test_budget.py",  # 2.8 s: racing processes
    "tests/gateway/test_server_permission_bounds.py",  # 2.8 s
    "tests/sandbox/test_workspace_runs.py",  # 2.6 s: sandboxed runs
    "tests/gateway/test_console_routes.py",  # 2.4 s
    "tests/gateway/test_serve_task_groups.py",  # 2.0 s
    "tests/gateway/test_proxy.py",  # 2.0 s: a consent wait
    "tests/sandbox/test_proxy_listener.py",  # 1.9 s
    "tests/gateway/test_server_round_trip_cards.py",  # 1.7 s: an answer after the timeout
    "tests/sandbox/test_change_set_reads.py",  # 1.7 s
    "tests/gateway/test_pg_reuse.py",  # 0.7 s a test: clusters of their own
    "tests/sandbox/test_runner.py",  # 1.5 s: a timeout
    "tests/gateway/test_server_check_permission.py",  # 1.5 s
    "tests/gateway/test_server_env_token.py",  # 1.5 s
    "tests/gateway/test_db_threads.py",  # 1.4 s: a bound on a thread's wait
)
"""The modules of the unit tier whose tests take longest (the longest test's wall time on a loaded machine,
from `--cpu-costs`, tests/cpu_costs.py), longest first: a run starts them first, each module whole, so that
a parallel run ends on short tests instead of one worker alone with a watchdog's wait while the others
have nothing left (decision 103). Only the order changes; a name that is no file stops the run."""


def slow_first(items: list[pytest.Item]) -> None:
    """Move the tests of `SLOW_FIRST`'s modules to the front, in its order; everything else keeps its order."""
    for module in SLOW_FIRST:
        if not (REPO / module).is_file():
            raise pytest.UsageError(f"tests/conftest.py, SLOW_FIRST: {module} is no file; rename or remove it")
    rank = {module: index for index, module in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    """The garbage collector off from this module's import to the end of collection, then on again, after one
    collection of what imports and collection left (its finalisers, and the warnings they raise, run as
    before), with all that is left frozen: the modules, items and parametrisations (about 165,000 objects in
    a worker of `make unit`) live until the process ends, and each full collection during the tests walked
    them again. A worker of `make unit` spent about 0.9 s in the collector before its first test, 2 s more
    during its tests (decision 103). Nothing the tests make is frozen. In pytest-xdist's controller, which
    collects nothing, this runs at its session's start."""
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Frozen again at the process's end: every pytest process (the controller and each worker) then exits
    without a last collection over all it built (a process that collected the unit tier took 0.61 s from its
    last line to its exit, 0.13 s frozen; 6 workers end at once on 2 cores). Every exit handler still runs
    (coverage's too)."""
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before the leftover check (tests/leftover_processes.py) looks for processes
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop this process's CLI fork helper (tests/forked_gateway.py), if a test started one."""
    forked_gateway.stop_helper()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest modules first (`slow_first`), and every test's pytest-timeout limit (its marker's, else
    --timeout's, else pyproject's) times TEST_TIME_SCALE."""
    slow_first(items)
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
