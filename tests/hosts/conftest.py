"""Fixtures of the host matrix (decision 59): `guest`, one guest with a cgroup-v2-only hierarchy per session.

To run tests inside the guest, put them in a file without the `test_` prefix (so the host's
run does not collect it; pytest collects a file named on its command line whatever its name)
and start it from a host test in this folder, as root and as a delegated uid:

    def test_cgroup2_backend_in_the_guest(guest: Guest) -> None:
        argv = [guest.python, "-m", "pytest", "-q", "--noconftest", "tests/hosts/in_guest_x.py"]
        done = guest.run(argv, user=4242, delegated=True, timeout_s=300)
        assert done.returncode == 0, done.stdout[-4000:]

`--noconftest` saves the root conftest's imports (about 20 s under TCG); drop it when the
file needs its fixtures. One pytest per file and user costs 10-30 s here: group the files
of one user into one run. Host tests elsewhere that need the guest can use this fixture once
it moves to tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.guest import Guest


@pytest.fixture(scope="session")
def guest(request: pytest.FixtureRequest) -> Iterator[Guest]:
    """Booted once, on first use, from the checkout the suite runs from; killed when the session ends.

    A guest that cannot boot raises `GuestError` (the reason, QEMU's stderr, the console's tail)
    in every test that asks for it, without a second attempt.
    """
    with Guest.boot(request.config.rootpath) as booted:
        yield booted
