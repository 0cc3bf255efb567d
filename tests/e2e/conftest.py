"""Fixtures of the end-to-end tests: a person at `mcp-gateway approvals`, in a real pty (pexpect)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pexpect
import pytest

from tests.deadlines import scaled
from tests.harness import START_S, Approver, GatewayHome, as_approver


@pytest.fixture
def approvals(gateway: GatewayHome) -> Iterator[Callable[[], Approver]]:
    """Start approvers on the test module's `gateway`; each is killed at the end of the test."""
    started: list[Approver] = []

    def start() -> Approver:
        argv = gateway.cli_argv("approvals")
        child = as_approver(pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=30, dimensions=(50, 200)))
        started.append(child)  # killed at the end even when it never gets ready
        child.expect("waiting for consent requests", timeout=scaled(START_S))
        return child

    yield start
    for child in started:
        child.terminate(force=True)
