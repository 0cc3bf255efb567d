"""Run INSIDE the guest by test_guest_host.py, as root and as a uid with a delegated cgroup (no `test_` prefix: not collected on the host).

Each test checks what its user can do with the cgroup it was started in: the guest's agent
(tests/guest_agent.py) put this pytest in `<D>` = /sys/fs/cgroup/guest/cmd-<n>, with memory
and pids enabled above it, and owned by the uid when the run is delegated (systemd-style).
The session first moves pytest into `<D>/pytest` (cgroup v2 lets a cgroup hold processes or
enable controllers for its children, not both), then enables memory and pids for `<D>`'s
children, as `systemd-run --user --scope` users do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

CGROUP_ROOT = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module")
def delegated() -> Path:
    """`<D>`, this process moved to `<D>/pytest`, and memory and pids enabled for `<D>`'s children."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("0::"), lines
    own = CGROUP_ROOT / lines[0].removeprefix("0::").lstrip("/")
    if own.name == "pytest":  # already moved (a second module in the same run)
        return own.parent
    assert own.stat().st_uid == os.getuid(), f"{own} is not delegated to uid {os.getuid()}"
    (own / "pytest").mkdir()
    (own / "pytest" / "cgroup.procs").write_text(str(os.getpid()))
    (own / "cgroup.subtree_control").write_text("+memory +pids")
    return own


@pytest.fixture
def run_cgroup(delegated: Path) -> Iterator[Path]:
    """A fresh child of `<D>`, removed after the test (after killing what is left in it)."""
    cgroup = delegated / f"run-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    yield cgroup
    (cgroup / "cgroup.kill").write_text("1")
    _wait_until_empty(cgroup)
    cgroup.rmdir()


def _wait_until_empty(cgroup: Path, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if "populated 0" in (cgroup / "cgroup.events").read_text():
            return True
        time.sleep(0.02)
    return False


def _spawn_into(cgroup: Path, code: str) -> subprocess.Popen[str]:
    """A Python child that moves itself into `cgroup` and then runs `code`."""
    enter = f"open({str(cgroup / 'cgroup.procs')!r}, 'w').write('0')\n"
    return subprocess.Popen([sys.executable, "-c", enter + code], stdout=subprocess.PIPE, text=True)


def test_delegated_user_sets_memory_and_pids_limits_on_its_child_cgroup(run_cgroup: Path) -> None:
    (run_cgroup / "memory.max").write_text(str(64 << 20))
    (run_cgroup / "memory.swap.max").write_text("0")
    (run_cgroup / "pids.max").write_text("8")
    assert (run_cgroup / "memory.max").read_text().strip() == str(64 << 20)
    assert (run_cgroup / "pids.max").read_text().strip() == "8"


def test_pids_max_refuses_the_fork_past_the_limit(run_cgroup: Path) -> None:
    (run_cgroup / "pids.max").write_text("4")
    code = """
import os, time
children = []
try:
    for _ in range(20):  # bounded even if the limit fails
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
except BlockingIOError:
    print("refused after", len(children), flush=True)
else:
    print("forked", len(children), flush=True)
for pid in children:
    os.kill(pid, 9)
"""
    child = _spawn_into(run_cgroup, code)
    out, _ = child.communicate(timeout=60)
    assert out.strip() == "refused after 3", out
    assert "max 1" in (run_cgroup / "pids.events").read_text()


def test_memory_max_kills_the_hog_and_memory_events_count_it(run_cgroup: Path) -> None:
    (run_cgroup / "memory.max").write_text(str(48 << 20))
    (run_cgroup / "memory.swap.max").write_text("0")
    code = "blocks = [b\"\\x01\" * (16 << 20) for _ in range(16)]\nprint('survived', flush=True)\n"  # 256 MiB at most
    child = _spawn_into(run_cgroup, code)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == -9, (child.returncode, out)
    events = dict(line.split() for line in (run_cgroup / "memory.events").read_text().splitlines())
    assert int(events["oom_kill"]) >= 1, events


def test_cgroup_kill_ends_every_process_in_the_child_cgroup(run_cgroup: Path) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\nprint(os.getpid(), flush=True)\ntime.sleep(300)\n"
    with _spawn_into(run_cgroup, code) as child:
        assert child.stdout is not None
        child.stdout.readline()
        procs = (run_cgroup / "cgroup.procs").read_text().split()
        assert len(procs) == 2, procs
        (run_cgroup / "cgroup.kill").write_text("1")
        assert child.wait(timeout=10) == -9
    assert _wait_until_empty(run_cgroup), (run_cgroup / "cgroup.procs").read_text()
