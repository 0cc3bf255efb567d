"""The uid sweep: a double-forked, setsid grandchild survives killpg and dies in `sweep(uid)`, nothing else does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sandbox.backends.containment import owned_by, sweep
from sandbox.backends.identity import RunIdentity
from tests.sandbox.confined_child import (
    CHILD_TIMEOUT_S,
    PYTHON,
    confine,
    leased_identity,
    requires_root,
    resource_limits,
    run_python,
    shared_dir,
)

DAEMONIZE = """
import os, sys, time
pid_file = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pid_file + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        time.sleep(30)
    os._exit(0)
os.wait()
deadline = time.monotonic() + 10
while not os.path.exists(pid_file) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, within_s: float = 5) -> bool:
    deadline = time.monotonic() + within_s
    while not is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def who() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


@pytest.fixture
def bystander() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


@pytest.mark.parametrize("uid", [0, 1, 999])
def test_sweep_refuses_system_uids(uid: int) -> None:
    with pytest.raises(ValueError, match="system uid"):
        sweep(uid)


def test_sweep_of_an_unused_uid_kills_nothing() -> None:
    assert sweep(62199) == []


@requires_root
def test_sweep_kills_the_daemonized_grandchild_that_killpg_misses(who: RunIdentity, bystander: RunIdentity) -> None:
    with shared_dir() as folder:
        os.chown(folder, who.uid, who.gid)
        pid_file = folder / "grandchild.pid"
        child = subprocess.Popen(
            [PYTHON, "-I", "-c", DAEMONIZE, str(pid_file)],
            preexec_fn=confine(who, resource_limits()),  # noqa: PLW1509 -- the layers only exist as preexec steps; pytest is single-threaded
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert child.wait(timeout=CHILD_TIMEOUT_S) == 0
        grandchild = int(Path(pid_file).read_text())

    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # what the runner does today: the group is already empty
    assert not wait_gone(grandchild, within_s=0.3), "killpg was meant to miss the grandchild"
    assert psutil.Process(grandchild).uids().real == who.uid

    decoy = subprocess.Popen(
        [PYTHON, "-I", "-c", "import time; time.sleep(30)"],
        preexec_fn=confine(bystander, resource_limits()),  # noqa: PLW1509 -- same chain, another run's uid
        cwd="/",
        env={},
        stdin=subprocess.DEVNULL,
    )
    try:
        killed = sweep(who.uid)
        assert killed == [grandchild]
        assert wait_gone(grandchild)
        assert owned_by(who.uid) == []
        assert decoy.poll() is None, "another run's process was touched"
    finally:
        decoy.kill()
        decoy.wait(timeout=CHILD_TIMEOUT_S)


@requires_root
def test_sweep_kills_every_process_of_the_uid(who: RunIdentity) -> None:
    code = """
import os, time
for _ in range(10):
    if os.fork() == 0:
        os.closerange(0, 3)  # let the parent's pipes close so the test sees the child exit
        time.sleep(30)
        os._exit(0)
"""
    result = run_python(code, confine(who, resource_limits()))
    assert result.returncode == 0, result.stderr
    assert len(owned_by(who.uid)) == 10
    assert len(sweep(who.uid)) == 10
    assert owned_by(who.uid) == []
