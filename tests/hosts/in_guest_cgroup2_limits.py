"""What only a cgroup-v2-only host can show: memory, swap and process totals, OOM and fork counts, the kernel's whole-run kill.

No `test_` prefix: the host's run does not collect it; tests/hosts/test_guest_sandbox.py runs it in
the guest booted with a cgroup-v2-only hierarchy (tests/guest.py), once as root, once as an ordinary
user whose group is delegated to it (with MCP_GATEWAY_TEST_DELEGATED=1). This test process plays the
gateway: discovery moves it into its leaf, as it moves the gateway. Every hostile child is
bounded on its own (a few hundred MiB, a few hundred processes), should the limits not hold.

The swap test needs a swap device: as root it turns on a zram one for itself (and off after);
as a delegated user it needs one already on (`ZRAM_SWAP`, run as root before).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends.cgroup2 import RunCgroup2, V2Root, discover_v2
from sandbox.backends.namespaces import unshare

MIB = 1 << 20
DELEGATED = os.environ.get("MCP_GATEWAY_TEST_DELEGATED") == "1"
NEEDED = frozenset({"memory", "swap", "pids", "kill", "freeze", "nsdelegate"})
ZRAM_SWAP = 'modprobe zram && dev=$(zramctl --find --size 256M) && mkswap "$dev" && swapon "$dev"'

# Touches up to 256 MiB in 8 MiB blocks, printing MiB held after each: the limit must stop it.
HOG = """
import sys
blocks = []
for _ in range(32):
    blocks.append(bytearray(8 << 20))  # zero-filled: every page is written, so every page is charged
    print(len(blocks) * 8, flush=True)
"""

# Three processes of 40 MiB each: under 64 MiB alone, not together. Prints how many still hold.
HOLDERS = """
import os, time
children = []
for _ in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.closerange(0, r)
        os.close(r)
        block = bytearray(40 << 20)
        os.write(w, b"1")
        time.sleep(3)
        os._exit(0)
    os.close(w)
    children.append((pid, r))
holding = [pid for pid, r in children if os.read(r, 1) == b"1"]
time.sleep(0.5)
print(sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in holding))
"""

# Holds 40 MiB, then exits: under the limit, for the peak.
PEAK = """
block = bytearray(40 << 20)
print(len(block) >> 20)
"""

# Up to 50 sleepers; prints how many forks succeeded.
FORKS = """
import os, time
made = 0
for _ in range(50):
    try:
        if os.fork() == 0:
            os.closerange(0, 3)
            time.sleep(30)
            os._exit(0)
        made += 1
    except OSError:
        break
print(made)
"""

# A fork bomb bounded by its shape: 4 levels of 4 children, 341 processes at most, each sleeping.
# Says when its interpreter is up: under an emulated CPU on a busy host that alone can take seconds.
BOMB = """
import os, time
print("started", flush=True)
for depth in range(4):
    forked = 0
    for _ in range(4):
        try:
            if os.fork() == 0:
                forked = -1
                break
            forked += 1
        except OSError:
            pass
    if forked != -1:
        break
os.closerange(0, 3)
time.sleep(30)
"""

# A double fork + setsid: the grandchild leaves the session and the tree; prints its pid.
DAEMONIZE = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        os.write(w, str(os.getpid()).encode())
        time.sleep(60)
    os._exit(0)
os.close(w)
print(int(os.read(r, 16)))
"""


@pytest.fixture(scope="module")
def runs() -> V2Root:
    found = discover_v2()
    if found.root is None or not found.controls >= NEEDED:
        pytest.fail(f"this host cannot hold runs in cgroup v2: {found.reason}; fix: {found.fix}")
    return found.root


SPAWNED: list[subprocess.Popen[str]] = []
"""The children a test started, reaped when its group goes, whether the test passed or failed."""


@pytest.fixture
def group(runs: V2Root, request: pytest.FixtureRequest) -> Iterator[RunCgroup2]:
    made = RunCgroup2(runs, f"test-{request.node.name[:40]}", 64 * MIB, 16)
    try:
        yield made
    finally:
        made.kill_all()
        while SPAWNED:
            child = SPAWNED.pop()
            if child.poll() is None:
                child.kill()  # the test's own child, outside the group only if joining it failed
            child.communicate(timeout=60)
        made.close()


