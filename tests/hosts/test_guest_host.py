"""The host matrix's guest (decision 59) is what it claims: another kernel, cgroup v2 only, delegation, namespaces."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from sandbox.backends.landlock import abi_version
from tests.guest import BOOT_TIMEOUT_S, MODULES, Guest, GuestError

pytestmark = pytest.mark.timeout(BOOT_TIMEOUT_S + 60)  # the first test here boots the session's guest

USER = 4242
"""An ordinary uid with no passwd entry, in the guest only."""
LANDLOCK_ABI_BY_KERNEL = {(6, 1): 2}
"""Debian 12's linux-image-amd64 is 6.1: Landlock ABI 2 (no TRUNCATE, no TCP rules, no scopes)."""


def _kernel_version(release: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", release).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def test_guest_runs_another_kernel_than_the_host(guest: Guest) -> None:
    release = guest.run(["uname", "-r"], timeout_s=30).stdout.strip()
    assert release == guest.kernel
    assert release != os.uname().release
    assert Path("/boot", f"vmlinuz-{release}").is_file()


def test_guest_sees_the_checkout_read_only_and_writes_its_scratch(guest: Guest) -> None:
    script = "cat pyproject.toml > /dev/null && ! touch probe 2>/dev/null && touch /tmp/probe && echo ok"
    done = guest.run(["sh", "-c", script], timeout_s=30)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
    assert not (guest.checkout / "probe").exists()


def test_host_tmp_path_is_visible_read_only_in_the_guest(guest: Guest, tmp_path: Path) -> None:
    (tmp_path / "note").write_text("from the host")
    seen = guest.visible(tmp_path / "note")
    assert seen.is_relative_to("/run/host-tmp")
    done = guest.run(["sh", "-c", f"cat {seen} && ! touch {seen.parent}/probe 2>/dev/null"], timeout_s=30)
    assert (done.returncode, done.stdout) == (0, "from the host"), done.stderr
    assert guest.visible(guest.checkout) == guest.checkout.resolve()


def test_processes_see_a_single_cgroup2_hierarchy(guest: Guest) -> None:
    own = guest.run(["cat", "/proc/self/cgroup"], timeout_s=30).stdout.splitlines()
    assert len(own) == 1, own
    assert own[0].startswith("0::/"), own
    mounts = guest.run(["cat", "/proc/self/mounts"], timeout_s=30).stdout.splitlines()
    cgroup_mounts = [line.split()[1:3] for line in mounts if line.split()[2].startswith("cgroup")]
    assert cgroup_mounts == [["/sys/fs/cgroup", "cgroup2"]]


def test_cgroup2_root_offers_memory_and_pids(guest: Guest) -> None:
    controllers = guest.run(["cat", "/sys/fs/cgroup/cgroup.controllers"], timeout_s=30).stdout.split()
    assert {"memory", "pids"} <= set(controllers), controllers


def test_landlock_abi_is_the_guest_kernels_not_the_hosts(guest: Guest) -> None:
    code = "from sandbox.backends.landlock import abi_version; print(abi_version())"
    done = guest.run([guest.python, "-c", code], user=USER, timeout_s=60)
    assert done.returncode == 0, done.stderr
    expected = LANDLOCK_ABI_BY_KERNEL.get(_kernel_version(guest.kernel))
    assert expected is not None, f"the guest booted {guest.kernel}: add its Landlock ABI to LANDLOCK_ABI_BY_KERNEL"
    assert int(done.stdout) == expected
    assert int(done.stdout) != abi_version()


def test_ordinary_user_creates_user_and_network_namespaces(guest: Guest) -> None:
    done = guest.run(["unshare", "-Urn", "sh", "-c", "id -u; cat /proc/net/dev"], user=USER, timeout_s=30)
    assert done.returncode == 0, done.stderr
    uid, *devices = done.stdout.splitlines()
    assert uid == "0"
    assert [line.split(":")[0].strip() for line in devices[2:]] == ["lo"]


def test_guest_has_no_network_device_but_loopback(guest: Guest) -> None:
    assert guest.run(["ls", "/sys/class/net"], timeout_s=30).stdout.split() == ["lo"]


def test_command_runs_as_the_uid_asked_for(guest: Guest) -> None:
    assert guest.run(["id", "-u"], timeout_s=30).stdout.strip() == "0"
    assert guest.run(["id", "-u"], user=USER, timeout_s=30).stdout.strip() == str(USER)
    assert guest.run(["id", "-G"], user=USER, timeout_s=30).stdout.strip() == str(USER)


def test_undelegated_user_cannot_create_a_cgroup(guest: Guest) -> None:
    script = 'mkdir "/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/child"'
    done = guest.run(["sh", "-c", script], user=USER, timeout_s=30)
    assert done.returncode != 0
    assert "Permission denied" in done.stderr


def test_delegated_user_owns_its_cgroup_but_not_its_limits(guest: Guest) -> None:
    script = 'cd "/sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)" && stat -c "%n %u" . cgroup.procs cgroup.subtree_control cgroup.threads memory.max pids.max'
    done = guest.run(["sh", "-c", script], user=USER, delegated=True, timeout_s=30)
    owners = dict(line.split() for line in done.stdout.splitlines())
    assert owners == {
        ".": str(USER),
        "cgroup.procs": str(USER),
        "cgroup.subtree_control": str(USER),
        "cgroup.threads": str(USER),
        "memory.max": "0",
        "pids.max": "0",
    }, done.stderr


def test_command_past_its_timeout_is_killed_with_what_it_started(guest: Guest) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        guest.run(["sh", "-c", "setsid sleep 1000 & echo started; sleep 1000"], timeout_s=2)
    left = guest.run(["sh", "-c", "ps -eo comm | grep -c '^sleep$' || true"], timeout_s=30)
    assert left.stdout.strip() == "0"


def test_guest_that_cannot_mount_the_host_fails_with_its_console_tail(request: pytest.FixtureRequest) -> None:
    without_9p = tuple(name for name in MODULES if name != "9p")
    started = time.monotonic()
    with pytest.raises(GuestError, match=r"while booting") as failure:
        Guest.boot(request.config.rootpath, modules=without_9p)
    assert "guest-init: mount the host's root over 9p" in str(failure.value)
    assert "Kernel panic" in str(failure.value)
    assert time.monotonic() - started < 60


def test_delegation_without_a_user_is_refused_before_reaching_the_guest(guest: Guest) -> None:
    with pytest.raises(ValueError, match="give user="):
        guest.run(["true"], delegated=True, timeout_s=30)
