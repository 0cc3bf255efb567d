"""The suite's own plumbing, each through pytest run on a tiny file with the project's conftest: its last
check (tests/leftover_processes.py) fails a run whose test leaves a process running and names it, and
passes one that leaves nothing; TEST_TIME_SCALE (tests/deadlines.py) multiplies each test's timeout;
`--cpu-costs=N` (tests/cpu_costs.py) lists the costliest tests and fixtures; `--forks N` (tests/forked_workers.py)
runs the tests in workers forked after one collection, with the same results as one process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.deadlines import scaled
from tests.harness import REPO

LEAKY = """
import subprocess, sys

def test_that_forgets_its_child():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])

def test_that_waits_for_its_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""
CLEAN = """
import subprocess, sys

def test_that_waits_for_its_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""
ONE_PROCESS = ["-p", "no:xdist"]
FORKS = ["-p", "no:xdist", "--forks", "2"]
SPREAD = [
    pytest.param(ONE_PROCESS, id="one-process"),
    pytest.param(["-n", "2"], id="xdist"),
    pytest.param(FORKS, id="forks"),
]


def run_pytest(folder: Path, spread: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """pytest on `folder` with the project's conftest (and so its plugins), no PostgreSQL cluster of its own."""
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
    argv += ["--rootdir", str(folder), "-p", "no:cacheprovider", "-q", *spread, str(folder)]
    env = os.environ | {"MCP_GATEWAY_TEST_PG": "off"} | env
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=scaled(120), check=False)


@pytest.mark.parametrize("spread", SPREAD)
def test_a_process_a_test_leaves_running_fails_the_run_and_is_named(tmp_path: Path, spread: list[str]) -> None:
    marker = f"leftover-{secrets.token_hex(8)}"
    (tmp_path / "test_leaky.py").write_text(LEAKY.format(marker=marker))
    try:
        done = run_pytest(tmp_path, spread)
        assert done.returncode == 1, done.stdout + done.stderr
        named = re.search(
            r"pid (\d+) \(started in test_leaky\.py::test_that_forgets_its_child \(call\)\): (.*)", done.stdout
        )
        assert named is not None, done.stdout
        assert marker in named.group(2)
        assert "2 passed, 1 left running" in done.stdout
        assert "1 process(es) the suite started are still running" in done.stdout
        assert [marker in p.cmdline() for p in _carrying(marker)] == [True]
        assert _carrying(marker)[0].pid == int(named.group(1))
    finally:  # the check names it and kills nothing: this test kills what its run left
        for process in _carrying(marker):
            process.kill()
        psutil.wait_procs(_carrying(marker), timeout=scaled(30))
    assert _carrying(marker) == []


def _carrying(marker: str) -> list[psutil.Process]:
    """The live processes whose command line carries `marker`."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if marker in process.cmdline() and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


@pytest.mark.parametrize("spread", SPREAD)
def test_a_run_that_waits_for_what_it_starts_passes(tmp_path: Path, spread: list[str]) -> None:
    (tmp_path / "test_clean.py").write_text(CLEAN)
    done = run_pytest(tmp_path, spread)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running" not in done.stdout


SLOW = """
import time

import pytest

@pytest.mark.timeout(1)
def test_that_takes_two_seconds():
    time.sleep(2)
"""


@pytest.mark.parametrize(("scale", "outcome"), [("1", "1 failed"), ("4", "1 passed")])
def test_time_scale_multiplies_each_tests_timeout(tmp_path: Path, scale: str, outcome: str) -> None:
    (tmp_path / "test_slow.py").write_text(SLOW)
    done = run_pytest(tmp_path, ["-p", "no:xdist"], TEST_TIME_SCALE=scale)
    assert outcome in done.stdout, done.stdout + done.stderr


def test_a_time_scale_that_is_no_positive_factor_is_a_usage_error(tmp_path: Path) -> None:
    """One run: every value the parser refuses is tests/gateway/test_deadlines.py (in process)."""
    (tmp_path / "test_slow.py").write_text(SLOW)
    done = run_pytest(tmp_path, ["-p", "no:xdist"], TEST_TIME_SCALE="abc")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "TEST_TIME_SCALE='abc': give a positive factor" in done.stderr
    assert "INTERNALERROR" not in done.stdout + done.stderr


COSTLY = """
import subprocess, sys

import pytest

@pytest.fixture
def warm():
    return sum(i * i for i in range(300_000))

def test_that_spins(warm):
    sum(i * i for i in range(3_000_000))

def test_that_waits_for_a_busy_child(warm):
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_that_does_nothing():
    pass
