"""The cgroup v2 layer: where run groups go on each kind of host, and real joins and kills on this host's cgroup2 hierarchy.

This host's cgroup2 hierarchy (/sys/fs/cgroup/unified) has no memory or pids controller (v1
holds them): the limits are shown in a cgroup-v2-only guest (tests/hosts/test_cgroup2_limits.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends import cgroup2, identity
from sandbox.backends.cgroup2 import (
    RunCgroup2,
    V2Facts,
    V2Root,
    judge_v2,
    locate_v2,
    parse_v1_controllers,
    parse_v2_mount,
    parse_v2_options,
)
from sandbox.backends.identity import RunIdentity
from sandbox.backends.rlimits import MIB
from tests.sandbox.confined_child import DAEMONIZE, PYTHON, leased_identity, requires_root, shared_dir

V2_ONLY = """\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
25 21 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CONTAINER = """\
612 600 0:30 /docker/3f2a /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate
"""
SERVICE = "0::/system.slice/mcp-gateway.service\n"
USER_SCOPE = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r3c1.scope\n"
HYBRID_SELF = "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/\n0::/\n"


def test_a_v2_only_host_has_its_hierarchy_at_sys_fs_cgroup_and_nothing_on_v1() -> None:
    assert parse_v2_mount(V2_ONLY) == (Path("/sys/fs/cgroup"), "/")
    assert locate_v2(V2_ONLY, SERVICE) == (
        Path("/sys/fs/cgroup"),
        "/system.slice/mcp-gateway.service",
        Path("/sys/fs/cgroup/system.slice/mcp-gateway.service"),
    )
    assert parse_v1_controllers(V2_ONLY) == frozenset()


def test_a_hybrid_host_has_it_at_unified_and_v1_holds_memory_and_pids() -> None:
    assert locate_v2(HYBRID, HYBRID_SELF) == (Path("/sys/fs/cgroup/unified"), "/", Path("/sys/fs/cgroup/unified"))
    assert parse_v1_controllers(HYBRID) == {"memory", "pids"}


