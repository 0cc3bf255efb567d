"""What a gateway killed mid-call leaves is closed at the next sweep (decision 69), through real `serve` processes.

On SQLite and on PostgreSQL (`db_url`): a gateway killed (`kill -9`) while its call waits for an
in-band consent answer leaves `MCP_TOOL_CALL` alone, its card `pending` and its budget
reservation at the whole time limit; the next sweep of another gateway, or the next gateway to
start, writes the call's `POLICY_BLOCKED {"status": "abandoned", "reason": "gateway_lost"}`,
closes its card and charges nothing (nothing ran). A gateway killed while its run runs: the run's
processes die with it, and the next sweep (long before the run's deadline) closes the run with
`TOOL_FINISHED {"status": "abandoned", "reason": "gateway_lost"}`, charged what ran until then.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from gateway import db
from gateway.recovery import SWEEP_ENV
from tests.e2e.test_recovery import charged_ms, lines_naming, wait_until
from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
PERIOD_S = 0.5
SWEEPING = {SWEEP_ENV: str(PERIOD_S)}
RUN_TIMEOUT_S = 60
ABANDONED = {"status": "abandoned", "reason": "gateway_lost"}


@pytest.fixture
def home(db_url: str, make_gateway: Callable[..., GatewayHome]) -> GatewayHome:
    gateway = make_gateway({"consent": {"timeout_s": 120}})
    gateway.add_user("alice", "USER")
    return gateway


def card_of(gateway: GatewayHome, run_id: str) -> dict[str, Any]:
    with gateway.engine.connect() as connection:
        return dict(connection.execute(select(db.tool_calls).where(db.tool_calls.c.run_id == run_id)).one()._mapping)


def only_card(gateway: GatewayHome) -> dict[str, Any] | None:
    with gateway.engine.connect() as connection:
        row = connection.execute(select(db.tool_calls)).first()
    return None if row is None else dict(row._mapping)


def asked(gateway: GatewayHome) -> bool:
    """Whether a consent question is recorded (a connection per look: an open one would keep its snapshot)."""
    with gateway.engine.connect() as connection:
        return connection.execute(select(db.consent_requests.c.id)).first() is not None


def question_status(gateway: GatewayHome, run_id: str) -> str | None:
    q = db.consent_requests
    with gateway.engine.connect() as connection:
        return connection.execute(select(q.c.status).where(q.c.id == run_id)).scalar_one_or_none()


def closed(gateway: GatewayHome, run_id: str) -> bool:
    """Whether the sweep's closure is written: its terminal event, which lands with the card's move in one
    transaction. The card's status alone is not enough: the sweep claims a card (status `error`) first."""
    return bool(terminal_events(gateway, run_id))


def terminal_events(gateway: GatewayHome, run_id: str) -> list[dict[str, Any]]:
    return [e for e in gateway.events_of(run_id) if e["event_type"] in ("POLICY_BLOCKED", "TOOL_FINISHED")]


def kill_during_the_consent_question(gateway: GatewayHome, open_session: SessionFactory) -> str:
    """A run_pytest call whose in-band question is never answered, its gateway then killed; the call's run_id."""
    asker = open_session(gateway, env=SWEEPING, capabilities=ELICITATION)  # the question goes to this client
    asker.send_call("run_pytest", {"test_path": "tests", "timeout_s": RUN_TIMEOUT_S}, gateway.token("alice"))
    prompt = asker.read_message(timeout=60)
    assert prompt["method"] == "elicitation/create", prompt
    card = only_card(gateway)
    assert card is not None and card["status"] == "pending", card
    assert charged_ms(gateway, card["run_id"]) == RUN_TIMEOUT_S * 1000, "the reservation: the whole time limit"
    assert question_status(gateway, str(card["run_id"])) == "in_dialog", "the dialog holds a place under the cap"
    os.kill(asker.process.pid, signal.SIGKILL)
    asker.process.wait(timeout=10)
    return str(card["run_id"])


def assert_closed_as_abandoned(gateway: GatewayHome, run_id: str, terminal: str) -> None:
    ended = terminal_events(gateway, run_id)
    assert [(e["event_type"], e["detail"]) for e in ended] == [(terminal, ABANDONED)], gateway.events_of(run_id)
    card = card_of(gateway, run_id)
    assert (card["status"], card["reason"]) == ("error", "gateway_lost"), card
    verify = gateway.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_call_killed_at_the_in_band_question_is_closed_by_another_gateways_sweep(
    home: GatewayHome, open_session: SessionFactory
) -> None:
    survivor = open_session(home, env=SWEEPING)
    run_id = kill_during_the_consent_question(home, open_session)

    # Old code: the card stayed pending, the trail MCP_TOOL_CALL alone, the charge 60,000 ms: forever.
    assert wait_until(lambda: closed(home, run_id), timeout=15), survivor.stderr_text()
    assert_closed_as_abandoned(home, run_id, "POLICY_BLOCKED")
    # Settled and given back just after the closure's transaction, before the sweep logs it.
    assert wait_until(lambda: lines_naming(survivor, run_id), 5)
    assert charged_ms(home, run_id) == 0, "it waited for consent: nothing ran"
    assert question_status(home, run_id) == "expired", "its place under the cap of open questions is given back"
    time.sleep(3 * PERIOD_S)  # later sweeps find nothing more to close, or to log
    assert len(lines_naming(survivor, run_id)) == 1, survivor.stderr_text()
    assert len(terminal_events(home, run_id)) == 1