"""


@pytest.mark.parametrize("spread", SPREAD)
def test_cpu_costs_lists_the_costliest_tests_a_waited_for_childs_cpu_included_and_fixtures(
    tmp_path: Path, spread: list[str]
) -> None:
    (tmp_path / "test_costly.py").write_text(COSTLY)
    done = run_pytest(tmp_path, [*spread, "--cpu-costs=2"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    tests = lines[lines.index("-- the 2 costliest tests (CPU s, wall s)") + 1 :][:2]
    assert {line.split()[-1] for line in tests} == {
        "test_costly.py::test_that_spins",
        "test_costly.py::test_that_waits_for_a_busy_child",  # its CPU is the child's: RUSAGE_CHILDREN
    }, done.stdout
    assert all(float(line.split()[0]) > 0.05 for line in tests), done.stdout
    fixtures = lines[lines.index("-- the 2 costliest fixtures (CPU s of their own set-ups, set-ups, ms each)") + 1]
    _, setups, _, name = fixtures.split()
    assert (setups, name) == ("2", "warm"), done.stdout
    assert ("workers:" in done.stdout) == (spread != ONE_PROCESS), done.stdout
    assert "3 passed" in done.stdout


STALE_ORDER = """
import tests.conftest

tests.conftest.SLOW_FIRST = (*tests.conftest.SLOW_FIRST, "tests/gateway/test_renamed_away.py")
"""


def test_the_slowest_modules_go_first_each_whole_and_a_stale_name_stops_the_run(tmp_path: Path) -> None:
    """tests/conftest.py, `SLOW_FIRST` (decision 103): the listed modules before every other, in the list's order."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    argv += ["tests/gateway/test_canonical.py", "tests/sandbox/test_pidns.py", "tests/gateway/test_visible.py"]
    env = os.environ | {"MCP_GATEWAY_TEST_PG": "off"}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=scaled(120), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    modules = [line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line]
    order = [module for index, module in enumerate(modules) if index == 0 or modules[index - 1] != module]
    assert order == ["tests/gateway/test_visible.py", "tests/sandbox/test_pidns.py", "tests/gateway/test_canonical.py"]

    (tmp_path / "conftest.py").write_text(STALE_ORDER)
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = run_pytest(tmp_path, ["-p", "no:xdist"])
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "SLOW_FIRST: tests/gateway/test_renamed_away.py is no file; rename or remove it" in done.stderr
    assert "INTERNALERROR" not in done.stdout + done.stderr


# -- `--forks N` (tests/forked_workers.py) -------------------------------------------------------------------

LOGGED = """
import json, os, time

import pytest

def log(event):
    with open({log!r}, "a") as out:
        out.write(json.dumps([os.getpid(), event]) + "\\n")

@pytest.fixture(scope="module")
def module_fixture(request):
    log("setup " + request.module.__name__)
    yield
    log("teardown " + request.module.__name__)
"""
GROUPED = """
import time

from helpers import log

def test_{n}(module_fixture):
    time.sleep(0.02)
    log("test {module}::test_{n}")
"""


def _logged(folder: Path) -> None:
    """A suite in `folder`: a serial group (tests/rootless/, tests/conftest.py's SERIAL_GROUPS) of 6 tests in
    3 modules, and 3 modules of single tests, each logging its pid and its module fixture's set-up and tear-down."""
    log = folder / "events.log"
    (folder / "helpers.py").write_text(LOGGED.format(log=str(log)))
    (folder / "conftest.py").write_text("from helpers import module_fixture  # noqa: F401\n")
    for directory, modules in (
        ("tests/rootless", ("test_g1", "test_g2", "test_g3")),
        ("alone", ("test_a", "test_b", "test_c")),
    ):
        (folder / directory).mkdir(parents=True)
        for module in modules:
            tests = "".join(GROUPED.format(n=n, module=module) for n in range(2 if directory != "alone" else 4))
            (folder / directory / f"{module}.py").write_text(tests)


def _events(folder: Path) -> list[tuple[int, str]]:
    return [(pid, event) for pid, event in map(json.loads, (folder / "events.log").read_text().splitlines())]


