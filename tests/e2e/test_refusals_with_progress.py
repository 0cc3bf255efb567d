"""A refusal is the same refusal whether the call carried `_meta.progressToken` or not.

Claude Code sends a progressToken with every tools/call (and so do the SDKs that reset their
timeout on progress). Each row of the tables below is one refusal, made twice through a real
`mcp-gateway serve` over stdio, once with a token and once without, on both protocol eras: the
2025 era (`initialize`, then `elicitation/create` or the approver) and the 2026-07-28 era (the
envelope in `_meta`, and an `input_required` round trip). What must be the same: the answer
(code, message, data but its run_id), the audit trail (each event's type, code and detail, in
order; ids, times and names of the per-row user aside) and the console's card (status, code,
reason, message). What must hold besides: the code and reason the row names, and no traceback.

The refusals that happen while the call waits (for a person: every denial channel and the
consent timeout; for its run: a sandbox that cannot start) are those the old code answered
-32603 `internal_error` when a token was sent. Here, over the wire: a denial in the client's
dialog, an answer that is not an elicitation result, the terminal approver in a pty, and the two
that run the sandbox. Every other row (each denial, the console's deny, the consent timeout,
every code refused before a wait, a failing database, the permission prompt) is
tests/gateway/test_server_progress_refusals.py: the same server in process.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import FORM_ELICITATION, MODERN, Approver, GatewayHome, StdioSession, shows_request, venv_beside
from tests.refusals import (
    DENIALS,
    accept,
    answering,
    assert_decision,
    call,
    params_of,
    round_trip,
    same_with_and_without,
)

SessionFactory = Callable[..., StdioSession]
ELICITATION = FORM_ELICITATION


@dataclass(frozen=True)
class Client:
    """A session of one era against a gateway."""

    gateway: GatewayHome
    session: StdioSession
    era: str


# --- while a person is asked: every denial channel, both eras -----------------------------------------


def test_a_denial_in_the_clients_dialog_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    """Deny once, both eras; every denial: test_server_progress_refusals.py."""
    _name, reply, decision, reason = DENIALS[0]
    legacy = open_session(gateway, capabilities=ELICITATION)
    legacy.responder = answering(reply)
    found = same_with_and_without(
        gateway, lambda user, p: call(legacy, params_of(gateway, user, p, era="")), -32008, reason, legacy.stderr_text
    )
    assert_decision(found, decision, "user_prompt", "elicitation")

    modern = open_session(gateway, initialize=False)
    found = same_with_and_without(
        gateway,
        lambda user, p: round_trip(modern, params_of(gateway, user, p, era=MODERN), reply),
        -32008,
        reason,
        modern.stderr_text,
    )
    assert_decision(found, decision, "user_prompt", "elicitation")


def test_an_answer_that_is_no_answer_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    """An answer on the wire that is not an elicitation result; a 2026-07-28 retry with a state of no
    question: test_server_progress_refusals.py."""
    legacy = open_session(gateway, capabilities=ELICITATION)
    legacy.responder = answering({"action": 7})  # not an elicitation result: nobody's answer
    found = same_with_and_without(
        gateway,
        lambda user, p: call(legacy, params_of(gateway, user, p, era="")),
        -32008,
        "consent_no_answer",
        legacy.stderr_text,
    )
    assert_decision(found, "DENY_ONCE", "no_answer", "elicitation")


def test_the_approvers_deny_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory, approvals: Callable[[], Approver]
) -> None:
    """The terminal approver (`mcp-gateway approvals`, in a pty): Deny once is key 3, Deny always key 4."""
    approver = approvals()
    for era in ("", MODERN):
        session = open_session(gateway, initialize=era != MODERN)
        for key, decision, reason in (
            ("3", "DENY_ONCE", "consent_denied"),
            ("4", "DENY_ALWAYS", "consent_denied_always"),
        ):
            refuse = functools.partial(_denied_at_the_approver, Client(gateway, session, era), approver, key)
            found = same_with_and_without(gateway, refuse, -32008, reason, session.stderr_text)
            assert_decision(found, decision, "user_prompt", "approver")


def _denied_at_the_approver(
    client: Client, approver: Approver, key: str, user: str, progress: str | None
) -> dict[str, Any]:
    session = client.session
    params = params_of(client.gateway, user, progress, era=client.era, capabilities={})
    session.send({"jsonrpc": "2.0", "id": f"pty-{user}", "method": "tools/call", "params": params})
    shows_request(approver)
    approver.send(key)
    return session.wait_response(f"pty-{user}", timeout=120)


# --- while the run is on: a sandbox that cannot start, and a run past its time limit ------------------


def test_a_sandbox_that_cannot_start_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory, tmp_path: Path
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="mcp-gw-venv-"))
    try:
        folder.chmod(0o755)
        python = str(venv_beside(folder))
        legacy = open_session(gateway, capabilities=ELICITATION, python=python)
        modern = open_session(gateway, initialize=False, python=python)
        # Answered: `serve` has checked (and keeps) its interpreter's paths before they turn unreachable.
        assert "result" in call(
            modern, params_of(gateway, "alice", None, era=MODERN, name="list_artifacts", arguments={})
        )
        folder.chmod(0o700)  # after `serve` started on it: the run's uid cannot exec it
        legacy.responder = answering(accept("allow_once"))
        found = same_with_and_without(
            gateway,
            lambda user, p: call(legacy, params_of(gateway, user, p, era="")),
            -32006,
            "sandbox_start_failed",
            legacy.stderr_text,
        )
        kinds = [e["event_type"] for e in found.trail]
        assert kinds[-2:] == ["TOOL_STARTED", "TOOL_FINISHED"] and found.card is not None, found
        assert found.card[:3] == ("error", -32006, "sandbox_start_failed")
        found = same_with_and_without(
            gateway,
            lambda user, p: round_trip(modern, params_of(gateway, user, p, era=MODERN), accept("allow_once")),
            -32006,
            "sandbox_start_failed",
            modern.stderr_text,
        )
        assert found.card is not None and found.card[:3] == ("error", -32006, "sandbox_start_failed")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_run_past_its_time_limit_is_the_same_with_progress_on(
    gateway: GatewayHome, open_session: SessionFactory
) -> None:
    slow = gateway.workspace / "tests" / "test_sleeps.py"
    slow.write_text("import time\n\ndef test_sleeps():\n    time.sleep(60)\n")
    slow.chmod(0o644)
    arguments = {"test_path": "tests/test_sleeps.py", "timeout_s": 2}
    legacy = open_session(gateway, capabilities=ELICITATION)
    legacy.responder = answering(accept("allow_once"))
    modern = open_session(gateway, initialize=False)
    for refuse in (
        functools.partial(_called, Client(gateway, legacy, ""), {"arguments": arguments}),
        functools.partial(_allowed_in_a_round_trip, Client(gateway, modern, MODERN), {"arguments": arguments}),
    ):
        found = same_with_and_without(gateway, refuse, -32007, "timeout", legacy.stderr_text, modern.stderr_text)
        assert found.card is not None and found.card[:3] == ("error", -32007, "timeout")


def _called(client: Client, how: dict[str, Any], user: str, progress: str | None) -> dict[str, Any]:
    return call(client.session, params_of(client.gateway, user, progress, era=client.era, **how))


def _allowed_in_a_round_trip(client: Client, how: dict[str, Any], user: str, progress: str | None) -> dict[str, Any]:
    params = params_of(client.gateway, user, progress, era=MODERN, **how)
    return round_trip(client.session, params, accept("allow_once"))
