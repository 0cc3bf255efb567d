"""A NUL in an authenticated call on PostgreSQL, on the consent path (decision 47).

PostgreSQL's text columns and parameters cannot hold NUL. Before the fix, a 2026-07-28 retry whose
`requestState` held one reached the database as a parameter: -32603 `database_unavailable`, and
the call had no terminal event. Now an id no question can have is looked up nowhere (the answer
belongs to no open question: -32008 `consent_state_invalid`, with its events), and every text a
question stores is NUL-free, the NUL shown escaped as the person sees it.

Each test has a new PostgreSQL database of its own (`db_url`, tests/pg_cluster.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from gateway import db
from tests.e2e.test_consent_limits import ASK_ALL, modern_params, send_all
from tests.harness import GatewayHome, StdioSession
from tests.pg_cluster import on_postgres_only

pytestmark = on_postgres_only
SessionFactory = Callable[..., StdioSession]


@pytest.fixture
def pg_gateway(db_url: str, make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    """On the test's own PostgreSQL database (`make_gateway` builds on `db_url`)."""
    gateway = make_gateway({"permission_prompt": ASK_ALL, "consent": {"timeout_s": 2}})
    gateway.add_user("alice", "USER")
    return gateway


def kinds(gateway: GatewayHome, run_id: str) -> list[tuple[str, Any]]:
    return [
        (e["event_type"], e["detail"].get("reason") or e["detail"].get("blocked_reason"))
        for e in gateway.events_of(run_id)
    ]


def test_a_nul_in_request_state_is_an_invalid_answer_with_its_events(
    pg_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(pg_gateway, initialize=False)
    (first,) = send_all(session, [("tools/call", modern_params(pg_gateway, "alice"))])
    state = first["result"]["requestState"]
    deny = {"consent": {"action": "accept", "content": {"decision": "deny_once"}}}
    forged = modern_params(pg_gateway, "alice") | {"inputResponses": deny, "requestState": state + "\x00"}
    (refused,) = send_all(session, [("tools/call", forged)])
    error = refused["error"]
    assert (error["code"], error["data"]["reason"]) == (-32008, "consent_state_invalid"), error
    assert kinds(pg_gateway, error["data"]["run_id"]) == [
        ("MCP_TOOL_CALL", None),
        ("mcp.permission.decision", "consent_state_invalid"),
        ("POLICY_BLOCKED", "consent_state_invalid"),
    ]
    # The question itself is untouched: the real answer still closes it.
    real = modern_params(pg_gateway, "alice") | {"inputResponses": deny, "requestState": state}
    (answered,) = send_all(session, [("tools/call", real)])
    assert answered["error"]["data"]["reason"] == "consent_denied"
    assert pg_gateway.chain_ok()


def test_a_nul_in_a_check_permission_input_is_asked_and_stored_escaped(
    pg_gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(pg_gateway, env={"MCP_GATEWAY_TOKEN": pg_gateway.token("alice")})
    arguments = {"tool_name": "Bash", "input": {"command": "git push a\x00b", "n\x00te": "x\x00"}}
    response = session.call_tool("check_permission", arguments, timeout=30)
    (block,) = response["result"]["content"]
    answer = json.loads(block["text"])
    assert answer["behavior"] == "deny" and "no person answered" in answer["message"], answer
    run_id = response["result"]["_meta"]["mcp-write-gateway/run_id"]
    assert kinds(pg_gateway, run_id) == [
        ("MCP_TOOL_CALL", None),
        ("mcp.permission.decision", "consent_timeout"),
        ("TOOL_FINISHED", "consent_timeout"),
    ]
    r = db.consent_requests
    with pg_gateway.engine.connect() as connection:
        row = connection.execute(select(r.c.args_preview, r.c.preview, r.c.status).where(r.c.id == run_id)).one()
    assert row.status == "expired"
    assert 'command: "git push a\\u0000b"' in row.args_preview and 'n\\u0000te: "x\\u0000"' in row.args_preview
    assert row.preview == "$ git push a\\u0000b"
    assert pg_gateway.chain_ok()
