"""Fixtures of the end-to-end tests: a person at `mcp-gateway approvals`, in a real pty (pexpect)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pexpect
import pytest

from tests.harness import GatewayHome


@pytest.fixture
def approvals(gateway: GatewayHome) -> Iterator[Callable[[], pexpect.spawn]]:
    """Start approvers on the test module's `gateway`; each is killed at the end of the test."""
    started: list[pexpect.spawn] = []

    def start() -> pexpect.spawn:
        argv = gateway.cli_argv("approvals")
        child = pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=30, dimensions=(50, 200))
        child.expect("waiting for consent requests")
        started.append(child)
        return child

    yield start
    for child in started:
        child.terminate(force=True)
