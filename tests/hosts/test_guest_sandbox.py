"""The host matrix's cgroup-v2 guest (issue 14, item 6 and acceptance 2): the sandbox there, as root and as a delegated user.

One pytest run inside the guest per identity holds the cgroup v2 backend's own tests
(in_guest_cgroup2_limits.py) and the sandbox's (in_guest_sandbox.py: memory total with OOM
reporting, process total, the whole-run kill, through `run_sandboxed`); `doctor` is checked
there too. The guest boots once per session (tests/hosts/conftest.py).
"""

from __future__ import annotations

import json

import pytest

from tests.guest import Guest
from tests.hosts.in_guest_cgroup2_limits import ZRAM_SWAP

USER = 4242
IN_GUEST = ["tests/hosts/in_guest_cgroup2_limits.py", "tests/hosts/in_guest_sandbox.py"]


@pytest.fixture(scope="module")
def swap_on(guest: Guest) -> None:
    """A swap device in the guest, for the swap test of the delegated run (root's run makes its own)."""
    done = guest.run(["/bin/sh", "-c", f"swapon --show=NAME --noheadings | grep -q . || ({ZRAM_SWAP})"], timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(700)
@pytest.mark.parametrize("user", [None, USER], ids=["root", "delegated-user"])
def test_the_sandbox_holds_its_totals_and_kills_whole_runs_on_cgroup_v2(
    guest: Guest, swap_on: None, user: int | None
) -> None:
    env = {"MCP_GATEWAY_TEST_DELEGATED": "1"} if user is not None else {}
    argv = [guest.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", *IN_GUEST]
    done = guest.run(argv, user=user, delegated=user is not None, env=env, timeout_s=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout and "failed" not in done.stdout


@pytest.mark.timeout(400)
@pytest.mark.parametrize("user", [None, USER], ids=["root", "delegated-user"])
def test_doctor_in_the_guest_reports_cgroup_v2_and_the_kernels_landlock(guest: Guest, user: int | None) -> None:
    argv = [guest.python, "-m", "gateway", "--home", f"/tmp/doctor-{user or 0}", "doctor", "--format", "json"]
    done = guest.run(argv, user=user, delegated=user is not None, timeout_s=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    lines = {line["name"]: line for line in report["guarantees"]}
    assert report["host"]["run_groups"] == "v2" and report["host"]["cgroup_v1"] is False
    assert lines["memory_total"]["holds"] and lines["memory_total"]["layers"] == ["cgroup"]
    assert report["rootless"] is (user is not None)
    assert lines["own_identity"]["layers"] == (["user_namespace"] if user else ["uid_drop"])
    assert report["host"]["landlock_abi"] < 3 and any("Landlock ABI < 3" in note for note in report["notes"])
