"""`serve` forked from the suite's helper (tests/forked_gateway.py) answers as `python -m gateway serve` does:
the same answers on the wire, the same lines on stderr, the same exit on EOF and on SIGTERM; and
MCP_GATEWAY_TEST_FORK=off starts every gateway as a person's client does."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests import forked_gateway
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]


def stderr_lines(session: StdioSession, gateway: GatewayHome) -> list[str]:
    """Its stderr without what differs from one start to the next: times, pids, the session's id."""
    text = session.stderr_text().replace(str(gateway.root), "ROOT").replace(str(gateway.policy_path.parent), "OUT")
    text = re.sub(r"^\S+ \S+ ", "", text, flags=re.MULTILINE)  # the log's date and time
    return re.sub(r"\b[0-9a-f]{32}\b|\bpid \d+", "X", text).splitlines()


def conversation(session: StdioSession, gateway: GatewayHome) -> list[dict[str, Any]]:
    """initialize, tools/list, a call without a token (refused), a VIEWER's write call (refused)."""
    answers = [session.initialize(), session.request("tools/list")]
    answers.append(session.call_tool("run_pytest", {"test_path": "tests"}))
    answers.append(session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("vic")))
    for answer in answers:
        answer.pop("id", None)
        for field in ("error", "result"):
            answer.get(field, {}).get("data", {}).pop("run_id", None)
    return answers


def test_a_forked_serve_answers_as_a_started_one(
    make_gateway: Callable[..., GatewayHome], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = []
    for fork in ("on", "off"):
        gateway = make_gateway()
        gateway.add_user("vic", "VIEWER")
        monkeypatch.setenv(forked_gateway.SWITCH_VARIABLE, fork)
        session = StdioSession(gateway)
        forked = isinstance(session.process, forked_gateway.ForkedProcess)
        assert forked == (fork == "on")
        try:
            answers = json.loads(json.dumps(conversation(session, gateway)).replace(str(gateway.workspace), "WS"))
        finally:
            code = session.close()
        events = [(e["event_type"], e["code"]) for e in gateway.all_events()]
        results.append((answers, code, stderr_lines(session, gateway), events))
    assert results[0] == results[1]
    assert results[0][1] == 0


def test_sigterm_ends_a_forked_serve_as_it_ends_a_started_one(
    make_gateway: Callable[..., GatewayHome], monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = []
    for fork in ("on", "off"):
        monkeypatch.setenv(forked_gateway.SWITCH_VARIABLE, fork)
        session = StdioSession(make_gateway())
        try:
            session.initialize()
            session.process.send_signal(signal.SIGTERM)
            codes.append(session.process.wait(timeout=60))
        finally:
            session.close()
    assert codes[0] == codes[1], codes


def test_a_forked_process_that_does_not_end_in_time_is_a_timeout(
    make_gateway: Callable[..., GatewayHome], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(forked_gateway.SWITCH_VARIABLE, "on")
    session = StdioSession(make_gateway())
    try:
        session.initialize()
        assert isinstance(session.process, forked_gateway.ForkedProcess)
        assert session.process.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            session.process.wait(timeout=0.2)
    finally:
        assert session.close() == 0
