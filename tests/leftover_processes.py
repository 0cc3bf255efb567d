"""No test leaves a process behind: the session's last check (a pytest plugin, tests/conftest.py).

The controller (the one pytest process of a run, pytest-xdist's controller, or the parent of the
workers tests/forked_workers.py forks) puts a token of this run in its environment (RUN_VARIABLE),
before the workers start, and every process the suite starts inherits it: the workers, the gateways,
the consoles, the approvers in their terminals, Node.js, Chromium, QEMU. When the session ends (every
fixture torn down, every worker gone), the controller looks for what the run started and is still alive:

- a process whose environment carries the token, and every descendant of one;
- a descendant of the controller itself;
- a process working in one of the run's workspaces (`run_folder_prefix`: GatewayHome's are named
  with the token), as a sandboxed run does with an environment of its own.

The suite's PostgreSQL cluster is not counted (the session stops it right after); a zombie is
dead and is not counted. Each leftover is named with its pid, its command line and the test whose
phase started it (PYTEST_CURRENT_TEST, which pytest sets in the environment during each phase),
and the run fails (exit status 1). Nothing is killed: the fixture or test that started it must
stop it, even when its own start fails or times out. Why this way: docs/decisions/0076-the-suites-plumbing.md.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass

import psutil
import pytest

from tests.deadlines import scaled
from tests.pg_cluster import session_server_pids

RUN_VARIABLE = "MCP_WRITE_GATEWAY_SUITE_RUN"
GRACE_S = 5.0
"""How long a process found at the end may take to finish exiting (a worker, a console told to stop)."""
REPORT_KEY = "left running"
"""The terminal summary's word for them: "... 3 passed, 1 left running in 9.1s"."""


def run_token() -> str:
    """This run's token (set by the controller in `pytest_configure`), or "" outside a run."""
    return os.environ.get(RUN_VARIABLE, "")


def run_folder_prefix() -> str:
    """The name prefix of a folder whose processes belong to this run (see the module's docstring)."""
    return f"mcp-gw-test-{run_token()}-"


@dataclass(frozen=True, slots=True)
class Leftover:
    pid: int
    command: str
    started_by: str

    def __str__(self) -> str:
        return f"pid {self.pid} (started in {self.started_by}): {self.command}"


def _environment(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        return {}


def _working_folder(process: psutil.Process) -> str:
    try:
        return process.cwd()
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        return ""


def _with_descendants(processes: list[psutil.Process]) -> dict[int, psutil.Process]:
    found = {process.pid: process for process in processes}
    for process in processes:
        try:
            found.update((child.pid, child) for child in process.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def leftovers(token: str) -> list[Leftover]:
    """The live processes of the run marked by `token` (see the module's docstring), this process excepted."""
    me = psutil.Process()
    spared = {me.pid} | {parent.pid for parent in me.parents()}
    spared |= set(_with_descendants([psutil.Process(pid) for pid in session_server_pids() if psutil.pid_exists(pid)]))
    folder_mark = f"/mcp-gw-test-{token}-"
    marked: list[psutil.Process] = []
    for process in psutil.process_iter():
        if process.pid in spared:
            continue
        if _environment(process).get(RUN_VARIABLE) == token or folder_mark in _working_folder(process):
            marked.append(process)
    found: list[Leftover] = []
    for pid, process in sorted(_with_descendants([*marked, *me.children(recursive=True)]).items()):
        if pid in spared:
            continue
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(process.cmdline()) or process.name()
        except psutil.NoSuchProcess:
            continue
        except (psutil.AccessDenied, psutil.ZombieProcess):
            command = "?"
        started_by = _environment(process).get("PYTEST_CURRENT_TEST", "an unknown test or fixture")
        found.append(Leftover(pid, command, started_by))
    return found


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: a run of its own, even when started by a test
        os.environ[RUN_VARIABLE] = secrets.token_hex(6)


@pytest.hookimpl(trylast=True)  # after pytest-xdist has stopped its workers
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or not run_token():
        return
    deadline = time.monotonic() + scaled(GRACE_S)
    found = leftovers(run_token())
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = leftovers(run_token())
    if not found:
        return
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    lines = [
        f"{len(found)} process(es) the suite started are still running at its end:",
        *(f"  {leftover}" for leftover in found),
        "Stop them (kill PID), and make the test or fixture that started each stop it, even when it fails.",
    ]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print("\n".join(lines), file=sys.stderr)
        return
    reporter.stats.setdefault(REPORT_KEY, []).extend(found)
    reporter.write_sep("=", "processes left running", red=True)
    for line in lines:
        reporter.write_line(line)
