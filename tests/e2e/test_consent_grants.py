"""Stored decisions over real stdio (decisions 43 and 44): which channel may leave a lasting allow,
and how far a Deny made for particular arguments reaches.

Who may leave a lasting allow: by default a client that answers its own elicitation may allow once or for the session and
may deny, but is not offered Allow always, and an `allow_always` it sends anyway stores nothing;
a later session without elicitation is asked out of band. The approver's Allow always is stored
with its channel, which `consent list` shows. With the opt-in key it works as before.

How far a Deny reaches: `consent grant --deny --args '{"test_path": "tests/integration"}'` refuses (-32008, without
asking) every spelling of that path, what is under it or holds it, with any other arguments; other
paths are still asked. A sample through `check_permission` for Claude Code's file tools and Bash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import Approver, GatewayHome, StdioSession, reachable_by_everyone, shows_request

SessionFactory = Callable[..., StdioSession]
ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}
RUN = ("run_pytest", {"test_path": "tests"})
ALL_CHOICES = ["allow_once", "allow_session", "allow_always", "deny_once", "deny_always"]
IN_BAND_CHOICES = ["allow_once", "allow_session", "deny_once", "deny_always"]


def answering(*decisions: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    queue = list(decisions)

    def respond(message: dict[str, Any]) -> dict[str, Any]:
        assert message["method"] == "elicitation/create", message
        return {"action": "accept", "content": {"decision": queue.pop(0)}}

    return respond


def prompts(session: StdioSession) -> list[dict[str, Any]]:
    return [m for m in session.unsolicited if m.get("method") == "elicitation/create"]


def enum_of(prompt: dict[str, Any]) -> list[str]:
    return list(prompt["params"]["requestedSchema"]["properties"]["decision"]["enum"])


def run_id_of(response: dict[str, Any]) -> str:
    if "result" in response:
        return str(response["result"]["structuredContent"]["run_id"])
    return str(response["error"]["data"]["run_id"])


def decision_of(gateway: GatewayHome, response: dict[str, Any]) -> dict[str, Any]:
    (event,) = [e for e in gateway.events_of(run_id_of(response)) if e["event_type"] == "mcp.permission.decision"]
    return dict(event["detail"])


def listed(gateway: GatewayHome) -> list[list[str]]:
    """`consent list --all`, one list of columns per stored decision."""
    result = gateway.cli("consent", "list", "--all")
    assert result.returncode == 0, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()]


# --- who may leave a lasting allow -------------------------------------------------------------------


def test_by_default_an_in_band_allow_always_stores_nothing_and_a_later_session_is_asked_out_of_band(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    client = open_session(gateway, capabilities=ELICITATION)
    client.responder = answering("allow_always")  # a client answering its own question, off the form
    refused = client.call_tool(*RUN, gateway.token("alice"))
    assert refused["error"]["code"] == -32008 and refused["error"]["data"]["reason"] == "consent_denied"
    (prompt,) = prompts(client)
    assert enum_of(prompt) == IN_BAND_CHOICES, "the form leaves allow_always out"
    made = decision_of(gateway, refused)
    assert (made["decision"], made["channel"]) == ("DENY_ONCE", "elicitation")
    assert listed(gateway) == [], "no lasting grant"
    client.close()

    approver = approvals()
    later = open_session(gateway)  # no elicitation: only the out-of-band approver can answer
    call_id = later.send_call(*RUN, gateway.token("alice"))
    shows_request(approver)
    assert "[2] Allow always" in approver.before
    approver.send("1")
    approver.expect("ALLOW_ONCE")
    response = later.wait_response(call_id)
    assert response["result"]["structuredContent"]["passed"] > 0
    assert decision_of(gateway, response)["channel"] == "approver"


def test_the_approvers_allow_always_is_stored_with_its_channel_and_answers_an_eliciting_session(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    approver = approvals()
    first = open_session(gateway)
    call_id = first.send_call(*RUN, gateway.token("alice"))
    shows_request(approver)
    approver.send("2")
    approver.expect("ALLOW_ALWAYS")
    assert "result" in first.wait_response(call_id)
    ((grant_id, *_, state, granted_by, channel),) = listed(gateway)
    assert (state, channel) == ("active", "approver") and granted_by.startswith("approvals:")

    client = open_session(gateway, capabilities=ELICITATION)
    client.responder = answering()  # no prompt may come
    response = client.call_tool(*RUN, gateway.token("alice"))
    assert "result" in response and prompts(client) == []
    hit = decision_of(gateway, response)
    assert (hit["origin"], hit["grant_id"], hit["grant_channel"]) == ("cache_hit", int(grant_id), "approver")


def test_with_the_opt_in_an_in_band_allow_always_lasts_and_without_it_is_ignored(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    opt_in = {"consent": {"timeout_s": 2, "channels": {"elicitation": ALL_CHOICES}}}
    gateway = make_gateway(opt_in)
    gateway.add_user("alice")
    client = open_session(gateway, capabilities=ELICITATION)
    client.responder = answering("allow_always")
    assert "result" in client.call_tool(*RUN, gateway.token("alice"))
    assert enum_of(prompts(client)[0]) == ALL_CHOICES
    client.close()
    ((*_, state, _by, channel),) = listed(gateway)
    assert (state, channel) == ("active", "elicitation")

    later = open_session(gateway)  # as before the key existed: the stored allow answers, nobody is asked
    response = later.call_tool(*RUN, gateway.token("alice"))
    assert response["result"]["structuredContent"]["passed"] > 0
    assert decision_of(gateway, response)["grant_channel"] == "elicitation"
    later.close()

    gateway.write_policy({"consent": {"timeout_s": 2}})  # the opt-in withdrawn
    ((*_, state, _by, channel),) = listed(gateway)
    assert (state, channel) == ("ignored", "elicitation")
    strict = open_session(gateway)
    refused = strict.call_tool(*RUN, gateway.token("alice"))
    assert refused["error"]["data"]["reason"] == "consent_timeout", "asked out of band; nobody answered"
    assert decision_of(gateway, refused)["channel"] == "approver"


# --- a Deny for a path covers every spelling of it -----------------------------------------------


@pytest.fixture
def denied(gateway: GatewayHome) -> GatewayHome:
    """alice's workspace with tests/integration (denied for good), tests/unit and a link to the former."""
    tests = gateway.workspace / "tests"
    for folder in ("integration/sub", "unit", "integration_extra"):
        (tests / folder).mkdir(parents=True)
    (tests / "integration" / "test_x.py").write_text("def test_a():\n    pass\n")
    (tests / "alias").symlink_to("integration")
    reachable_by_everyone(gateway.workspace)
    made = gateway.cli(
        "consent", "grant", "alice", "run_pytest", "--deny", "--args", '{"test_path":"tests/integration"}'
    )
    assert made.returncode == 0, made.stderr
    return gateway


