"""tools/list over real stdio: the allowlist's schemas and annotations, for everyone. Filtering by the
caller's token and by the allowlist, in both protocol eras: tests/gateway/test_server_tools_list.py (in process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]


def names(response: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in response["result"]["tools"]]


def test_tools_list_without_token_shows_the_allowlist_with_schemas(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    session = open_session(gateway)
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
