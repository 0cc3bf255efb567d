"""The invocation cards the gateway writes for the web console (gateway/calls.py), over real stdio: one
per call whose caller is known, moved with the call's own audit events (no event and no commit
more), each state in order; a card per check_permission question too."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from gateway import db
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]


def cards(gw: GatewayHome) -> dict[str, dict[str, Any]]:
    with gw.engine.connect() as connection:
        return {row.run_id: dict(row._mapping) for row in connection.execute(select(db.tool_calls))}


def test_a_refusal_gets_an_error_card_in_its_own_transaction_and_nobody_known_gets_none(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
    refused = session.call_tool("run_pytest", {"test_path": "tests", "api_token": "t0p"}, gateway.token("vic"))
    run_id = refused["error"]["data"]["run_id"]
    events = gateway.events_of(run_id)
    assert [e["event_type"] for e in events] == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]  # no event more
    card = cards(gateway)[run_id]
    assert (card["status"], card["code"], card["reason"]) == ("error", -32003, "missing_permission")
    assert card["message"] == "Permission denied: role VIEWER lacks ORCHESTRATION_RUN"
    assert card["user_name"] == "vic" and card["workspace"] is None and card["kind"] == "tool"
    assert json.loads(card["arguments"]) == {"api_token": "[redacted]", "test_path": "tests"}
    assert card["last_event_id"] == events[-1]["id"]  # written in the POLICY_BLOCKED's transaction
    anonymous = session.call_tool("run_pytest", {"test_path": "tests"}, "not-a-token")
    assert anonymous["error"]["code"] == -32001
    assert anonymous["error"]["data"]["run_id"] not in cards(gateway)


def test_a_read_and_a_write_tool_end_done_with_their_result(gateway: GatewayHome, open_session: SessionFactory) -> None:
    granted = gateway.cli("consent", "grant", "root", "run_pytest", "--always")  # nobody is asked
    assert granted.returncode == 0, granted.stderr
    session = open_session(gateway)
    token = gateway.token("root")
    ran = session.call_tool("run_pytest", {"test_path": "tests"}, token)
    run_id = ran["result"]["_meta"]["mcp-write-gateway/run_id"]
    card = cards(gateway)[run_id]
    assert card["status"] == "done" and card["code"] is None
    result = json.loads(card["result"])
    assert result[0] == ran["result"]["content"][0]
    assert [b["uri"] for b in result[1:]] == [b["uri"] for b in ran["result"]["content"][1:]]
    events = gateway.events_of(run_id)
    assert card["last_event_id"] == events[-1]["id"] and events[-1]["event_type"] == "TOOL_FINISHED"
    listed = session.call_tool("list_artifacts", {}, token)
    list_id = listed["result"]["_meta"]["mcp-write-gateway/run_id"]
    assert cards(gateway)[list_id]["status"] == "done"
    assert [e["event_type"] for e in gateway.events_of(list_id)] == ["MCP_TOOL_CALL", "TOOL_FINISHED"]


def test_a_check_permission_question_is_a_card_too(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gw = make_gateway({"permission_prompt": {"enabled": True, "deny": ["Bash(rm:*)"], "allow": ["Bash(pytest:*)"]}})
    gw.add_user("alice", "USER")
    session = open_session(gw, env={"MCP_GATEWAY_TOKEN": gw.token("alice")})
    for command, behavior in (("pytest -q", "allow"), ("rm -rf /", "deny")):
        arguments = {"tool_name": "Bash", "input": {"command": command}, "tool_use_id": "toolu_1"}
        answer = session.request("tools/call", {"name": "check_permission", "arguments": arguments})
        run_id = answer["result"]["_meta"]["mcp-write-gateway/run_id"]
        card = cards(gw)[run_id]
        assert (card["kind"], card["tool_name"], card["status"]) == ("check_permission", "check_permission", "done")
        assert (card["user_name"], card["workspace"]) == ("alice", "default")
        assert json.loads(card["arguments"]) == arguments
        (block,) = json.loads(card["result"])
        assert (
            json.loads(block["text"])["behavior"]
            == behavior
            == json.loads(answer["result"]["content"][0]["text"])["behavior"]
        )
        assert card["last_event_id"] == gw.events_of(run_id)[-1]["id"]