DENIED_CALLS: list[dict[str, Any]] = [
    {"test_path": "tests/integration"},
    {"test_path": "tests/integration/"},
    {"test_path": "./tests/integration"},
    {"test_path": "tests//integration"},
    {"test_path": "tests/./integration/."},
    {"test_path": "tests/unit/../integration"},
    {"test_path": "tests/integration/test_x.py"},
    {"test_path": "tests/integration/test_x.py::test_a"},
    {"test_path": "tests/integration/sub"},
    {"test_path": "tests/alias"},
    {"test_path": "tests/alias/test_x.py::test_a"},
    {"test_path": "tests"},  # runs what is in tests/integration too
    {"test_path": "tests/integration", "keyword": "smoke"},
    {"test_path": "tests/integration/", "timeout_s": 5, "max_failures": 1, "markers": "slow"},
    {"test_path": "./tests//integration/test_x.py", "workspace": "default"},
]


def test_an_args_scoped_deny_refuses_every_spelling_without_asking_and_other_paths_are_asked(
    denied: GatewayHome, open_session: SessionFactory
) -> None:
    ((*_, scope, _expires, state, _by, channel),) = listed(denied)
    assert (scope, state, channel) == ("path:test_path=tests/integration", "active", "cli")
    client = open_session(denied, capabilities=ELICITATION)
    client.responder = lambda message: {"action": "accept", "content": {"decision": "deny_once"}}
    token = denied.token("alice")
    for arguments in DENIED_CALLS:
        response = client.call_tool("run_pytest", arguments, token)
        assert response["error"]["code"] == -32008, (arguments, response)
        assert response["error"]["data"]["reason"] == "consent_denied_always", (arguments, response)
    assert prompts(client) == [], "refused by the stored Deny, nobody asked"
    for arguments in ({"test_path": "tests/unit"}, {"test_path": "tests/integration_extra"}):
        response = client.call_tool("run_pytest", arguments, token)
        assert response["error"]["data"]["reason"] == "consent_denied", (arguments, response)  # asked: deny once
    assert len(prompts(client)) == 2


