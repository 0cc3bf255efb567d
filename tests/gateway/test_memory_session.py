"""The in-process harness itself (tests/memory_session.py): closing a session cancels what is in flight, as
the end of stdin does for `serve`, and leaves no task or thread of its own behind."""

from __future__ import annotations

import threading
import time

from gateway.consent.store import ConsentStore
from tests.harness import LEGACY, MODERN, GatewayHome
from tests.memory_session import memory_session


def test_a_call_in_flight_when_the_session_closes_is_cancelled_and_nothing_is_left_running(
    gateway: GatewayHome,
) -> None:
    before = set(threading.enumerate())
    with memory_session(gateway) as session:  # no elicitation: the call waits for an approver
        params = {"name": "run_pytest", "arguments": {"test_path": "tests"}, "auth": {"token": gateway.token("alice")}}
        waiting = session.request_soon("tools/call", params)
        store = ConsentStore(gateway.engine)
        deadline = time.monotonic() + 60
        while not (pending := store.fetch_pending(time.time())):
            assert time.monotonic() < deadline, "the question never showed up"
            time.sleep(0.02)  # the question is a row the gateway's thread writes: nothing here to await
    assert waiting.done(), "closed with the session"
    events = gateway.events_of(pending[0].id)
    assert [e["event_type"] for e in events] == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
    assert events[-1]["detail"] == {"status": "cancelled"}
    left = {t for t in set(threading.enumerate()) - before if not t.name.startswith("gateway-db-")}
    assert left == set(), "the database's thread pool is the process's (decision 64); nothing else may stay"


def test_both_eras_speak_their_own_protocol_version(gateway: GatewayHome) -> None:
    with memory_session(gateway) as legacy, memory_session(gateway, version=MODERN) as modern:
        assert legacy.session.protocol_version == LEGACY
        assert modern.session.protocol_version == MODERN
        for session in (legacy, modern):
            listed = session.request("tools/list")
            assert "run_pytest" in [t["name"] for t in listed["result"]["tools"]]
