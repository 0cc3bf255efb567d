"""The server answers tools/list and a refused call over real stdio."""

from collections.abc import Callable

from tests.harness import GatewayHome, StdioSession


def test_viewer_running_pytest_is_refused_with_32003(
    gateway: GatewayHome, open_session: Callable[..., StdioSession]
) -> None:
    session = open_session(gateway)
    response = session.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("vic"))
    assert response["error"]["code"] == -32003
    assert response["error"]["data"]["reason"] == "missing_permission"
    run_id = response["error"]["data"]["run_id"]
    kinds = [e["event_type"] for e in gateway.events_of(run_id)]
    assert kinds == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
