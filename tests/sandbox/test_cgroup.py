"""The cgroup layer on its own: where the groups are, and real limits and kills on this host's cgroup v1."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends import cgroup, identity
from sandbox.backends.cgroup import CgroupRoots, RunCgroup, own_folders, parse_mountinfo, parse_self_cgroup
from sandbox.backends.identity import RunIdentity
from sandbox.backends.rlimits import MIB
from tests.sandbox.confined_child import DAEMONIZE, PYTHON, leased_identity, requires_root

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 /outer /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /mnt/memory-lookalike rw - tmpfs memory rw
"""
SELF = """\
9:name=systemd:/
8:pids:/outer/inner
6:freezer:/
4:memory:/process_api/abc
0::/
"""


def test_mountinfo_names_each_v1_controller_its_mount_and_root() -> None:
    assert parse_mountinfo(MOUNTINFO) == {
        "memory": (Path("/sys/fs/cgroup/memory"), "/"),
        "freezer": (Path("/sys/fs/cgroup/freezer"), "/"),
        "pids": (Path("/sys/fs/cgroup/pids"), "/outer"),
    }


def test_self_cgroup_gives_the_path_in_each_hierarchy() -> None:
    assert parse_self_cgroup(SELF) == {"pids": "/outer/inner", "freezer": "/", "memory": "/process_api/abc"}


def test_own_folders_join_mount_point_and_path_below_the_mount_root() -> None:
    roots = own_folders(MOUNTINFO, SELF)
    assert roots is not None
    assert dict(roots.folders) == {
        "memory": Path("/sys/fs/cgroup/memory/process_api/abc"),
        "pids": Path("/sys/fs/cgroup/pids/inner"),
        "freezer": Path("/sys/fs/cgroup/freezer"),
    }
    assert roots.group("pids", "run-61000") == Path("/sys/fs/cgroup/pids/inner/mcp-write-gateway/run-61000")


@pytest.mark.parametrize(
    ("mountinfo", "self_cgroup"),
    [
        (MOUNTINFO.replace("rw,freezer", "rw,cpu"), SELF),  # no freezer hierarchy (a cgroup v2 host)
        (MOUNTINFO, SELF.replace("6:freezer:/\n", "")),  # not in a freezer group
        (MOUNTINFO, SELF.replace("/outer/inner", "/elsewhere")),  # our group is outside what the mount shows
    ],
    ids=["no-freezer-mount", "no-freezer-line", "outside-the-mount"],
)
def test_own_folders_is_none_when_a_controller_is_missing(mountinfo: str, self_cgroup: str) -> None:
    assert own_folders(mountinfo, self_cgroup) is None


# --- against the real kernel ------------------------------------------------------------------

HOLDERS = """
import os, sys, time
children = []
for _ in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.closerange(0, r)  # not the caller's stdout: communicate() returns when the parent is done
        os.close(r)
        block = b"x" * (int(sys.argv[1]) << 20)  # every page written, so every page is charged
        os.write(w, b"1")
        time.sleep(3)
        os._exit(0)
    os.close(w)
    children.append((pid, r))
holding = [pid for pid, r in children if os.read(r, 1) == b"1"]
time.sleep(0.5)  # one moment for all: a holder the OOM killer took since it reported is gone by now
print(sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in holding))
"""

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


@pytest.fixture
def roots() -> CgroupRoots:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    found = cgroup.discover()
    if found is None:
        pytest.skip("no cgroup v1 memory, pids and freezer hierarchies here")
    return found


@pytest.fixture
def who() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


def spawn_in(group: RunCgroup, who: RunIdentity, code: str, *args: str) -> subprocess.Popen[str]:
    def preexec() -> None:
        group.join()
        identity.drop_privileges(who.uid, who.gid)

    return subprocess.Popen(
        [PYTHON, "-I", "-c", code, *args],
        preexec_fn=preexec,  # noqa: PLW1509  (pytest is single-threaded here)
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@requires_root
def test_the_memory_limit_holds_for_the_processes_together(roots: CgroupRoots, who: RunIdentity) -> None:
    group = RunCgroup(roots, f"run-{who.uid}", 200 * MIB, 32)
    try:
        child = spawn_in(group, who, HOLDERS, "90")  # 3 x 90 MiB, each far under 200 MiB alone
        out, err = child.communicate(timeout=60)
        usage = group.usage()
    finally:
        group.kill_all()
        group.close()
    assert int(out) <= 2, (out, err)
    assert usage.oom_kills >= 1
    assert usage.peak_memory_bytes <= 200 * MIB


@requires_root
def test_the_process_limit_refuses_forks_and_counts_them(roots: CgroupRoots, who: RunIdentity) -> None:
    group = RunCgroup(roots, f"run-{who.uid}", 512 * MIB, 10)
    try:
        child = spawn_in(group, who, FORKS)
        out, err = child.communicate(timeout=60)
        assert len(group.members()) == 9, "the child's sleepers outlive it, in the group"
        usage = group.usage()
    finally:
        group.kill_all()
        group.close()
    assert int(out) == 9, err  # the child itself is the tenth
    assert usage.forks_refused >= 1


@requires_root
def test_kill_all_reaches_a_daemonized_grandchild_and_close_removes_the_groups(
    roots: CgroupRoots, who: RunIdentity
) -> None:
    name = f"run-{who.uid}"
    group = RunCgroup(roots, name, 256 * MIB, 32)
    try:
        child = spawn_in(group, who, DAEMONIZE)
        out, _ = child.communicate(timeout=60)
        daemon = int(out)
        assert alive(daemon) and daemon in group.members()
        killed = group.kill_all()
    finally:
        group.close()
    assert daemon in killed
    deadline = time.monotonic() + 5
    while alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive(daemon)
    assert not any(roots.group(c, name).exists() for c in cgroup.CONTROLLERS)


@requires_root
def test_a_group_left_behind_is_emptied_and_made_afresh(roots: CgroupRoots, who: RunIdentity) -> None:
    name = f"run-{who.uid}"
    stale = RunCgroup(roots, name, 256 * MIB, 32)
    child = spawn_in(stale, who, DAEMONIZE)
    daemon = int(child.communicate(timeout=60)[0])
    stale_fds = stale._join_fds  # a crashed gateway's open files die with it; here they are closed by hand
    for fd in stale_fds:
        os.close(fd)
    fresh = RunCgroup(roots, name, 128 * MIB, 8)
    try:
        assert fresh.members() == []
        assert not alive(daemon), "the previous run's daemon was not killed"
        limit = (roots.group("memory", name) / "memory.limit_in_bytes").read_text()
        assert int(limit) == 128 * MIB
        assert fresh.usage().oom_kills == 0
    finally:
        fresh.close()