def spawn(group: RunCgroup2, code: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", code],
        preexec_fn=group.join,  # noqa: PLW1509  (pytest is single-threaded here)
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    SPAWNED.append(child)
    return child


def test_discovery_finds_every_control_and_says_nothing_is_missing(runs: V2Root) -> None:
    found = discover_v2()  # a second time: the gateway is in its leaf already, nothing moves
    assert found.root == runs
    assert (found.reason, found.fix) == ("", "")
    own = Path("/proc/self/cgroup").read_text().splitlines()[-1]
    assert own.endswith("/gateway"), own
    if DELEGATED:
        assert os.geteuid() != 0, "MCP_GATEWAY_TEST_DELEGATED=1 is for an ordinary user"
        assert runs.folder.stat().st_uid == os.geteuid()


def test_the_memory_limit_kills_the_hog_and_counts_the_oom_kill(group: RunCgroup2) -> None:
    child = spawn(group, HOG)
    out, err = child.communicate(timeout=60)
    usage = group.usage()
    assert child.returncode == -9, (out, err)
    assert int(out.split()[-1]) < 64, "the hog held more than the limit"
    assert usage.oom_kills >= 1
    assert 32 * MIB <= usage.peak_memory_bytes <= 64 * MIB


def test_the_memory_limit_holds_for_the_processes_together(group: RunCgroup2) -> None:
    child = spawn(group, HOLDERS)
    out, err = child.communicate(timeout=60)
    assert int(out) <= 1, (out, err)
    assert group.usage().oom_kills >= 1


def has_swap() -> bool:
    return len(Path("/proc/swaps").read_text().splitlines()) > 1


@pytest.fixture(scope="module")
def swap() -> Iterator[None]:
    """A swap device, without which swap could not extend anything: as root a zram one for these tests."""
    if has_swap():
        yield
        return
    if os.geteuid() != 0:
        pytest.fail(f"this host has no swap, so memory.swap.max shows nothing: as root, first `{ZRAM_SWAP}`")
    subprocess.run(["modprobe", "zram"], check=True)
    device = subprocess.run(
        ["zramctl", "--find", "--size", "256M"], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        subprocess.run(["mkswap", device], check=True, capture_output=True)
        subprocess.run(["swapon", device], check=True)
        yield
    finally:
        subprocess.run(["swapoff", device], check=False)
        subprocess.run(["zramctl", "--reset", device], check=False)


def test_swap_cannot_extend_the_limit(swap: None, group: RunCgroup2) -> None:
    assert has_swap()
    child = spawn(group, HOG)
    out, _ = child.communicate(timeout=60)
    swap_peak = group.path / "memory.swap.peak"
    used = swap_peak if swap_peak.exists() else group.path / "memory.swap.current"
    assert (child.returncode, int(used.read_text())) == (-9, 0), f"the hog held {out.split()[-1:]} MiB, swap included"
    assert (group.path / "memory.swap.max").read_text() == "0\n"


def test_the_peak_is_what_the_run_held(group: RunCgroup2) -> None:
    child = spawn(group, PEAK)
    out, err = child.communicate(timeout=60)
    assert (child.returncode, out.strip()) == (0, "40"), err
    usage = group.usage()
    assert 40 * MIB <= usage.peak_memory_bytes <= 64 * MIB
    assert usage.oom_kills == 0


def test_the_process_limit_refuses_forks_and_counts_them(group: RunCgroup2) -> None:
    child = spawn(group, FORKS)
    out, err = child.communicate(timeout=60)
    assert int(out) == 15, err  # the child itself is the sixteenth
    assert len(group.members()) == 15, "the child's sleepers outlive it, in the group"
    assert group.usage().forks_refused >= 1


def test_a_fork_bomb_stops_at_the_limit_and_dies_whole(group: RunCgroup2) -> None:
    child = spawn(group, BOMB)
    assert child.stdout is not None
    assert child.stdout.readline() == "started\n", "the bomb's interpreter did not start"
    deadline = time.monotonic() + 30  # from the bomb's start; the wait ends at the first fork refused
    while group.usage().forks_refused == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = group.members()
    assert group.usage().forks_refused >= 1
    assert 1 <= len(members) <= 16
    killed = group.kill_all()
    child.communicate(timeout=10)
    assert set(members) <= set(killed)
    assert group.members() == []


def test_the_kernel_kill_reaches_a_daemonized_grandchild(group: RunCgroup2) -> None:
    child = spawn(group, DAEMONIZE)
    daemon = int(child.communicate(timeout=60)[0])
    assert group.members() == [daemon]
    assert group.kill_all() == [daemon]
    assert not Path(f"/proc/{daemon}").exists() or "zombie" in Path(f"/proc/{daemon}/status").read_text()
    assert "populated 0" in (group.path / "cgroup.events").read_text()


# Tries, from inside the run, to lift its own memory limit and to move itself out of its group.
ESCAPE = """
import errno, os, sys
tried = []
for path, value in ((sys.argv[1] + "/memory.max", "max"), (sys.argv[2] + "/cgroup.procs", "0")):
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
            tried.append("done")
        finally:
            os.close(fd)
    except OSError as exc:
        tried.append(errno.errorcode[exc.errno])
print(" ".join(tried))
"""
CLONE_NEWUSER = 0x10000000


def test_in_its_cgroup_namespace_the_run_can_neither_lift_its_limit_nor_leave(group: RunCgroup2) -> None:
    """As the owner of every file in reach (a delegated user's run, or root): refused by the kernel, not by modes."""
    user = os.geteuid()

    def preexec() -> None:
        group.join()
        if user != 0:
            unshare(CLONE_NEWUSER)  # CAP_SYS_ADMIN for the cgroup namespace, in a namespace of its own
        group.enter_cgroup_namespace()

    outside = group.path.parent.parent / "gateway"  # where the gateway itself is: writable by this uid
    child = subprocess.run(
        [sys.executable, "-I", "-c", ESCAPE, str(group.path), str(outside)],
        preexec_fn=preexec,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.stdout.split() == ["EPERM", "ENOENT"], child.stderr
    assert (group.path / "memory.max").read_text() == f"{64 * MIB}\n"
