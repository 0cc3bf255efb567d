"""The suite's own plumbing, each through pytest run on a tiny file with the project's conftest: its last
check (tests/leftover_processes.py) fails a run whose test leaves a process running and names it, and
passes one that leaves nothing; TEST_TIME_SCALE (tests/deadlines.py) multiplies each test's timeout;
`--cpu-costs=N` (tests/cpu_costs.py) lists the costliest tests and fixtures."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
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
SPREAD = [pytest.param(["-p", "no:xdist"], id="one-process"), pytest.param(["-n", "2"], id="xdist")]


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
    assert ("workers:" in done.stdout) == ("-n" in spread), done.stdout
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
