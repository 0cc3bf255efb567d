"""What the pipeline stores before authentication is bounded and storable (decision 47)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from gateway.call_trail import STORED_NAME_MAX, stored_tool_name
from gateway.canonical import is_text
from gateway.clock import RunId
from gateway.errors import InvalidParamsError
from gateway.pipeline import CallRequest, Pipeline, lookup_tool
from gateway.services import open_services
from tests.harness import GatewayHome


@pytest.mark.parametrize("name", ["run_pytest", "list_artifacts", "x" * STORED_NAME_MAX, "outil_été"])
def test_a_plain_name_is_stored_as_is(name: str) -> None:
    assert stored_tool_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["x" * (STORED_NAME_MAX + 1), "n" * 1_000_000, "nul\x00", "\ud800", "tab\there", "line\u2028sep", "\x1b[31m"],
)
def test_any_other_name_is_a_bounded_prefix_and_its_hash(name: str) -> None:
    stored = stored_tool_name(name)

    assert len(stored) <= STORED_NAME_MAX
    assert stored.isprintable() and is_text(stored)
    assert "...sha256:" in stored
    assert stored != stored_tool_name(name + "x")  # distinct names stay distinct


def test_is_text() -> None:
    assert is_text("abc") and is_text("ação 🚀")
    assert not is_text("\ud800") and not is_text("a\udfffb")


@pytest.mark.parametrize("arguments", [{"a": float("nan")}, {"a": float("inf")}, {"\ud800": 1}, {"a": ["\udc00"]}])
def test_arguments_that_cannot_be_hashed_are_refused_with_their_events(
    make_gateway: Callable[..., GatewayHome], arguments: dict[str, object]
) -> None:
    gateway = make_gateway()
    gateway.add_user("alice")
    services = open_services(gateway.settings, new_id=iter(RunId(f"{n:032x}") for n in range(100)).__next__)
    request = CallRequest("list_artifacts", arguments, gateway.token("alice"))

    with pytest.raises(InvalidParamsError) as caught:
        anyio.run(Pipeline(services).call, request)

    assert caught.value.reason == "unhashable_arguments"
    events = gateway.all_events()
    assert [e["event_type"] for e in events] == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
    assert events[0]["args_hash"] is None and events[1]["code"] == -32602


@pytest.mark.parametrize("name", ["x" * 1_000_000, "a\x00b", "run_pytest\n", "\ud800"])
def test_an_unknown_tools_message_names_it_as_the_log_does(name: str) -> None:
    with pytest.raises(InvalidParamsError) as caught:
        lookup_tool(name)
    message = caught.value.public_message()
    assert stored_tool_name(name) in message
    assert len(message) < 200 and "\x00" not in message and "\ud800" not in message


def test_a_plain_unknown_tool_is_named_as_sent() -> None:
    with pytest.raises(InvalidParamsError) as caught:
        lookup_tool("run_shell")
    assert "'run_shell'" in caught.value.public_message()
