"""The uid drop and the rlimits, in real children as root: the drop is what makes the limits hold."""

from __future__ import annotations

import json
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends import identity
from sandbox.backends.identity import RunIdentity, UidPool, pick_uid
from sandbox.backends.rlimits import MIB, ResourceLimits
from sandbox.errors import SandboxStartError
from sandbox.limits import Limits
from tests.sandbox.confined_child import (
    confine,
    leased_identity,
    requires_root,
    resource_limits,
    run_python,
    shared_dir,
)

CAP_SYS_RESOURCE = 24


def no_account(uid: int) -> bool:
    return False


def has_capability(bit: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


@pytest.mark.parametrize(
    ("pool", "busy", "start", "expected"),
    [
        (range(61000, 61003), set(), 0, 61000),
        (range(61000, 61003), {61000}, 0, 61001),
        (range(61000, 61003), set(), 2, 61002),
        (range(61000, 61003), {61002}, 2, 61000),  # wraps around
        (range(999, 1001), set(), 0, 1000),  # never a system uid, even if the pool holds one
    ],
)
def test_pick_uid_skips_busy_uids_from_the_cursor(pool: range, busy: set[int], start: int, expected: int) -> None:
    assert pick_uid(pool, busy, start, has_account=no_account) == expected


def test_pick_uid_skips_account_uids_and_fails_closed_when_exhausted() -> None:
    assert pick_uid(range(61000, 61002), set(), has_account=lambda uid: uid == 61000) == 61001
    with pytest.raises(SandboxStartError, match="uid_pool_exhausted"):
        pick_uid(range(61000, 61002), {61000, 61001}, has_account=no_account)


def test_two_gateways_on_one_host_never_share_a_uid(tmp_path: Path) -> None:
    # Two pools over one lock folder stand for two gateway processes: flock is per open file.
    first_gateway = UidPool(range(62950, 62952), lock_dir=tmp_path)
    second_gateway = UidPool(range(62950, 62952), lock_dir=tmp_path)
    held = first_gateway.acquire()
    other = second_gateway.acquire()
    assert held.uid != other.uid
    with pytest.raises(SandboxStartError, match="uid_pool_exhausted"):
        second_gateway.acquire()
    first_gateway.release(held)
    assert second_gateway.acquire().uid == held.uid


def test_pool_never_hands_out_a_reserved_uid_twice(tmp_path: Path) -> None:
    pool = UidPool(range(62900, 62903), lock_dir=tmp_path)
    first, second = pool.acquire(), pool.acquire()
    assert first.uid != second.uid
    assert first.gid == first.uid
    pool.release(first)
    assert pool.acquire().uid not in {first.uid, second.uid}  # the cursor rotates: a released uid waits


@pytest.mark.parametrize(("uid", "gid"), [(0, 61000), (61000, 0), (999, 61000)])
def test_privileged_identities_are_refused(uid: int, gid: int) -> None:
    with pytest.raises(ValueError, match="unprivileged"):
        RunIdentity(uid=uid, gid=gid)
    with pytest.raises(SandboxStartError, match="run_uid_privileged"):
        identity.drop_privileges(uid, gid)


def test_resource_limits_from_limits_and_validation() -> None:
    limits = Limits(timeout_s=2.5, memory_limit_mb=512, max_processes=32, max_output_bytes=1)
    built = ResourceLimits.from_limits(limits)
    # The process limit leaves room for the run's two supervisors (pidns.py; bubblewrap's own two).
    assert (built.address_space_bytes, built.cpu_seconds, built.processes, built.core_bytes) == (512 * MIB, 4, 34, 0)
    with pytest.raises(ValueError, match="processes"):
        resource_limits(processes=0)
    with pytest.raises(ValueError, match="core"):
        ResourceLimits(1, 1, 1, 1, 1, core_bytes=1)


@pytest.fixture
def who() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


@pytest.fixture
def readable_dir() -> Iterator[Path]:
    with shared_dir() as path:
        yield path


REPORT_IDENTITY = """
import json, os, resource
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
try:
    open(os.sys.argv[1]).read()
    secret = "read"
except PermissionError:
    secret = "PermissionError"
raised = {}
for name in ("RLIMIT_NPROC", "RLIMIT_AS"):
    which = getattr(resource, name)
    try:
        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        raised[name] = "raised"
    except (ValueError, OSError):
        raised[name] = "refused"
print(json.dumps({"resuid": os.getresuid(), "resgid": os.getresgid(), "groups": os.getgroups(),
    "nnp": status["NoNewPrivs"].strip(), "caps": status["CapEff"].strip(), "secret": secret, "raised": raised,
    "nproc": resource.getrlimit(resource.RLIMIT_NPROC), "core": resource.getrlimit(resource.RLIMIT_CORE)}))
"""


@requires_root
def test_dropped_child_is_the_pool_uid_and_cannot_read_root_files_or_raise_limits(
    who: RunIdentity, readable_dir: Path
) -> None:
    secret = readable_dir / "secret.key"
    secret.write_text("hunter2")
    secret.chmod(0o600)

    result = run_python(REPORT_IDENTITY, confine(who, resource_limits()), str(secret))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["resuid"] == [who.uid] * 3
    assert report["resgid"] == [who.gid] * 3
    assert report["groups"] == []
    assert report["nnp"] == "1"
    assert int(report["caps"], 16) == 0
    assert report["secret"] == "PermissionError"
    assert report["raised"] == {"RLIMIT_NPROC": "refused", "RLIMIT_AS": "refused"}
    assert report["nproc"] == [20, 20]
    assert report["core"] == [0, 0]


@requires_root
def test_without_the_drop_root_reads_the_secret_and_raises_limits(who: RunIdentity, readable_dir: Path) -> None:
    """The control: the same child, left as root, gets through; the drop is what stops it."""
    secret = readable_dir / "secret.key"
    secret.write_text("hunter2")
    secret.chmod(0o600)

    result = run_python(REPORT_IDENTITY, confine(who, resource_limits(), drop=False), str(secret))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["resuid"] == [0, 0, 0]
    assert report["secret"] == "read"
    # Root raises hard limits only with CAP_SYS_RESOURCE, which this container's bounding set lacks.
    expected = "raised" if has_capability(CAP_SYS_RESOURCE) else "refused"
    assert report["raised"] == {"RLIMIT_NPROC": expected, "RLIMIT_AS": expected}


FORK_LOOP = """
import os, time
made = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.closerange(0, 3)  # the test reads the parent's pipes to EOF
        time.sleep(2)
        os._exit(0)
    made += 1
print(made)
"""


@requires_root
def test_fork_loop_stops_at_the_process_limit(who: RunIdentity) -> None:
    result = run_python(FORK_LOOP, confine(who, resource_limits(processes=20)))
    assert result.returncode == 0, result.stderr
    made = int(result.stdout)
    assert 0 < made < 25  # the sleeping children are swept by the fixture


@requires_root
def test_without_the_drop_the_process_limit_does_not_hold(who: RunIdentity) -> None:
    """The control: root ignores RLIMIT_NPROC (its children exit on their own after 2 s)."""
    result = run_python(FORK_LOOP, confine(who, resource_limits(processes=20), drop=False))
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == 100


MEMORY_HOG = """
import sys
small = bytearray(64 * 1024 * 1024)
try:
    big = bytearray(1024 * 1024 * 1024)
except MemoryError:
    print("MemoryError")
    sys.exit(0)
print("allocated")
"""


@requires_root
def test_memory_hog_over_the_address_space_limit_gets_memory_error(who: RunIdentity) -> None:
    result = run_python(MEMORY_HOG, confine(who, resource_limits(address_space_bytes=256 * MIB)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "MemoryError"


def test_apply_sets_soft_equal_to_hard_in_order() -> None:
    limits = resource_limits()
    assert [which for which, _ in limits.settings()] == [
        resource.RLIMIT_CORE,
        resource.RLIMIT_AS,
        resource.RLIMIT_CPU,
        resource.RLIMIT_NOFILE,
        resource.RLIMIT_NPROC,
        resource.RLIMIT_FSIZE,
    ]


def test_a_uid_set_aside_stays_locked_until_a_run_of_this_gateway_takes_it(tmp_path: Path) -> None:
    gateway = UidPool(range(62960, 62962), lock_dir=tmp_path)
    other_gateway = UidPool(range(62960, 62962), lock_dir=tmp_path)
    gateway.refill()
    gateway.refill()  # one is set aside at a time
    taken = other_gateway.acquire()
    with pytest.raises(SandboxStartError, match="uid_pool_exhausted"):
        other_gateway.acquire()  # the one set aside is held: no other gateway hands it out
    reserved = gateway.acquire()
    assert reserved.uid != taken.uid
    gateway.refill()  # nothing is free: nothing set aside, nothing raised
    with pytest.raises(SandboxStartError, match="uid_pool_exhausted"):
        gateway.acquire()
    gateway.release(reserved)
    assert other_gateway.acquire().uid == reserved.uid


# As root, one process whose real, effective or saved uid alone (argv[1]) is the busy one, named with a forged
# `Uid:` line (a run's process may rename itself: the kernel escapes the newline, so the scan reads the true one).
HOLDS_ONE_UID = """
import os, sys, time
with open("/proc/self/comm", "w") as comm:
    comm.write("\\nUid:\\t0\\t0\\t0")
uid = int(sys.argv[2])
os.setresuid(*(uid if field == sys.argv[1] else 0 for field in ("real", "effective", "saved")))
print(flush=True)
time.sleep(30)
"""


@requires_root
@pytest.mark.parametrize("field", ["real", "effective", "saved"])
def test_a_uid_with_a_live_process_is_never_set_aside(tmp_path: Path, field: str) -> None:
    busy = 62970
    sleeper = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", HOLDS_ONE_UID, field, str(busy)], stdout=subprocess.PIPE
    )
    try:
        assert sleeper.stdout is not None
        assert sleeper.stdout.readline() == b"\n", "the sleeper is up, its uid set"
        assert busy in identity.live_uids()
        pool = UidPool(range(busy, busy + 2), lock_dir=tmp_path)
        pool.refill()
        assert pool.acquire().uid == busy + 1
    finally:
        sleeper.kill()
        sleeper.wait()
        if sleeper.stdout is not None:
            sleeper.stdout.close()