def test_a_call_killed_at_the_in_band_question_is_closed_by_the_next_gateway_to_start(
    home: GatewayHome, open_session: SessionFactory
) -> None:
    run_id = kill_during_the_consent_question(home, open_session)
    time.sleep(1)
    assert card_of(home, run_id)["status"] == "pending", "no gateway is left to close it"
    successor = open_session(home, env=SWEEPING)
    assert card_of(home, run_id)["status"] == "error", "closed at start, before the first answer"
    assert_closed_as_abandoned(home, run_id, "POLICY_BLOCKED")
    assert charged_ms(home, run_id) == 0
    assert question_status(home, run_id) == "expired"
    assert len(lines_naming(successor, run_id)) == 1, successor.stderr_text()


def start_a_slow_run(gateway: GatewayHome, session: StdioSession) -> tuple[str, int]:
    """A run_pytest call allowed in-band whose test sleeps a minute; its run_id and its pytest's pid."""
    test_file = gateway.workspace / "tests" / "test_slow.py"
    test_file.write_text("import time\n\ndef test_sleeps():\n    time.sleep(60)\n")
    test_file.chmod(0o644)
    session.responder = answer("allow_once")
    session.send_call(
        "run_pytest", {"test_path": "tests/test_slow.py", "timeout_s": RUN_TIMEOUT_S}, gateway.token("alice")
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        session.pump(0.05)
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if f"--rootdir={gateway.workspace}" in cmdline and "./tests/test_slow.py" in cmdline:
                card = only_card(gateway)
                assert card is not None
                return str(card["run_id"]), int(process.pid)
    raise AssertionError(f"the run never started: {session.stderr_text()}")


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_run_whose_gateway_was_killed_is_closed_at_the_next_sweep_charged_what_ran(
    home: GatewayHome, open_session: SessionFactory
) -> None:
    survivor = open_session(home, env=SWEEPING)
    runner = open_session(home, env=SWEEPING, capabilities=ELICITATION)
    run_id, pytest_pid = start_a_slow_run(home, runner)
    time.sleep(1.0)  # it runs a while: that much is charged
    killed_at = time.time()
    os.kill(runner.process.pid, signal.SIGKILL)
    runner.process.wait(timeout=10)

    assert wait_until(lambda: gone(pytest_pid), timeout=5), "the run's processes die with their gateway"
    # Old code: closed only past the deadline (the time limit, 60 s, plus the watchdog's grace).
    # The card moves with the run's end in one transaction; its charge is settled just after.
    assert wait_until(lambda: card_of(home, run_id)["status"] != "running", timeout=15), survivor.stderr_text()
    assert wait_until(lambda: charged_ms(home, run_id) != RUN_TIMEOUT_S * 1000, timeout=15), "the charge is settled"
    closed_at = time.time()
    with home.engine.connect() as connection:
        row = connection.execute(select(db.runs).where(db.runs.c.run_id == run_id)).one()
    assert row.status == "abandoned" and closed_at < row.deadline - 30, "closed long before its deadline"
    assert_closed_as_abandoned(home, run_id, "TOOL_FINISHED")
    started = row.created_at
    charged = charged_ms(home, run_id)
    assert (killed_at - started) * 1000 <= charged <= (closed_at - started) * 1000 + 100, (charged, started)
    assert charged < RUN_TIMEOUT_S * 1000 / 4, "not the whole time limit"
    assert [line for line in lines_naming(survivor, run_id) if "closed as abandoned" in line], survivor.stderr_text()


def test_a_check_permission_question_killed_while_it_waits_is_closed_with_its_card(
    db_url: str, make_gateway: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    # Claude Code's permission prompt: its card names its gateway session too; the question's closure moves it.
    rules = {"enabled": True, "ask": ["Bash(git push:*)"]}
    gateway = make_gateway({"permission_prompt": rules, "consent": {"timeout_s": 120}})
    gateway.add_user("alice", "USER")
    survivor = open_session(gateway, env=SWEEPING)
    asker = open_session(gateway, env={**SWEEPING, "MCP_GATEWAY_TOKEN": gateway.token("alice")})
    arguments = {"tool_name": "Bash", "input": {"command": "git push"}, "tool_use_id": "toolu_1"}
    asker.send(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "check_permission", "arguments": arguments},
        }
    )
    card = wait_until(lambda: only_card(gateway), timeout=30)
    assert card and card["status"] == "pending" and card["session_id"], card
    assert wait_until(lambda: asked(gateway), timeout=30), "the question waits for an approver"
    os.kill(asker.process.pid, signal.SIGKILL)
    asker.process.wait(timeout=10)

    run_id = str(card["run_id"])
    assert wait_until(lambda: closed(gateway, run_id), timeout=15), survivor.stderr_text()
    assert card_of(gateway, run_id)["status"] == "error"
    ended = terminal_events(gateway, run_id)
    assert [(e["event_type"], e["detail"]) for e in ended] == [("POLICY_BLOCKED", ABANDONED)], ended
    verify = gateway.cli("audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
