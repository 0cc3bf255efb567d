"""tools/list through the MCP server in process: schemas and annotations for everyone, filtered to the
caller's permissions with a token. The list over real stdio: tests/e2e/test_tools_list.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import LEGACY, MODERN, GatewayHome
from tests.memory_session import MemorySession

SessionFactory = Callable[..., MemorySession]
ERAS = pytest.mark.parametrize("version", [LEGACY, MODERN])


def names(response: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in response["result"]["tools"]]


@ERAS
def test_tools_list_without_token_shows_the_allowlist_with_schemas(
    gateway: GatewayHome, open_memory: SessionFactory, version: str
) -> None:
    session = open_memory(gateway, version=version)
    response = session.request("tools/list")
    assert names(response) == ["run_pytest", "list_artifacts", "get_evidence", "get_artifact_content"]
    run_pytest = response["result"]["tools"][0]
    assert run_pytest["inputSchema"]["required"] == ["test_path"]
    assert run_pytest["inputSchema"]["additionalProperties"] is False
    assert set(run_pytest["inputSchema"]["properties"]) == {
        "test_path",
        "workspace",
        "keyword",
        "markers",
        "max_failures",
        "timeout_s",
    }
    hints = {k: v for k, v in run_pytest["annotations"].items() if k.endswith("Hint")}
    assert hints == {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    assert all(tool["annotations"]["readOnlyHint"] is True for tool in response["result"]["tools"][1:])


@ERAS
def test_tools_list_with_a_token_shows_only_what_the_user_may_call(
    gateway: GatewayHome, open_memory: SessionFactory, version: str
) -> None:
    session = open_memory(gateway, version=version)
    viewer = session.request("tools/list", {"auth": {"token": gateway.token("vic")}})
    assert names(viewer) == ["list_artifacts", "get_evidence", "get_artifact_content"]
    user = session.request("tools/list", {"auth": {"token": gateway.token("alice")}})
    assert "run_pytest" in names(user)
    bad = session.request("tools/list", {"auth": {"token": "not-a-token"}})
    assert bad["error"]["code"] == -32001


def test_tools_list_follows_the_allowlist(
    make_gateway: Callable[..., GatewayHome], open_memory: SessionFactory
) -> None:
    gateway = make_gateway({"tools": {"allowlist": ["get_evidence"]}})
    session = open_memory(gateway)
    assert names(session.request("tools/list")) == ["get_evidence"]