def test_the_mount_options_say_read_only_and_nsdelegate() -> None:
    assert {"rw", "nsdelegate"} <= parse_v2_options(V2_ONLY)
    assert "nsdelegate" not in parse_v2_options(HYBRID)
    assert {"ro", "nsdelegate"} <= parse_v2_options(CONTAINER)
    assert parse_v2_options(HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs")) == frozenset()


def test_a_systemd_user_scope_is_a_folder_deep_in_user_slice() -> None:
    _, own, folder = locate_v2(V2_ONLY, USER_SCOPE)
    assert own == "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r3c1.scope"
    assert folder == Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r3c1.scope")


@pytest.mark.parametrize(
    ("self_cgroup", "folder"),
    [
        ("0::/docker/3f2a\n", Path("/sys/fs/cgroup")),  # the container's own group is the mount's root
        ("0::/docker/3f2a/inner\n", Path("/sys/fs/cgroup/inner")),
        ("0::/docker/3f2abc\n", None),  # a sibling whose name starts alike is not below the root
        ("0::/..\n", None),  # beyond a cgroup namespace
    ],
)
def test_a_bind_mounted_subtree_shows_only_what_is_below_its_root(self_cgroup: str, folder: Path | None) -> None:
    assert locate_v2(CONTAINER, self_cgroup)[2] == folder


def test_no_cgroup2_mount_or_no_v2_line_locates_nothing() -> None:
    assert locate_v2(HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs"), HYBRID_SELF) == (None, "/", None)
    assert locate_v2(HYBRID, "4:memory:/\n") == (Path("/sys/fs/cgroup/unified"), None, None)


def facts(**changes: Any) -> V2Facts:
    """A delegated user scope on a cgroup-v2-only host, where everything holds."""
    values: dict[str, Any] = {
        "mount": Path("/sys/fs/cgroup"),
        "own": USER_SCOPE[3:].strip(),
        "folder": Path("/sys/fs/cgroup") / USER_SCOPE[4:].strip(),
        "euid": 1000,
        "owner": 1000,
        "writable": True,
        "controllers": frozenset({"cpu", "memory", "pids"}),
        "nsdelegate": True,
    }
    values.update(changes)
    return V2Facts(**values)


def test_a_delegated_scope_with_both_controllers_is_usable_with_nothing_to_say() -> None:
    assert judge_v2(facts()) == (True, frozenset({"memory", "pids"}), "", "")


@pytest.mark.parametrize(
    ("changes", "reason", "fix"),
    [
        ({"mount": None, "folder": None}, "no cgroup2 mount", "systemd.unified_cgroup_hierarchy=1"),
        ({"own": None, "folder": None}, "no `0::` line", "systemd.unified_cgroup_hierarchy=1"),
        ({"folder": None}, "is outside what the cgroup2 mount at /sys/fs/cgroup shows", "--cgroupns=private"),
        (
            {"writable": False, "owner": 0},
            "the gateway's cgroup /user.slice/user-1000.slice/user@1000.service/app.slice/run-r3c1.scope is not "
            "delegated to uid 1000 (its cgroup.procs belongs to uid 0)",
            "`systemd-run --user --scope -p Delegate=yes mcp-gateway serve ...`, or in a systemd service with Delegate=yes",
        ),
        ({"writable": False, "euid": 0}, "the cgroup2 mount at /sys/fs/cgroup is read-only here", "read-write"),
    ],
    ids=["no-mount", "no-v2-line", "outside-the-mount", "not-delegated", "read-only-as-root"],
)
def test_discovery_refuses_with_the_reason_and_the_fix(changes: dict[str, Any], reason: str, fix: str) -> None:
    usable, controllers, said, fix_said = judge_v2(facts(**changes))
    assert (usable, controllers) == (False, frozenset())
    assert reason in said
    assert fix in fix_said


@pytest.mark.parametrize(
    ("changes", "controllers", "reason", "fix"),
    [
        (
            {"controllers": frozenset({"hugetlb"}), "held_by_v1": frozenset({"memory", "pids"}), "euid": 0},
            frozenset(),
            "cgroup v2 is mounted at /sys/fs/cgroup but the memory and pids controllers are held by cgroup v1",
            "cgroup_no_v1=memory,pids",
        ),
        (
            {"controllers": frozenset({"memory"})},
            frozenset({"memory"}),
            "the pids controllers are not enabled for the gateway's cgroup /user.slice/",
            "`echo +pids > /sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/cgroup.subtree_control`",
        ),
        (
            {"others": (4242, 4243)},
            frozenset(),
            "also holds other processes (4242, 4243)",
            "start the gateway alone in its own scope",
        ),
        (
            {"nsdelegate": False},
            frozenset({"memory", "pids"}),
            "the cgroup2 mount at /sys/fs/cgroup has no nsdelegate: a run of uid 1000 that reached the cgroup "
            "filesystem could lift its own limits or leave its group",
            "`mount -o remount,nsdelegate /sys/fs/cgroup`",
        ),
    ],
    ids=["held-by-v1", "pids-withheld-by-the-parent", "other-processes-in-the-group", "no-nsdelegate-for-a-user"],
)
def test_discovery_is_partial_with_the_reason_and_the_fix(
    changes: dict[str, Any], controllers: frozenset[str], reason: str, fix: str
) -> None:
    usable, got, said, fix_said = judge_v2(facts(**changes))
    assert (usable, got) == (True, controllers)
    assert reason in said
    assert fix in fix_said


def test_the_real_root_keeps_its_controllers_with_other_processes_in_it() -> None:
    root = facts(own="/", folder=Path("/sys/fs/cgroup"), euid=0, real_root=True, others=(1, 2, 3))
    assert judge_v2(root) == (True, frozenset({"memory", "pids"}), "", "")


# --- against this host's cgroup2 hierarchy -------------------------------------------------------

MOUNT = (parse_v2_mount(Path("/proc/self/mountinfo").read_text()) or (Path("/nonexistent"), "/"))[0]
KILL_AND_FREEZE = frozenset({"kill", "freeze"})
_names = count()

# Run in a group the test made (as root, or as the owner of a delegated one): discovery, and with
# "run", a run group, a double-forked daemon joined through the preexec step, its kill and removal.
DISCOVER = """
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from sandbox.backends.cgroup2 import RunCgroup2, discover_v2, parse_v2_path
found = discover_v2()
report = {"root": None, "controls": sorted(found.controls), "reason": found.reason, "fix": found.fix}
if found.root is not None:
    report["root"] = str(found.root.folder)
if found.root is not None and sys.argv[2] == "run":
    group = RunCgroup2(found.root, "run-1", 64 << 20, 32)
    child = subprocess.Popen([sys.executable, "-I", "-c", sys.argv[3]], preexec_fn=group.join, stdout=subprocess.PIPE)
    report["daemon"] = int(child.communicate(timeout=30)[0])
    report["members"] = group.members()
    report["killed"] = group.kill_all()
    group.close()
    report["runs_left"] = sorted(p.name for p in found.root.folder.iterdir() if p.is_dir())
report["cgroup"] = parse_v2_path(open("/proc/self/cgroup").read())
print(json.dumps(report))
"""


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _empty_and_remove(path: Path) -> None:
    """Kill what the test left in its group (only the test's own processes are there) and remove it."""
    if not path.exists():
        return
    _write(path / "cgroup.kill", "1")
    deadline = time.monotonic() + 10
    while "populated 1" in (path / "cgroup.events").read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    for folder, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
        os.rmdir(folder)


@pytest.fixture
def test_group() -> Iterator[Path]:
    """A fresh group under this host's cgroup2 mount, emptied and removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    assert MOUNT.is_dir(), "this host has no cgroup2 mount: boot a kernel with one (every systemd host has it)"
    path = MOUNT / f"mcp-test-cg2-{os.getpid()}-{next(_names)}"
    path.mkdir()
    try:
        yield path
    finally:
        _empty_and_remove(path)


@pytest.fixture
def who() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


@pytest.fixture
def package() -> Iterator[Path]:
    """The cgroup modules alone, where any uid can import them (the checkout may be under /root)."""
    with shared_dir() as folder:
        backends = folder / "sandbox" / "backends"
        backends.mkdir(parents=True)
        (folder / "sandbox" / "__init__.py").write_text("")
        (backends / "__init__.py").write_text("")
        for name in ("cgroup.py", "cgroup2.py", "namespaces.py", "probe.py"):  # cgroup2 and what it imports
            shutil.copy(Path(cgroup2.__file__).parent / name, backends)
        for path in folder.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield folder


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not alive(pid)


def delegate(group: Path, who: RunIdentity) -> None:
    """What systemd does for Delegate=yes: the folder and the three files a delegatee writes are the user's."""
    for path in (group, group / "cgroup.procs", group / "cgroup.subtree_control", group / "cgroup.threads"):
        os.chown(path, who.uid, who.gid)


def discover_in(group: Path, package: Path, mode: str, who: RunIdentity | None) -> dict[str, Any]:
    """Start the DISCOVER script in `group` (entered as root before setpriv), as `who` when given."""

    def enter() -> None:
        _write(group / "cgroup.procs", "0")

    setpriv = ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups"] if who else []
    done = subprocess.run(
        [*setpriv, PYTHON, "-I", "-c", DISCOVER, str(package), mode, DAEMONIZE],
        preexec_fn=enter,  # pytest is single-threaded here
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def spawn_in(group: RunCgroup2, who: RunIdentity, code: str) -> subprocess.Popen[str]:
    def preexec() -> None:
        group.join()
        identity.drop_privileges(who.uid, who.gid)

    return subprocess.Popen(
        [PYTHON, "-I", "-c", code],
        preexec_fn=preexec,  # noqa: PLW1509  (pytest is single-threaded here)
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@requires_root
@pytest.mark.parametrize(
    "controls",
    [KILL_AND_FREEZE, frozenset({"freeze"}), frozenset()],
    ids=["cgroup.kill", "freeze-and-kill", "kill-each-until-empty"],
)
def test_kill_all_reaches_a_daemonized_grandchild_and_close_removes_the_group(
    test_group: Path, who: RunIdentity, controls: frozenset[str]
) -> None:
    assert (test_group / "cgroup.kill").exists(), "this kernel has no cgroup.kill: Linux 5.14 or later runs this test"
    group = RunCgroup2(V2Root(test_group, controls), "run-1", 256 * MIB, 32)
    try:
        child = spawn_in(group, who, DAEMONIZE)
        out, err = child.communicate(timeout=60)
        daemon = int(out)
        assert alive(daemon) and daemon in group.members(), err
        assert group.members() == [daemon], "the child exited; its daemonized grandchild is the only member"
        killed = group.kill_all()
    finally:
        group.close()
    assert killed == [daemon]
    assert gone(daemon)
    assert not (test_group / "run-1").exists()


@requires_root
def test_a_group_left_behind_is_emptied_and_made_afresh(test_group: Path, who: RunIdentity) -> None:
    root = V2Root(test_group, KILL_AND_FREEZE)
    stale = RunCgroup2(root, "run-1", 256 * MIB, 32)
    daemon = int(spawn_in(stale, who, DAEMONIZE).communicate(timeout=60)[0])
    (test_group / "run-1" / "nested").mkdir()  # what a rootless run could make in a group it owns
    os.close(stale._join_fd)  # a crashed gateway's open files die with it; here they are closed by hand
    fresh = RunCgroup2(root, "run-1", 128 * MIB, 8)
    try:
        assert fresh.members() == []
        assert gone(daemon), "the previous run's daemon was not killed"
        assert not (test_group / "run-1" / "nested").exists()
        assert fresh.usage().oom_kills == 0
    finally:
        fresh.close()
    assert not (test_group / "run-1").exists()


@requires_root
def test_a_root_gateway_moves_into_its_leaf_and_makes_runs_beside_it(test_group: Path, package: Path) -> None:
    report = discover_in(test_group, package, "run", None)
    assert report["cgroup"] == f"/{test_group.name}/gateway"
    assert report["root"] == str(test_group / "mcp-write-gateway")
    assert {"kill", "freeze"} <= set(report["controls"])
    if {"memory", "pids"} <= parse_v1_controllers(Path("/proc/self/mountinfo").read_text()):
        assert "the memory and pids controllers are held by cgroup v1" in report["reason"]
        assert "cgroup_no_v1=memory,pids" in report["fix"]
    assert report["members"] == [report["daemon"]]
    assert report["killed"] == [report["daemon"]]
    assert gone(report["daemon"])
    assert report["runs_left"] == []


@requires_root
def test_an_ordinary_user_owning_a_delegated_group_makes_and_kills_runs(
    test_group: Path, package: Path, who: RunIdentity
) -> None:
    delegate(test_group, who)
    report = discover_in(test_group, package, "run", who)
    assert report["cgroup"] == f"/{test_group.name}/gateway"
    assert report["root"] == str(test_group / "mcp-write-gateway")
    assert {"kill", "freeze"} <= set(report["controls"])
    assert report["killed"] == [report["daemon"]]
    assert gone(report["daemon"])
    assert report["runs_left"] == []
    assert (test_group / "mcp-write-gateway").stat().st_uid == who.uid


@requires_root
def test_discovery_refuses_a_group_not_delegated_to_the_user(test_group: Path, package: Path, who: RunIdentity) -> None:
    report = discover_in(test_group, package, "discover", who)
    assert report["root"] is None
    assert report["reason"] == (
        f"the gateway's cgroup /{test_group.name} is not delegated to uid {who.uid} (its cgroup.procs belongs to uid 0)"
    )
    assert "systemd-run --user --scope -p Delegate=yes" in report["fix"]
    assert report["cgroup"] == f"/{test_group.name}", "a refused discovery moves nothing"
    assert [path.name for path in test_group.iterdir() if path.is_dir()] == []
