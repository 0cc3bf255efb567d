"""`check_permission` asked as Claude Code asks it, and its answer read as Claude Code reads it.

Shared by the tests of Claude Code's permission prompt tool in process
(tests/gateway/test_server_check_permission.py) and over real stdio (tests/e2e/test_claude_code*.py).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy import select

from gateway import db
from tests.harness import GatewayHome

RULES = {
    "enabled": True,
    "deny": ["Bash(rm:*)", "Bash(curl:*)"],
    "ask": ["Bash(git push:*)"],
    "allow": ["Bash(pytest:*)", "Bash(git:*)", "Read", "Edit(src/**)"],
}
_ids = itertools.count(5000)


class Asking(Protocol):
    """A client session that sends a request without waiting and collects its answer later
    (`StdioSession`, `MemorySession`)."""

    def send(self, message: Mapping[str, Any]) -> None: ...
    def wait_response(self, request_id: Any, timeout: float = 60) -> dict[str, Any]: ...


def ask(session: Asking, tool: str, tool_input: Mapping[str, Any]) -> int:
    """Send a check_permission call without waiting, as Claude Code does; returns its JSON-RPC id."""
    return send_check(session, {"tool_name": tool, "input": dict(tool_input), "tool_use_id": f"toolu_{next(_ids)}"})


def send_check(session: Asking, arguments: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> int:
    """A check_permission call with these arguments exactly (no params.auth: Claude Code sends none)."""
    request_id = next(_ids)
    params: dict[str, Any] = {"name": "check_permission", "arguments": dict(arguments)}
    if meta is not None:
        params["_meta"] = dict(meta)
    session.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
    return request_id


def answer(session: Asking, request_id: int, timeout: float = 60) -> tuple[dict[str, Any], str]:
    """The answer as Claude Code reads it: a successful result, one text block, its JSON. Also the run_id."""
    response = session.wait_response(request_id, timeout)
    assert "result" in response, response
    result = response["result"]
    assert result.get("isError") in (None, False)
    (block,) = result["content"]
    assert block["type"] == "text"
    parsed: dict[str, Any] = json.loads(block["text"])
    assert parsed["behavior"] in ("allow", "deny")
    if parsed["behavior"] == "allow":
        assert block["text"] == json.dumps(
            {"behavior": "allow", "updatedInput": parsed["updatedInput"]}, separators=(",", ":"), ensure_ascii=False
        )
    else:
        assert set(parsed) == {"behavior", "message"} and parsed["message"]
    return parsed, result["_meta"]["mcp-write-gateway/run_id"]


def check(session: Asking, tool: str, tool_input: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    return answer(session, ask(session, tool, tool_input))


def events(gateway: GatewayHome, run_id: str) -> dict[str, dict[str, Any]]:
    return {e["event_type"]: e for e in gateway.events_of(run_id)}


def questions(gateway: GatewayHome) -> list[dict[str, Any]]:
    with gateway.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(select(db.consent_requests))]
