"""@modelcontextprotocol/server-everything (npm, `make upstream-servers`) behind the gateway (docs/upstreams/everything.md).

A server no one here wrote, built to exercise every feature of MCP: its progress reaches the client as the
gateway's progress, its log messages reach the gateway's log as its own words, its request for sampling is
refused (the server gets the error), its question to a person is relayed, labelled, only when the policy's
`relay_elicitation` says so, the roots it gets are the workspace alone, and every consent prompt shows its
annotations and description as the server's own words.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.deadlines import scaled
from tests.harness import FORM_ELICITATION, GatewayHome, StdioSession
from tests.upstreams.npm_servers import EVERYTHING, NODE_MEMORY_MB, NODE_READS, NPM_FOLDER, require_installed

SessionFactory = Callable[..., StdioSession]
GatewayFactory = Callable[..., GatewayHome]
Responder = Callable[[dict[str, Any]], dict[str, Any]]

pytestmark = require_installed(EVERYTHING)

TOOLS = (
    "echo",
    "trigger-long-running-operation",
    "toggle-simulated-logging",
    "trigger-sampling-request",
    "trigger-elicitation-request",
    "get-roots-list",
)
LABEL = "[upstream everything asks, in its own words, unchecked] "
CALL_S = 120.0


def everything_policy(**upstream: Any) -> dict[str, Any]:
    return {
        "tools": {"allowlist": ["run_pytest", *(f"everything__{tool}" for tool in TOOLS)]},
        "sandbox": {"allowed_paths": [str(NPM_FOLDER), *NODE_READS], "memory_limit_mb": NODE_MEMORY_MB},
        "upstreams": {
            "everything": {
                "command": [str(EVERYTHING)],
                "tools": list(TOOLS),
                "timeout_s": 60,
                "memory_limit_mb": NODE_MEMORY_MB,
                **upstream,
            }
        },
    }


@pytest.fixture
def everything(make_gateway: GatewayFactory) -> GatewayHome:
    gw = make_gateway()
    gw.write_policy(everything_policy())
    gw.add_user("alice", "USER")
    return gw


def consenting(asked: list[str], relayed: Responder | None = None) -> Responder:
    """Allow once every consent question (noting its text); hand the server's relayed questions to `relayed`."""

    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create", message
        text = message["params"]["message"]
        if text.startswith(LABEL):
            assert relayed is not None, text
            return relayed(message)
        asked.append(text)
        return {"action": "accept", "content": {"decision": "allow_once"}}

    return respond


def allowed_call(
    gateway: GatewayHome,
    open_session: SessionFactory,
    tool: str,
    arguments: dict[str, Any] | None = None,
    *,
    capabilities: dict[str, Any] = FORM_ELICITATION,
    relayed: Responder | None = None,
) -> tuple[StdioSession, dict[str, Any]]:
    """A new session calls `everything__<tool>` as alice, a person allowing it once: the session and its answer."""
    session = open_session(gateway, capabilities=capabilities)
    session.responder = consenting([], relayed)
    response = session.call_tool(f"everything__{tool}", arguments or {}, gateway.token("alice"), timeout=CALL_S)
    return session, response


def text_of(response: dict[str, Any]) -> str:
    assert "result" in response, response
    return "\n".join(block.get("text", "") for block in response["result"]["content"])


