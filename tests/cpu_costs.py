"""Where the suite's CPU goes: `--cpu-costs=N` lists the N costliest tests and fixtures (a pytest plugin, tests/conftest.py).

CPU, not wall: on a busy machine (other suites, other engineers) wall time says how long a test
waited for a core, CPU time what it cost. Each test's cost is user+system time of the process
running it (RUSAGE_SELF) plus that of every child it waited for (RUSAGE_CHILDREN: the gateways,
CLIs and sandboxed runs it started, and their own waited-for children), across its whole
protocol (setup, call, teardown). A fixture's cost is its setup alone, without the fixtures it
asked for (listed on their own), summed over every test that set it up. Costs are measured in
each worker (pytest-xdist's, or tests/forked_workers.py's) and summed by the controller, which prints them at
the end with the CPU of the whole run's workers (an xdist worker's imports and collection included; a forked
worker's from its fork: the parent's collection is in "this process") and of the PostgreSQL server
the session started, which no rusage of the suite's counts. Off by default: nothing is measured
without the option.

    .venv/bin/python -m pytest -n 4 tests/gateway tests/sandbox --cpu-costs=30
"""

from __future__ import annotations

import resource
import time
from collections import Counter, defaultdict
from collections.abc import Generator, Mapping
from typing import Any

import psutil
import pytest

from tests.pg_cluster import reuse_counts, session_server_pids

OPTION = "--cpu-costs"
WORKER_KEY = "cpu_costs"
"""The key of a worker's costs in pytest-xdist's `workeroutput` (sent to the controller as it stops)."""


def server_cpu_seconds() -> float | None:
    """The CPU of the PostgreSQL server this session started (tests/pg_cluster.py) so far: the postmaster,
    its live processes and its ended backends (it waits for them); None when it started none."""
    total = None
    for pid in session_server_pids():
        try:
            postmaster = psutil.Process(pid)
            processes = [postmaster, *postmaster.children()]
        except psutil.Error:
            continue
        total = total or 0.0
        for process in processes:  # the live ones: the checkpointer, the WAL writer, open sessions
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        times = postmaster.cpu_times()
        total += times.children_user + times.children_system
    return total


def cpu_seconds() -> float:
    """User+system CPU of this process and of every child it has waited for, in seconds."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuCosts:
    """The costs of one process's tests and fixtures (see the module's docstring)."""

    def __init__(self) -> None:
        self.tests: defaultdict[str, float] = defaultdict(float)
        self.test_walls: defaultdict[str, float] = defaultdict(float)
        self.fixtures: defaultdict[str, float] = defaultdict(float)
        self.fixture_setups: Counter[str] = Counter()
        self.worker_cpu: float | None = None
        self.databases: Counter[str] = Counter()
        """How the PostgreSQL test databases ended (tests/pg_cluster.py, `recycle`): reused, or why dropped."""
        self.started = time.time()
        self.last_tests: list[float] = []
        """When each pytest-xdist worker ended its last test, in seconds since this session started: one
        ending well before another is a core idle at the end."""
        self._last_test = self.started
        self._first_test: float | None = None
        self.spans: dict[str, tuple[float, float]] = {}
        """When each test began and ended (time.time()), to list the tail: what ran while a worker sat idle."""
        self.first_tests: list[float] = []
        """When each pytest-xdist worker began its first test: its start-up and collection before it."""
        """The CPU of every pytest-xdist worker, as each measured it when its session ended (None without xdist)."""
        self._nested: list[float] = []
        """For each fixture being set up, the CPU its own dependencies took so far (subtracted from its cost)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        cpu, wall = cpu_seconds(), time.monotonic()
        if self._first_test is None:
            self._first_test = time.time()
        try:
            return (yield)
        finally:
            self.tests[item.nodeid] += cpu_seconds() - cpu
            self.test_walls[item.nodeid] += time.monotonic() - wall
            self._last_test = time.time()
            self.spans[item.nodeid] = (self._last_test - (time.monotonic() - wall), self._last_test)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[None, object, object]:
        start = cpu_seconds()
        self._nested.append(0.0)
        try:
            return (yield)
        finally:
            inclusive = cpu_seconds() - start
            dependencies = self._nested.pop()
            self.fixtures[fixturedef.argname] += inclusive - dependencies
            self.fixture_setups[fixturedef.argname] += 1
            if self._nested:
                self._nested[-1] += inclusive

    def as_output(self) -> dict[str, Any]:
        return {
            "tests": dict(self.tests),
            "test_walls": dict(self.test_walls),
            "fixtures": dict(self.fixtures),
            "fixture_setups": dict(self.fixture_setups),
            "process": cpu_seconds(),
            "databases": dict(reuse_counts),
            "last_test": self._last_test,
            "first_test": self._first_test or self._last_test,
            "spans": self.spans,
        }

    def add(self, output: Mapping[str, Any]) -> None:
        """Add one worker's `as_output`."""
        for mine, theirs in (
            (self.tests, output["tests"]),
            (self.test_walls, output["test_walls"]),
            (self.fixtures, output["fixtures"]),
        ):
            for key, value in theirs.items():
                mine[key] += value
        self.fixture_setups.update(output["fixture_setups"])
        self.worker_cpu = (self.worker_cpu or 0.0) + output["process"]
        self.databases.update(output["databases"])
        self.last_tests.append(output["last_test"] - self.started)
        self.first_tests.append(output["first_test"] - self.started)
        self.spans.update(
            {nodeid: (start - self.started, end - self.started) for nodeid, (start, end) in output["spans"].items()}
        )