def test_a_deny_with_a_path_that_leaves_the_workspace_is_refused_by_consent_grant(gateway: GatewayHome) -> None:
    for bad in ('{"test_path":"../elsewhere"}', '{"test_path":"/etc"}'):
        made = gateway.cli("consent", "grant", "alice", "run_pytest", "--deny", "--args", bad)
        assert made.returncode == 1 and "--args: test_path" in made.stderr, made.stderr


def test_an_args_scoped_allow_stays_exact(gateway: GatewayHome, open_session: SessionFactory) -> None:
    made = gateway.cli("consent", "grant", "alice", "run_pytest", "--always", "--args", '{"test_path":"tests"}')
    assert made.returncode == 0, made.stderr
    client = open_session(gateway, capabilities=ELICITATION)
    client.responder = answering("deny_once")
    assert "result" in client.call_tool("run_pytest", {"test_path": "tests"}, gateway.token("alice"))
    other = client.call_tool("run_pytest", {"test_path": "tests/"}, gateway.token("alice"))
    assert other["error"]["data"]["reason"] == "consent_denied", "another spelling is asked, not allowed"
    assert len(prompts(client)) == 1


def test_agent_tool_denies_cover_spellings_through_check_permission(
    make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    rules = {"enabled": True, "deny": [], "ask": [], "allow": []}
    gateway = make_gateway({"permission_prompt": rules, "consent": {"timeout_s": 1}})
    gateway.add_user("alice")
    ws = gateway.workspace
    (ws / "secrets").mkdir()
    for tool, arguments in (("Edit", {"file_path": "secrets"}), ("Bash", {"command": "rm -rf ~"})):
        made = gateway.cli("consent", "grant", "alice", tool, "--agent", "--deny", "--args", json.dumps(arguments))
        assert made.returncode == 0, made.stderr
    session = open_session(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token("alice")})

    def check(tool: str, tool_input: dict[str, Any]) -> str:
        response = session.call_tool("check_permission", {"tool_name": tool, "input": tool_input})
        verdict = json.loads(response["result"]["content"][0]["text"])
        return "deny always" if "deny always" in verdict.get("message", "") else verdict["behavior"]

    edit = {"old_string": "a", "new_string": "b"}
    for path in (f"{ws}/secrets/a.env", f"{ws}//secrets/./a.env", "secrets/a.env", f"{ws}/src/../secrets/b"):
        assert check("Edit", {"file_path": path, **edit}) == "deny always", path
    assert check("Bash", {"command": "rm -rf ~", "description": "tidy up", "timeout": 1000}) == "deny always"
    assert check("Edit", {"file_path": f"{ws}/src/a.py", **edit}) == "deny", "asked; nobody answered"
