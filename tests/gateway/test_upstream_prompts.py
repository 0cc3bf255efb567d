"""What a person is told about an upstream MCP server's tool (docs/upstreams.md, "What a person is told"; decision
86): the upstream, its trust, each hint (a missing one named as its MCP default) and the server's description as
its own unchecked words, escaped and cut as any preview, through the real channels in process: the client's
elicitation form (tests/memory_session.py) and the console's permission block (Starlette's TestClient on the
console's app). The terminal approver, a real process in a pty: tests/e2e/test_upstream_prompts.py."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.consent.text import upstream_preview
from gateway.pipeline import is_gated
from gateway.tools.base import Trust
from gateway.tools.outcome import ToolOutcome
from gateway.tools.registry import TOOLS
from tests.gateway.test_console_routes import running_app, session_csrf, signed_in, three_users, wait_question
from tests.gateway.test_server_consent import invisible_characters
from tests.harness import MODERN, GatewayHome
from tests.refusals import accept
from tests.upstream_tools import HOSTILE_SHOWN, serving, upstream_tool

ARGS = {"repo_path": "/srv/repo", "message": "fix"}
DEFAULTS = (
    "Annotations: readOnlyHint: false · destructiveHint: true (MCP default) · idempotentHint: false (MCP default)"
    " · openWorldHint: true (MCP default)"
)
TOLD = [
    "Upstream server: git (untrusted)",
    DEFAULTS,
    f"The server describes this tool as (unchecked): {HOSTILE_SHOWN}",
    "Arguments:",
    '  message: "fix"',
    '  repo_path: "/srv/repo"',
]


def asked(
    gateway: GatewayHome, spec_kwargs: dict[str, Any], reply: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One call of the upstream tool with a client that elicits: the form it was shown, and the call's answer."""
    with serving(gateway, upstream_tool(**spec_kwargs), elicitation=True) as session:
        session.responder = lambda message: reply
        answer = session.call_tool(f"{spec_kwargs.get('upstream', 'git')}__git_commit", ARGS, gateway.token("alice"))
        (form,) = [m["params"] for m in session.unsolicited if m.get("method") == "elicitation/create"]
    return form, answer


def decision_of(gateway: GatewayHome, answer: dict[str, Any]) -> dict[str, Any]:
    run_id = answer["error"]["data"]["run_id"]
    (event,) = [e for e in gateway.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]
    return dict(event["detail"])


def test_the_form_names_the_upstream_its_trust_every_hint_and_the_servers_unchecked_words(
    gateway: GatewayHome,
) -> None:
    form, answer = asked(gateway, {}, accept("deny_once"))
    lines = form["message"].split("\n")
    assert lines[0] == "Allow this tool to run? git__git_commit"
    assert "High risk · may modify data" in lines
    assert lines[-len(TOLD) :] == [f"  {line}" for line in TOLD], "the preview, indented under the question"
    # The server's newline is written, not obeyed: no line of the form is the server's forged one.
    assert not any(line.strip().startswith("Upstream server: git (trusted)") for line in lines)
    assert invisible_characters(form["message"]) == [], "the bidi override is shown escaped"
    enum = form["requestedSchema"]["properties"]["decision"]["enum"]
    assert "allow_always" not in enum, "destructive by MCP's default: never Allow always"
    assert answer["error"]["data"]["reason"] == "consent_denied"
    assert decision_of(gateway, answer)["risk_tier"] == "high"


@pytest.mark.parametrize(
    ("trust", "annotations", "meta", "tier", "hints"),
    [
        (
            Trust.TRUSTED,
            {"readOnlyHint": True, "openWorldHint": False},
            {},
            "low",
            "readOnlyHint: true · destructiveHint: true (MCP default; it means nothing for a read-only tool)"
            " · idempotentHint: false (MCP default; it means nothing for a read-only tool)"
            " · openWorldHint: false",
        ),
        (Trust.UNTRUSTED, {"readOnlyHint": True, "openWorldHint": False}, {}, "medium", None),
        # Read-only but open world by MCP's default: high, whatever the server's _meta says of itself.
        (Trust.TRUSTED, {"readOnlyHint": True}, {"mcp-write-gateway/risk": "low"}, "high", None),
        (Trust.TRUSTED, {"readOnlyHint": True, "destructiveHint": True, "openWorldHint": False}, {}, "high", None),
        (
            Trust.TRUSTED,
            {"readOnlyHint": "yes", "openWorldHint": False, "destructiveHint": False, "idempotentHint": True},
            {},
            "medium",
            'readOnlyHint: false (MCP default; the server sent "yes", not a boolean) · destructiveHint: false'
            " · idempotentHint: true · openWorldHint: false",
        ),
    ],
    ids=["trusted read", "untrusted read", "meta ignored", "read-only destructive", "not a boolean"],
)
def test_the_tier_comes_from_the_hints_and_the_policys_trust_never_the_servers_meta(
    gateway: GatewayHome,
    *,
    trust: Trust,
    annotations: dict[str, Any],
    meta: dict[str, Any],
    tier: str,
    hints: str | None,
) -> None:
    spec = {"trust": trust, "annotations": annotations, "meta": meta}
    form, answer = asked(gateway, spec, accept("deny_once"))
    assert decision_of(gateway, answer)["risk_tier"] == tier
    assert f"Upstream server: git ({trust})" in form["message"]
    if hints is not None:
        assert f"Annotations: {hints}" in form["message"]