def test_forked_workers_keep_a_serial_group_whole_and_in_order_and_tear_each_module_down_before_the_next(
    tmp_path: Path,
) -> None:
    _logged(tmp_path)
    done = run_pytest(tmp_path, [*FORKS[:-1], "3"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "18 passed" in done.stdout, done.stdout
    events = _events(tmp_path)
    group = [(pid, event) for pid, event in events if event.startswith("test test_g")]
    assert len({pid for pid, _ in group}) == 1, events  # one worker ran the whole group
    assert [event for _, event in group] == [f"test test_g{m}::test_{n}" for m in (1, 2, 3) for n in (0, 1)]
    assert len({pid for pid, _ in events}) >= 2, events  # the other units went to other workers meanwhile
    for pid in {pid for pid, _ in events}:  # in each worker: a test runs inside its own module's fixture only
        open_module = None
        for _, event in [entry for entry in events if entry[0] == pid]:
            kind, _, where = event.partition(" ")
            if kind == "setup":
                assert open_module is None, events
                open_module = where
            elif kind == "teardown":
                assert open_module == where, events
                open_module = None
            else:
                assert where.split("::")[0] == open_module, events
        assert open_module is None, events


OUTCOMES = """
import warnings

import pytest

@pytest.fixture
def broken():
    raise RuntimeError("the fixture breaks")

def test_passes():
    pass

def test_fails():
    assert 1 + 1 == 3

def test_skips():
    pytest.skip("not here")

@pytest.mark.xfail(reason="known")
def test_xfails():
    raise ValueError

def test_errors(broken):
    pass

@pytest.mark.filterwarnings("default")
def test_warns():
    warnings.warn("a warning of the worker's", UserWarning)

@pytest.mark.parametrize("n", range(6))
def test_many(n):
    assert n != 4
"""


def test_forked_workers_report_what_one_process_reports(tmp_path: Path) -> None:
    """Every outcome (passed, failed, skipped, xfailed, an error in set-up, a warning) is logged by the parent
    through pytest's own hooks: the same summary, short summary (-rA) and exit status as one process."""
    (tmp_path / "test_outcomes.py").write_text(OUTCOMES)
    results = {}
    for name, spread in (("one", ONE_PROCESS), ("forks", FORKS)):
        done = run_pytest(tmp_path, [*spread, "-rA"])
        summary = done.stdout.splitlines()[-1]
        short = sorted(
            line for line in done.stdout.splitlines() if re.match(r"(PASSED|FAILED|SKIPPED|XFAIL|ERROR) ", line)
        )
        results[name] = (done.returncode, re.sub(r" in [\d.]+s.*", "", summary), short)
        assert "assert (1 + 1) == 3" in done.stdout, done.stdout
        assert "RuntimeError: the fixture breaks" in done.stdout, done.stdout
        assert "a warning of the worker's" in done.stdout, done.stdout
    assert results["forks"] == results["one"]
    assert results["one"][0] == pytest.ExitCode.TESTS_FAILED
    assert "2 failed, 7 passed, 1 skipped, 1 xfailed, 1 warning, 1 error" in results["one"][1], results


CRASHING = """
import os, signal, time

import pytest

def test_before():
    pass

def test_killed():
    os.kill(os.getpid(), signal.SIGKILL)

def test_exits():
    os._exit(3)

def test_killed_while_a_child_holds_its_socket():
    if os.fork() == 0:
        time.sleep(2)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.timeout(1, method="thread")
def test_hangs_past_its_timeout():
    time.sleep(60)

def test_after():
    pass
"""


def test_a_worker_that_dies_fails_its_test_naming_how_and_its_units_rest_runs_on_a_new_fork(tmp_path: Path) -> None:
    """A serial group (tests/rootless/) in which four tests end their worker: a signal (once with a child of the
    test's still holding the worker's socket open), os._exit, pytest-timeout's hard kill. Each fails, named with
    how its worker ended; the group's other tests still run, on new forks."""
    (tmp_path / "tests" / "rootless").mkdir(parents=True)
    (tmp_path / "tests" / "rootless" / "test_crashing.py").write_text(CRASHING)
    (tmp_path / "test_other.py").write_text("def test_elsewhere():\n    pass\n")
    done = run_pytest(tmp_path, [*FORKS, "-rA"])
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    output = done.stdout
    assert "4 failed, 3 passed" in output.splitlines()[-1], output
    for name, how in (
        ("test_killed", "was killed by SIGKILL"),
        ("test_exits", "exited with status 3"),
        ("test_killed_while_a_child_holds_its_socket", "was killed by SIGKILL"),
        ("test_hangs_past_its_timeout", "exited with status 1"),  # pytest-timeout's os._exit(1)
    ):
        assert re.search(rf"_ {name} _+\nforked worker \d+ \(pid \d+\) {how} while running this test\n", output), output
        assert re.search(rf"FAILED \S*tests/rootless/test_crashing.py::{name}( - .*)?\n", output), (
            output
        )  # as wide as COLUMNS
    assert "Timeout" in output, output  # pytest-timeout's stack dump, from the worker it ends
    for name in ("test_before", "test_after"):
        assert re.search(rf"PASSED \S*tests/rootless/test_crashing.py::{name}\n", output), output
    assert re.search(r"PASSED \S*test_other.py::test_elsewhere\n", output), output
    assert "INTERNALERROR" not in output + done.stderr


FAILING_EARLY = """
import time

import pytest

def test_fails_at_once():
    assert False

@pytest.mark.parametrize("n", range(40))
def test_slow(n):
    time.sleep(0.1)
"""


def test_a_failure_under_x_stops_the_forked_run(tmp_path: Path) -> None:
    (tmp_path / "test_early.py").write_text(FAILING_EARLY)
    done = run_pytest(tmp_path, [*FORKS, "-x"])
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    summary = done.stdout.splitlines()[-1]
    assert "stopping after 1 failures" in done.stdout, done.stdout
    # The tests running then end; no new one starts. On a busy machine the other worker may not have begun
    # one yet when the failure arrives: then none passed.
    passed = re.search(r"1 failed(?:, (\d+) passed)? in ", summary)
    assert passed is not None, done.stdout
    assert int(passed.group(1) or 0) < 10, done.stdout


def test_forks_beside_xdist_below_zero_or_with_pdb_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_clean.py").write_text(CLEAN)
    for spread, why in (
        (["-n", "2", "--forks", "2"], "--forks and pytest-xdist's -n/--dist spread the same tests: give one of them"),
        ([*ONE_PROCESS, "--forks", "-1"], "--forks=-1: give a number of workers, or 0 for none"),
        ([*FORKS, "--pdb"], "--pdb needs the terminal in the test's own process: run it with --forks=0"),
    ):
        done = run_pytest(tmp_path, spread)
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
        assert why in done.stderr, done.stderr


THREAD_AT_COLLECTION = """
import threading

stop = threading.Event()
threading.Thread(target=stop.wait, args=(30,), name="collection-thread", daemon=True).start()
"""
SOCKET_AT_COLLECTION = """
import socket

kept = socket.socketpair()
"""


TEMPLATE_AT_COLLECTION = """
from tests.sqlite_template import template_file

template_file()
"""


@pytest.mark.parametrize(
    ("conftest", "why"),
    [
        (THREAD_AT_COLLECTION, "threads ['collection-thread'] run in the pytest process before the fork"),
        (SOCKET_AT_COLLECTION, "sockets are open in the pytest process before the fork"),
        (TEMPLATE_AT_COLLECTION, "made a SQLite template (tests/sqlite_template.py) before the fork"),
    ],
    ids=["thread", "socket", "template"],
)
def test_no_fork_while_a_thread_runs_a_socket_is_open_or_a_template_is_made(
    tmp_path: Path, conftest: str, why: str
) -> None:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_clean.py").write_text(CLEAN)
    done = run_pytest(tmp_path, FORKS)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert why in done.stderr, done.stderr
    assert "passed" not in done.stdout, done.stdout


INTERRUPTIBLE = """
import os, subprocess, sys, time

import pytest

@pytest.fixture
def child():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
    yield
    process.kill()
    process.wait()

@pytest.mark.parametrize("n", range(4))
def test_waits(child, n):
    open(os.path.join({folder!r}, f"started-{{n}}"), "w").close()
    time.sleep(60)
"""


WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == 'ignored' else signal.SIG_DFL);"
    " os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)
"""Starts a command with SIGINT at its default or ignored, as a background job of a shell without job control
(`cmd &` in a script, a CI step) starts it, whatever this test's own process has."""


@pytest.mark.parametrize(
    ("signum", "sigint"),
    [(signal.SIGINT, "default"), (signal.SIGTERM, "default"), (signal.SIGTERM, "ignored")],
    ids=["ctrl-c", "sigterm", "sigterm-in-a-background-job"],
)
def test_an_interrupted_forked_run_tears_its_workers_fixtures_down_and_leaves_nothing(
    tmp_path: Path, signum: signal.Signals, sigint: str
) -> None:
    marker = f"interrupted-{secrets.token_hex(8)}"
    (tmp_path / "test_waits.py").write_text(INTERRUPTIBLE.format(marker=marker, folder=str(tmp_path)))
    argv = [sys.executable, "-c", WITH_SIGINT, sigint, "-m", "pytest", "-p", "tests.conftest"]
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning", "--rootdir", str(tmp_path), "-p", "no:cacheprovider"]
    argv += ["-q", *FORKS, str(tmp_path)]
    env = os.environ | {"MCP_GATEWAY_TEST_PG": "off"}
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        try:
            deadline = time.monotonic() + scaled(60)
            while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(list(tmp_path.glob("started-*"))) == 2
            run.send_signal(signum)  # to the parent alone, as `kill` does
            output, _ = run.communicate(timeout=scaled(60))
        finally:
            if run.poll() is None:
                run.kill()
            for process in _carrying(marker):  # before reading to the end: a child left holds the output open
                process.kill()
            if run.stdout is not None and not run.stdout.closed:
                run.communicate()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "KeyboardInterrupt" in output, output
    assert "left running" not in output, output
    assert _carrying(marker) == []  # every worker's fixture killed its child as it tore down
