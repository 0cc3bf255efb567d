"""The rootless mode (decision 57): a run in a user namespace of its own, as an ordinary user's gateway makes it.

Runs here are real: an ordinary uid (setpriv) starts the runner (tests/sandbox/rootless_child.py)
or a child through the user-namespace steps, and the tests read what the kernel then says.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends import landlock
from sandbox.backends.userns import UserNamespace, probe_entry
from sandbox.limits import SUPERVISOR_PROCESSES
from tests.harness import REPO, enterable_by_everyone
from tests.sandbox.confined_child import requires_root

USER_UID = 64072
"""An ordinary uid with no account (CI machines are fresh): not root, not a pool uid."""

pytestmark = requires_root  # the tests become the ordinary uid with setpriv


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mcp-userns-") as name:
        path = Path(name)
        for sub in ("ws", "scratch"):
            (path / sub).mkdir()
        for each in (path, path / "ws", path / "scratch"):
            os.chown(each, USER_UID, USER_UID)
        enterable_by_everyone(path)
        yield path


def as_user(argv: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    command = ["setpriv", f"--reuid={USER_UID}", f"--regid={USER_UID}", "--clear-groups", "--", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd="/")


def rootless_run(folder: Path, code: str, processes: int = 16) -> dict[str, Any]:
    child = str(REPO / "tests" / "sandbox" / "rootless_child.py")
    done = as_user([sys.executable, child, code, str(folder / "ws"), str(folder / "scratch"), str(processes)])
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    return outcome


@contextlib.contextmanager
def sleepers(count: int) -> Iterator[list[int]]:
    """`count` processes of the ordinary uid outside any run, killed at the end (only these pids)."""
    started = [
        subprocess.Popen(["setpriv", f"--reuid={USER_UID}", f"--regid={USER_UID}", "--clear-groups", "sleep", "60"])
        for _ in range(count)
    ]
    try:
        yield [p.pid for p in started]
    finally:
        for process in started:
            process.send_signal(signal.SIGKILL)
            process.wait()


def test_a_rootless_run_is_the_users_uid_in_its_own_namespaces_with_its_scratch_kept(folder: Path) -> None:
    code = (
        "import os, socket\n"
        "open(os.environ['TMPDIR'] + '/kept.txt', 'w').write('made in the tmpfs')\n"
        "try:\n    socket.socket(); net = 'socket'\nexcept OSError as e:\n    net = e.errno\n"
        "print(os.getuid(), os.getpid(), net, os.uname().nodename)\n"
    )
    outcome = rootless_run(folder, code)
    assert outcome["rootless"] is True
    assert outcome["exit_code"] == 0, outcome["stderr"]
    uid, pid, network, _ = outcome["stdout"].split()
    assert int(uid) == USER_UID, "the run's uid inside is the user's own, not root"
    assert int(pid) <= 3, "the run is in a PID namespace of its own"
    assert network == "1", "socket() is refused (EPERM)"
    layers = outcome["layers"]
    assert {"user_namespace", "network_namespace", "scratch_tmpfs", "pid_namespace", "landlock", "seccomp"} <= set(
        layers
    )
    assert "uid_drop" not in layers and "cgroup" not in layers
    assert outcome["collected"] == ["kept.txt"], "the gateway read the run's tmpfs through the fd the child sent"
    assert (folder / "ws" / "kept.txt").read_text() == "made in the tmpfs"
    assert os.listdir(folder / "scratch") == [], "the tmpfs lived in the run's mount namespace only"


def test_the_process_limit_counts_the_runs_processes_not_the_users_others(folder: Path) -> None:
    # As many processes of the same uid outside the run as its whole limit (12 and its two supervisors): were they
    # counted, its first fork would be refused (made 0). The run still forks, and stops at its limit.
    code = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(40):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(5); os._exit(0)\n"
        "    made += 1\n"
        "print(made)\n"
    )
    with sleepers(12 + SUPERVISOR_PROCESSES["native"]):
        outcome = rootless_run(folder, code, processes=12)
    made = int(outcome["stdout"])
    # 12 for the suite plus the two supervisors: the command itself and 11 children at most.
    assert 5 <= made <= 12, outcome
    assert outcome["exit_code"] == 0


def test_a_daemon_of_a_rootless_run_does_not_outlive_it(folder: Path) -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        open(os.environ['TMPDIR'] + '/alive', 'w').write(str(os.getpid())); time.sleep(60)\n"
        "    os._exit(0)\n"
        "for _ in range(3000):  # the daemon is up (its file made) before the command ends: 30 s at most\n"
        "    if os.path.exists(os.environ['TMPDIR'] + '/alive'):\n        break\n"
        "    time.sleep(0.01)\n"
    )
    marker = f"mcp-userns-daemon-{os.getpid()}"
    outcome = rootless_run(folder, f"# {marker}\n" + code)
    assert outcome["exit_code"] == 0
    alive = subprocess.run(
        ["pgrep", "-u", str(USER_UID), "-f", "sleep|python"], check=False, capture_output=True, text=True
    )
    assert alive.stdout.strip() == "", "no process of the run's uid is left once the call returned"


def test_inside_its_namespace_the_run_maps_only_its_uid_and_holds_no_capability() -> None:
    enter, namespace = probe_entry(USER_UID, USER_UID), UserNamespace(USER_UID, USER_UID, network=False)

    def step() -> None:
        enter()
        namespace.seal()

    done = subprocess.run(
        [
            "/bin/sh",
            "-c",
            "cat /proc/self/uid_map /proc/self/gid_map; grep -E '^(Cap(Prm|Eff|Amb)|NoNewPrivs):' /proc/self/status",
        ],
        preexec_fn=step,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    lines = [" ".join(line.split()) for line in done.stdout.splitlines()]
    assert lines[:2] == [f"{USER_UID} {USER_UID} 1"] * 2, "one uid, one gid: its own; root is not mapped"
    status = dict(line.split(" ", 1) for line in lines[2:])
    assert status == {
        "CapPrm:": "0000000000000000",
        "CapEff:": "0000000000000000",
        "CapAmb:": "0000000000000000",
        "NoNewPrivs:": "1",
    }


def test_a_late_landlock_rule_left_unset_fails_closed(tmp_path: Path) -> None:
    prepared = landlock.prepare_landlock(
        landlock.LandlockRules(read_only=(Path("/usr"),), read_write=(), late_read_write=True)
    )
    marker = tmp_path / "ran"
    with prepared, pytest.raises(subprocess.SubprocessError):
        subprocess.run(["/usr/bin/touch", str(marker)], preexec_fn=prepared.apply, check=False, timeout=30)
    assert not marker.exists()