def test_a_long_description_is_cut_loudly_and_deny_once_is_the_forms_default(gateway: GatewayHome) -> None:
    form, answer = asked(gateway, {"description": "x" * 5000}, {"action": "accept", "content": {}})
    assert "✂ CUT:" in form["message"] and "NOT SHOWN WHOLE" in form["message"]
    field = form["requestedSchema"]["properties"]["decision"]
    assert field["enum"][0] == "deny_once" and field["default"] == "deny_once"
    assert answer["error"]["data"]["reason"] == "consent_denied"


def test_the_servers_title_is_shown_as_its_own_words_too(gateway: GatewayHome) -> None:
    annotations = {"title": "Safe\u2066 commit", "readOnlyHint": False, "destructiveHint": False}
    form, _ = asked(gateway, {"annotations": annotations}, accept("deny_once"))
    assert "The server titles this tool (unchecked): Safe\\u2066 commit" in form["message"]


def test_the_2026_round_trips_question_tells_the_same(gateway: GatewayHome) -> None:
    with serving(gateway, upstream_tool(), elicitation=True, version=MODERN) as session:
        params = {"name": "git__git_commit", "arguments": ARGS, "auth": {"token": gateway.token("alice")}}
        first = session.request("tools/call", params)["result"]
        message = first["inputRequests"]["consent"]["params"]["message"]
        assert message.split("\n")[-len(TOLD) :] == [f"  {line}" for line in TOLD]
        answer = {"inputResponses": {"consent": accept("deny_once")}, "requestState": first["requestState"]}
        refused = session.request("tools/call", {**params, **answer})
    assert refused["error"]["data"]["reason"] == "consent_denied"


# --- the console's permission block ---------------------------------------------------------------------


def test_the_consoles_permission_block_tells_the_same(make_gateway: Callable[..., GatewayHome], tmp_path: Path) -> None:
    gw = three_users(make_gateway, tmp_path)
    with running_app(gw) as app, serving(gw, upstream_tool()) as session:  # no elicitation: the console is asked
        waiting = session.request_soon(
            "tools/call", {"name": "git__git_commit", "arguments": ARGS, "auth": {"token": gw.token("alice")}}
        )
        question = wait_question(gw, "alice")
        ada = signed_in(app, "ada")
        page = ada.get("/approvals").text
        block = page[page.index(f'data-id="{question}"') :]
        shown = html.unescape(block[block.index("<pre") : block.index("</pre>")])
        for line in TOLD:
            assert line.strip() in shown, (line, shown)
        assert "High risk" in html.unescape(block)
        assert 'value="ALLOW_ALWAYS"' not in block, "destructive: no Allow always"
        assert invisible_characters(shown.split(">", 1)[1]) == []
        ada.post(f"/approvals/{question}", data={"decision": "DENY_ONCE", "csrf": session_csrf(ada)})
        assert waiting.result(60)["error"]["data"]["reason"] == "consent_denied"


# --- which tools are asked (decision 86) ----------------------------------------------------------------


def test_only_the_gateways_own_read_tools_skip_consent() -> None:
    assert {name for name, spec in TOOLS.items() if not is_gated(spec)} == {
        "list_artifacts", "get_evidence", "get_artifact_content",
    }  # fmt: skip
    assert is_gated(upstream_tool(trust=Trust.TRUSTED, annotations={"readOnlyHint": True, "openWorldHint": False}))


def test_an_upstream_tool_with_a_read_is_still_asked_and_never_run_as_one(gateway: GatewayHome) -> None:
    read_calls: list[Any] = []

    def read(*args: Any) -> ToolOutcome:
        read_calls.append(args)
        return ToolOutcome("read in process")

    spec = dataclasses.replace(
        upstream_tool(trust=Trust.TRUSTED, annotations={"readOnlyHint": True, "openWorldHint": False}),
        read=read,
        execute=None,
    )
    with serving(gateway, spec, elicitation=True) as session:
        session.responder = lambda message: accept("allow_once")
        answer = session.call_tool("git__git_commit", ARGS, gateway.token("alice"))
        asked_forms = [m for m in session.unsolicited if m.get("method") == "elicitation/create"]
    assert len(asked_forms) == 1, "a read-only upstream tool is asked"
    assert answer["error"]["code"] == -32603 and answer["error"]["data"]["reason"] == "tool_not_implemented"
    assert read_calls == [], "never run in process"


def test_the_lines_in_portuguese() -> None:
    spec = upstream_tool(annotations={"readOnlyHint": True, "openWorldHint": False})
    assert spec.origin is not None
    lines = upstream_preview(spec.origin, spec.annotations, ARGS, "pt-BR").split("\n")
    assert lines[0] == "Servidor upstream: git (não confiável)"
    assert lines[1].startswith("Anotações: readOnlyHint: true · destructiveHint: true (padrão do MCP; não vale")
    assert lines[2] == f"O servidor descreve esta ferramenta como (não verificado): {HOSTILE_SHOWN}"
    assert lines[3:] == ["Argumentos:", '  message: "fix"', '  repo_path: "/srv/repo"']