def test_progress_reaches_the_client_and_the_prompt_shows_the_servers_annotations(
    everything: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(everything, capabilities=FORM_ELICITATION)
    asked: list[str] = []
    session.responder = consenting(asked)
    token = everything.token("alice")
    listed = session.request("tools/list", {"auth": {"token": token}}, timeout=CALL_S)["result"]["tools"]
    assert {f"everything__{tool}" for tool in TOOLS} <= {tool["name"] for tool in listed}

    params = {
        "name": "everything__trigger-long-running-operation",
        "arguments": {"duration": 3, "steps": 3},
        "auth": {"token": token},
        "_meta": {"progressToken": "long-1"},
    }
    done = session.request("tools/call", params, timeout=CALL_S)
    assert "Long running operation completed" in text_of(done), done
    progress = [m["params"] for m in session.unsolicited if m["method"] == "notifications/progress"]
    assert progress, session.unsolicited
    assert {p["progressToken"] for p in progress} == {"long-1"}
    assert [p["progress"] for p in progress] == sorted(p["progress"] for p in progress)
    assert any("on upstream everything" in p.get("message", "") for p in progress), progress

    [prompt] = asked
    assert "Upstream server: everything (untrusted)" in prompt
    assert (
        "Annotations: readOnlyHint: true · destructiveHint: false · idempotentHint: true · openWorldHint: false"
        in prompt
    )
    assert "The server describes this tool as (unchecked): Demonstrates a long running operation" in prompt


def test_its_log_messages_reach_the_gateways_log_as_its_own_words_never_the_client(
    everything: GatewayHome, open_session: SessionFactory
) -> None:
    session, started = allowed_call(everything, open_session, "toggle-simulated-logging")
    assert "Started simulated, random-leveled logging" in text_of(started)
    deadline = time.monotonic() + scaled(30)
    while "upstream everything logs (" not in session.stderr_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    logged = [line for line in session.stderr_text().splitlines() if "upstream everything logs (" in line]
    assert logged, session.stderr_text()[-3000:]
    assert all(" INFO gateway.upstreams: " in line and ", its own words, unchecked): " in line for line in logged)
    assert not [m for m in session.unsolicited if m["method"] == "notifications/message"]


def test_its_request_for_sampling_is_refused_and_the_server_gets_the_error(
    everything: GatewayHome, open_session: SessionFactory
) -> None:
    session, sampled = allowed_call(
        everything,
        open_session,
        "trigger-sampling-request",
        {"prompt": "say yes", "maxTokens": 10},
        capabilities={**FORM_ELICITATION, "sampling": {}},
    )
    assert sampled["result"]["isError"] is True
    assert text_of(sampled) == "MCP error -32600: sampling is refused by the gateway"
    assert not [m for m in session.unsolicited if m["method"] == "sampling/createMessage"]
    run_id = sampled["result"]["_meta"]["mcp-write-gateway/run_id"]
    called = [e for e in everything.events_of(run_id) if e["event_type"] == "UPSTREAM_CALL"]
    assert [(e["detail"]["tool"], e["detail"]["is_error"]) for e in called] == [("trigger-sampling-request", True)]


def test_its_question_is_relayed_labelled_only_when_the_policy_says_so(
    everything: GatewayHome, open_session: SessionFactory
) -> None:
    session, refused = allowed_call(everything, open_session, "trigger-elicitation-request")
    assert refused["result"]["isError"] is True
    assert "elicitation is refused by the gateway (upstreams.NAME.relay_elicitation is off)" in text_of(refused)
    questions = [m["params"]["message"] for m in session.unsolicited if m["method"] == "elicitation/create"]
    assert [q for q in questions if q.startswith(LABEL)] == [], questions
    session.close()

    everything.write_policy(everything_policy(relay_elicitation=True))
    relayed: list[dict[str, Any]] = []

    def person(message: dict[str, Any]) -> dict[str, Any]:
        relayed.append(message["params"])
        return {"action": "accept", "content": {"name": "Ada Lovelace"}}

    _, answered = allowed_call(everything, open_session, "trigger-elicitation-request", relayed=person)
    assert answered["result"]["isError"] is False, answered
    assert "User inputs:\n- Name: Ada Lovelace" in text_of(answered)
    [question] = relayed
    assert question["message"] == LABEL + "Please provide inputs for the following fields:"
    assert question["requestedSchema"]["required"] == ["name"]


def test_the_roots_it_gets_are_the_workspace_alone(everything: GatewayHome, open_session: SessionFactory) -> None:
    _, roots = allowed_call(everything, open_session, "get-roots-list", capabilities={**FORM_ELICITATION, "roots": {}})
    said = text_of(roots)
    assert "Current MCP Roots (1 total)" in said
    assert f"URI: {everything.workspace.as_uri()}\n" in said
