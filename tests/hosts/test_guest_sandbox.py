"""The host matrix's cgroup-v2 guest (decisions 58, 59): the sandbox there, as root and as a delegated user.

One pytest run inside the guest per identity holds the cgroup v2 backend's own tests
(in_guest_cgroup2_limits.py) and the sandbox's (in_guest_sandbox.py: `doctor`'s report, memory
total with OOM reporting, process total, the whole-run kill, through `run_sandboxed`). The guest boots once per session (tests/hosts/conftest.py).
"""

from __future__ import annotations

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
    argv = [guest.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "timeout", "--noconftest", *IN_GUEST]
    env |= {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # each plugin's import costs under the guest's emulation
    done = guest.run(argv, user=user, delegated=user is not None, env=env, timeout_s=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout and "failed" not in done.stdout
