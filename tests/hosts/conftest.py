"""Fixtures of the host matrix (issue 14): `guest`, one KVM/TCG guest with a cgroup-v2-only hierarchy per session."""

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