def costliest(costs: Mapping[str, float], top: int) -> list[tuple[str, float]]:
    return sorted(costs.items(), key=lambda item: item[1], reverse=True)[:top]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        type=int,
        default=0,
        metavar="N",
        help="measure each test's and fixture's CPU (self + waited-for children) and list the N costliest",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(OPTION):
        config.pluginmanager.register(CpuCosts(), "cpu_costs")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, on the controller
def pytest_testnodedown(node: Any, error: object) -> None:
    pytest_forked_worker_down(node.config, getattr(node, "workeroutput", {}))


@pytest.hookimpl(optionalhook=True)  # tests/forked_workers.py's, on the parent
def pytest_forked_worker_down(config: pytest.Config, workeroutput: Mapping[str, Any]) -> None:
    costs = config.pluginmanager.get_plugin("cpu_costs")
    output = workeroutput.get(WORKER_KEY)
    if costs is not None and output is not None:
        costs.add(output)


def pytest_sessionfinish(session: pytest.Session) -> None:
    costs = session.config.pluginmanager.get_plugin("cpu_costs")
    if costs is not None and hasattr(session.config, "workeroutput"):
        session.config.workeroutput[WORKER_KEY] = costs.as_output()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    costs = config.pluginmanager.get_plugin("cpu_costs")
    if costs is None or hasattr(config, "workerinput"):
        return
    top = config.getoption(OPTION)
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", "CPU costs (user+sys, self + waited-for children)")
    in_tests = sum(costs.tests.values())
    workers = costs.worker_cpu
    walls = sum(costs.test_walls.values())
    write(f"tests: {len(costs.tests)}, {in_tests:.1f} s of CPU in their protocols, {walls:.1f} s of wall in all")
    if workers is not None:
        write(f"workers: {workers:.1f} s of CPU in all (an xdist worker's imports and collection included)")
    own = resource.getrusage(resource.RUSAGE_SELF)
    write(f"this process: {cpu_seconds():.1f} s of CPU, {own.ru_utime + own.ru_stime:.1f} s of it its own")
    server = server_cpu_seconds()
    if server is not None:
        write(f"the suite's PostgreSQL server: {server:.1f} s of CPU (not counted above: not this process's child)")
    databases = costs.databases + reuse_counts
    if databases:
        write("PostgreSQL test databases: " + ", ".join(f"{count} {how}" for how, count in databases.most_common()))
    if costs.first_tests:
        starts = ", ".join(f"{start:.1f}" for start in sorted(costs.first_tests))
        write(f"each worker's first test began at (s since the session started): {starts}")
    if costs.last_tests:
        ends = ", ".join(f"{end:.1f}" for end in sorted(costs.last_tests))
        write(f"each worker's last test ended at (s since the session started): {ends}")
    if costs.last_tests and costs.spans:
        first_idle = min(costs.last_tests)
        tail = sorted((span, nodeid) for nodeid, span in costs.spans.items() if span[1] > first_idle)
        write(f"-- the tail: the tests still running once a worker had no more ({len(tail)}; began, ended s)")
        for (start, end), nodeid in tail[-top:]:
            write(f"{start:8.1f} {end:8.1f}  {nodeid}")
    write(f"-- the {top} costliest tests (CPU s, wall s)")
    for nodeid, cpu in costliest(costs.tests, top):
        write(f"{cpu:8.3f} {costs.test_walls[nodeid]:8.3f}  {nodeid}")
    waits = {nodeid: costs.test_walls[nodeid] - cpu for nodeid, cpu in costs.tests.items()}
    write(f"-- the {top} tests that wait the longest (wall less CPU s, wall s): a core free for another worker")
    for nodeid, wait in costliest(waits, top):
        write(f"{wait:8.3f} {costs.test_walls[nodeid]:8.3f}  {nodeid}")
    write(f"-- the {top} costliest fixtures (CPU s of their own set-ups, set-ups, ms each)")
    for name, cpu in costliest(costs.fixtures, top):
        setups = costs.fixture_setups[name]
        write(f"{cpu:8.3f} {setups:6d} {1000 * cpu / setups:8.1f}  {name}")
    by_module: defaultdict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    for nodeid, cpu in costs.tests.items():
        module = nodeid.split("::", 1)[0]
        by_module[module] += cpu
        counts[module] += 1
    write(f"-- the {top} costliest modules (CPU s, tests, ms each)")
    for module, cpu in costliest(by_module, top):
        write(f"{cpu:8.3f} {counts[module]:6d} {1000 * cpu / counts[module]:8.1f}  {module}")
    module_walls: defaultdict[str, float] = defaultdict(float)
    for nodeid, wall in costs.test_walls.items():
        module_walls[nodeid.split("::", 1)[0]] += wall
    write(f"-- the {top} longest modules in wall time (wall s, CPU s, tests)")
    for module, wall in costliest(module_walls, top):
        write(f"{wall:8.3f} {by_module[module]:8.3f} {counts[module]:6d}  {module}")
