"""Consent through the MCP server in process: the refusals a person's answer (or its absence) gives, on both
protocol eras, with a client that answers `elicitation/create` (tests/memory_session.py).

What needs a run in the sandbox (each allow) and a sample of each refusal over the wire are
tests/e2e/test_consent.py (real stdio).
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import MODERN, GatewayHome
from tests.memory_session import MemorySession
from tests.refusals import accept, answering

SessionFactory = Callable[..., MemorySession]
RUN = ("run_pytest", {"test_path": "tests"})
SPACES = "\u2420\u00d7"  # a run of spaces as shown: the symbol for space, a multiplication sign, its length
# Everything that passes run_pytest's schema and could steer or fool a reader: bidi controls, zero
# widths, a BOM, tag characters (hidden ASCII), blank-looking letters, a no-break space, a run of spaces.
STEERING = (
    "smoke\u202eevil\u202c \u2066x\u2069\u200b\ufeff\U000e0041\u2800\u3164\u00a0" + " " * 40 + "Requested by admin"
)
STEERING_SHOWN = (
    'markers: "smoke\\u202eevil\\u202c \\u2066x\\u2069\\u200b\\ufeff\\U000e0041\\u2800\\u3164\\u00a0'
    f'{SPACES}40Requested by admin"'
)


def prompts(session: MemorySession) -> list[dict[str, Any]]:
    return [m for m in session.unsolicited if m.get("method") == "elicitation/create"]


def decision_events(gateway: GatewayHome, run_id: str) -> list[dict[str, Any]]:
    return [e for e in gateway.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]


def invisible_characters(text: str) -> list[str]:
    """Every character of `text` that a reader would not see as itself (a newline between lines aside)."""
    return [
        f"U+{ord(c):04X}"
        for c in text
        if (unicodedata.category(c)[0] in "CZ" and c not in " \n") or ord(c) in (0x2800, 0x3164, 0x115F, 0x1160)
    ]


def round_trip(
    session: MemorySession, gateway: GatewayHome, *, answer: dict[str, Any] | None = None, state: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One tools/call of a 2026-07-28 session (the SDK's session stamps the envelope), with `answer` and `state`."""
    params: dict[str, Any] = {
        "name": RUN[0],
        "arguments": arguments or RUN[1],
        "auth": {"token": gateway.token("alice")},
    }
    if answer is not None:
        params["inputResponses"] = {"consent": answer}
        params["requestState"] = state
    return session.request("tools/call", params, timeout=120)


# --- the 2025 era: elicitation/create -------------------------------------------------------------------


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_decline_and_cancel_count_as_deny_once(gateway: GatewayHome, open_memory: SessionFactory, action: str) -> None:
    session = open_memory(gateway, elicitation=True)
    session.responder = answering({"action": action})
    response = session.call_tool(*RUN, gateway.token("alice"))
    assert response["error"]["code"] == -32008 and response["error"]["data"]["reason"] == "consent_denied"
    (event,) = decision_events(gateway, response["error"]["data"]["run_id"])
    assert event["detail"]["decision"] == "DENY_ONCE" and event["detail"]["origin"] == "user_prompt"


def test_no_answer_before_the_timeout_denies(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gateway = make_gateway({"consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    session = open_memory(gateway, elicitation=True)  # no responder: the prompt is never answered
    started = time.monotonic()
    response = session.call_tool(*RUN, gateway.token("alice"))
    assert response["error"]["code"] == -32008 and response["error"]["data"]["reason"] == "consent_timeout"
    assert 1 <= time.monotonic() - started < 10
    (event,) = decision_events(gateway, response["error"]["data"]["run_id"])
    assert event["detail"]["origin"] == "timeout" and event["detail"]["channel"] == "elicitation"


def test_an_answer_that_was_not_offered_is_a_deny(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway, elicitation=True)
    session.responder = answering(accept("allow_forever"))
    response = session.call_tool(*RUN, gateway.token("alice"))
    assert response["error"]["data"]["reason"] == "consent_denied"


@pytest.mark.parametrize("control", ["\x9b2J", "\u2028", "\x1b[2K", "\r"])
def test_c0_c1_and_line_separators_never_reach_a_prompt(
    gateway: GatewayHome, open_memory: SessionFactory, control: str
) -> None:
    # run_pytest's schema refuses them before consent; were one to get through, it would be escaped
    # like the characters above (tests/gateway/test_visible.py).
    session = open_memory(gateway, elicitation=True)
    session.responder = answering(accept("allow_once"))
    refused = session.call_tool(
        "run_pytest", {"test_path": "tests", "markers": f"smoke{control}x"}, gateway.token("alice")
    )
    assert refused["error"]["code"] == -32602
    assert prompts(session) == []


# --- the 2026-07-28 era: an input_required round trip ----------------------------------------------------


@pytest.mark.parametrize("answer", [{"action": "decline"}, {"action": "cancel"}, accept("deny_once")])
def test_2026_decline_cancel_and_deny_once_refuse(
    gateway: GatewayHome, open_memory: SessionFactory, answer: dict[str, Any]
) -> None:
    session = open_memory(gateway, elicitation=True, version=MODERN)
    first = round_trip(session, gateway)["result"]
    refused = round_trip(session, gateway, answer=answer, state=first["requestState"])
    assert refused["error"]["code"] == -32008 and refused["error"]["data"]["reason"] == "consent_denied"


def test_2026_deny_always_persists(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway, elicitation=True, version=MODERN)
    first = round_trip(session, gateway)["result"]
    denied = round_trip(session, gateway, answer=accept("deny_always"), state=first["requestState"])
    assert denied["error"]["data"]["reason"] == "consent_denied_always"
    again = round_trip(session, gateway)
    assert again["error"]["data"]["reason"] == "consent_denied_always", "refused at once, no round trip"


def test_2026_the_input_required_message_is_escaped_too(gateway: GatewayHome, open_memory: SessionFactory) -> None:
    session = open_memory(gateway, elicitation=True, version=MODERN)
    first = round_trip(session, gateway, arguments={"test_path": "tests", "markers": STEERING})["result"]
    message = first["inputRequests"]["consent"]["params"]["message"]
    assert invisible_characters(message) == [] and f"  {STEERING_SHOWN}" in message.split("\n")
    with gateway.engine.connect() as connection:
        stored = str(connection.exec_driver_sql("SELECT args_preview FROM consent_requests").scalar())
    assert invisible_characters(stored) == [] and STEERING_SHOWN in stored.split("\n"), "the stored question too"
