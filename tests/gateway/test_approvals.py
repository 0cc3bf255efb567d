"""The terminal approver's decisions: which actions it offers, what each key means, what it shows."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.approvals import ESC, actions_for, decision_for_key, default_for, render
from gateway.consent import ConsentRequest, Decision, prompt_text
from gateway.consent_store import PendingRequest
from tests.fakes import T0


@pytest.mark.parametrize(
    ("key", "destructive", "decision"),
    [
        ("1", False, Decision.ALLOW_ONCE),
        ("2", False, Decision.ALLOW_ALWAYS),
        ("2", True, None),  # not offered for a destructive tool: the key does nothing
        ("3", True, Decision.DENY_ONCE),
        ("4", False, Decision.DENY_ALWAYS),
        ("5", False, Decision.ALLOW_SESSION),
        (ESC, False, Decision.DENY_ONCE),  # Esc is cautious: deny once, not deny always
        ("\r", False, Decision.ALLOW_ONCE),  # Enter: the default focus
        ("\n", True, Decision.DENY_ONCE),  # ...Deny once for a destructive tool
        ("6", False, None),
        ("y", False, None),
    ],
)
def test_decision_for_key(key: str, destructive: bool, decision: Decision | None) -> None:
    assert decision_for_key(key, destructive) is decision


def test_the_numbered_actions_follow_the_spec_and_skip_allow_always_for_destructive_tools() -> None:
    assert [k for k, _ in actions_for(False)] == ["1", "2", "3", "4", "5"]
    assert Decision.ALLOW_ALWAYS not in dict(actions_for(True)).values()
    assert default_for(False) is Decision.ALLOW_ONCE and default_for(True) is Decision.DENY_ONCE


def pending(destructive: bool = False) -> PendingRequest:
    return PendingRequest(
        id="q1",
        created_at=T0,
        expires_at=T0 + 120,
        session_id="s",
        user="alice",
        workspace="default",
        server_id="mcp-write-gateway",
        tool_name="run_pytest",
        args_hash="a" * 64,
        args_preview='{"test_path":"tests"}',
        risk_tier="high",
        destructive=destructive,
    )


def test_the_panel_shows_who_what_risk_arguments_and_time_left() -> None:
    panel = render(pending(), T0 + 20, "en-US")
    for shown in ("consent request q1", "run_pytest", "mcp-write-gateway", "High risk", "alice", "default"):
        assert shown in panel
    assert '{"test_path":"tests"}' in panel and "answer within 100 s" in panel
    assert "[2] Allow always" in panel and "[Enter] Allow once" in panel


def test_a_destructive_panel_has_no_allow_always_and_defaults_to_deny() -> None:
    panel = render(pending(destructive=True), T0, "en-US")
    assert "[2]" not in panel and "[Enter] Deny once" in panel and "(destructive)" in panel


def test_portuguese_copy_in_the_panel_and_the_prompt() -> None:
    panel = render(pending(), T0, "pt-BR")
    assert "Permitir execução desta ferramenta? run_pytest" in panel and "[1] Permitir uma vez" in panel
    assert "[4] Negar sempre" in panel and "Risco alto · pode modificar dados" in panel
    request = ConsentRequest("r", "alice", "default", "mcp-write-gateway", "run_pytest", "a" * 64, {}, "medium")
    assert prompt_text(request, "pt-BR").startswith("Permitir execução desta ferramenta? run_pytest\nDo servidor")


def test_a_preview_replaces_the_arguments_line_and_is_escaped_line_by_line() -> None:
    request = dataclasses.replace(pending(destructive=True), tool_name="Bash", preview="$ pytest\r\x1b[2Kls\n  && true")
    panel = render(request, T0, "en-US")
    assert "    $ pytest\\u000d\\u001b[2Kls\n      && true\n" in panel
    assert "Arguments:" not in panel
    assert "\x1b" not in panel and "\r" not in panel
