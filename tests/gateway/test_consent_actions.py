"""One decide and one revoke for every front end (gateway/consent/actions.py): the same question decided
through the terminal approver (its loop in process, and `mcp-gateway approvals` in a pty) and through
the console's route, and the same grant revoked through `consent revoke` and the console's route, leave
the same row and the same event, the front end named in it. Real database (SQLite file of a gateway
home); the console's routes through its ASGI app in process."""

from __future__ import annotations

import argparse
import dataclasses
import io
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pexpect
import pytest

from gateway.approvals import Approver, approver_name
from gateway.audit import AuditLog
from gateway.calls import CallStore
from gateway.cli.consent import cmd_consent_revoke
from gateway.consent.actions import Actor, decide_question
from gateway.consent.stage import Decision
from gateway.consent.store import Channel, ConsentStore, Grant, GrantDecision, PendingRequest, QuestionStatus
from gateway.console.app import Console, build_app
from gateway.console.sessions import SessionBook, SignInLimit, StreamSlots
from gateway.console.views import ChainWatch
from gateway.errors import StorageUnavailableError
from gateway.policy_trust import policy_for
from gateway.services import open_stores
from gateway.tools.registry import TOOL_NAMES
from tests.fakes import FakeClock, PressedKeys
from tests.harness import ConsentDesk, GatewayHome, as_approver, shows_request
from tests.pg_cluster import on_both_engines

QUESTION = PendingRequest(
    id="q1",
    created_at=0.0,
    expires_at=0.0,
    session_id="s-1",
    user="ada",
    workspace="default",
    server_id="mcp-write-gateway",
    tool_name="run_pytest",
    args_hash="ab" * 32,
    args_preview="test_path: tests/",
    risk_tier="medium",
    destructive=False,
)


@pytest.fixture
def home(tmp_path: Path) -> GatewayHome:
    gateway = GatewayHome(tmp_path)
    gateway.add_user("ada", "ADMIN")
    return gateway


def through_the_approver(home: GatewayHome, clock: FakeClock, key: str) -> str:
    """Decide the waiting question with one key in `mcp-gateway approvals`' loop; who decided."""
    keys = PressedKeys(key)
    desk = ConsentDesk.on(home.engine, clock)
    Approver(desk, keys, io.StringIO(), locale="en-US", who="approvals:ada@host").run()  # type: ignore[arg-type]  # a fake for approvals.Keys
    return "approvals:ada@host"


def through_the_terminal(home: GatewayHome, clock: FakeClock, key: str) -> str:
    """Decide it with one key in a real `mcp-gateway approvals`, in a pty (its own clock: the wall's)."""
    argv = home.cli_argv("approvals")
    approver = as_approver(pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=60, dimensions=(50, 200)))
    try:
        assert shows_request(approver) == QUESTION.id
        approver.send(key)
        approver.expect({"1": "ALLOW_ONCE", "4": "DENY_ALWAYS"}[key])
    finally:
        approver.terminate(force=True)
    return approver_name()


def post(console: Console, path: str, form: dict[str, str], cookie: str) -> int:
    """POST a form to the console's app in process (its own Host, no Origin); the response status."""
    body = urllib.parse.urlencode(form).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8765"),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", str(len(body)).encode()),
            (b"cookie", cookie.encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8765),
    }
    sent: list[dict[str, Any]] = []
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Any) -> None:
        sent.append(dict(message))

    async def main() -> None:
        with anyio.fail_after(30):
            await build_app(console)(scope, receive, send)

    anyio.run(main)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    return int(start["status"])


def console_of(home: GatewayHome, clock: FakeClock) -> tuple[Console, str, str]:
    """The console on `home`'s database, and ada signed in: the console, her session cookie, her CSRF token."""
    stores = open_stores(home.settings, clock, engine=home.engine)
    sessions = SessionBook(clock)
    session_id = sessions.open("ada")
    session = sessions.fetch(session_id)
    assert session is not None
    console = Console(
        stores=stores,
        policy=policy_for(home.settings, TOOL_NAMES),
        sessions=sessions,
        limit=SignInLimit(clock),
        streams=StreamSlots(),
        calls=CallStore(home.engine),
        chain=ChainWatch(stores),
        tls=False,
        hosts=None,
    )
    return console, f"gw_session={session_id}", session.csrf


def through_the_console(home: GatewayHome, clock: FakeClock, key: str) -> str:
    decision = {"1": Decision.ALLOW_ONCE, "4": Decision.DENY_ALWAYS}[key]
    console, cookie, csrf = console_of(home, clock)
    status = post(console, f"/approvals/{QUESTION.id}", {"decision": decision.value, "csrf": csrf}, cookie)
    assert status == 303
    return "console:ada"


FRONT_ENDS: dict[str, tuple[Callable[[GatewayHome, FakeClock, str], str], str, str]] = {
    "approver": (through_the_approver, "APPROVER_DECISION", "approver"),
    "approvals in a pty": (through_the_terminal, "APPROVER_DECISION", "approver"),
    "console": (through_the_console, "CONSOLE_DECISION", "console"),
}


def events(home: GatewayHome, *kinds: str) -> list[dict[str, Any]]:
    return [e.to_json() for e in AuditLog(home.engine, FakeClock()).events() if e.event_type in kinds]


@pytest.mark.parametrize(
    ("key", "decision", "front_end"),
    [
        pytest.param(key, decision, front_end, id=f"{key}-{decision}-{front_end}")
        for key, decision in (("1", "ALLOW_ONCE"), ("4", "DENY_ALWAYS"))
        for front_end in FRONT_ENDS
        # One key through the real terminal shows its wiring (0.4 s of CPU: an interpreter started); the other
        # key takes the same loop in process ("approver"), and tests/e2e/test_approvals.py presses 4 in a pty.
        if (front_end, key) != ("approvals in a pty", "4")
    ],
)
def test_a_decision_through_each_front_end_leaves_the_same_row_and_event(
    home: GatewayHome, front_end: str, key: str, decision: str
) -> None:
    clock = FakeClock(time.time())  # the question must be open by the wall clock too: the pty's approver reads it
    decide, event_type, channel = FRONT_ENDS[front_end]
    store = ConsentStore(home.engine)
    store.insert_request(dataclasses.replace(QUESTION, created_at=clock.now(), expires_at=clock.now() + 60))

    who = decide(home, clock, key)

    row = store.fetch_request(QUESTION.id)
    assert row is not None and (row.status, row.decision, row.decided_by) == (QuestionStatus.DECIDED, decision, who)
    (event,) = events(home, "APPROVER_DECISION", "CONSOLE_DECISION", "CONSENT_REVOKED", "mcp.permission.decision")
    assert event["event_type"] == event_type
    assert (event["run_id"], event["user"], event["workspace"], event["tool_name"], event["args_hash"]) == (
        QUESTION.id, "ada", "default", "run_pytest", QUESTION.args_hash,
    )  # fmt: skip
    assert event["detail"] == {"decision": decision, "decided_by": who, "recorded": True, "channel": channel}


@pytest.mark.parametrize(
    ("first", "second", "event_type"),
    [
        (Actor("console:bob", Channel.CONSOLE), Actor("approvals:ada@host", Channel.APPROVER), "APPROVER_DECISION"),
        (Actor("approvals:bob@host", Channel.APPROVER), Actor("console:ada", Channel.CONSOLE), "CONSOLE_DECISION"),
    ],
    ids=["approver second", "console second"],
)
def test_a_decision_that_came_second_is_on_record_as_not_counted(
    home: GatewayHome, first: Actor, second: Actor, event_type: str
) -> None:
    clock = FakeClock()
    store = ConsentStore(home.engine)
    store.insert_request(dataclasses.replace(QUESTION, created_at=clock.now(), expires_at=clock.now() + 60))
    assert decide_question(ConsentDesk.on(home.engine, clock), QUESTION.id, Decision.DENY_ONCE, first)

    assert not decide_question(ConsentDesk.on(home.engine, clock), QUESTION.id, Decision.ALLOW_ONCE, second)

    row = store.fetch_request(QUESTION.id)
    assert row is not None and (row.decision, row.decided_by) == ("DENY_ONCE", first.name)
    (event,) = events(home, event_type)
    assert event["detail"] == {"decision": "ALLOW_ONCE", "decided_by": second.name, "recorded": False,
                               "channel": str(second.channel)}  # fmt: skip


REFUSE_DECISION_EVENTS = {
    "sqlite": [
        "CREATE TRIGGER refuse_act BEFORE INSERT ON audit_events WHEN NEW.event_type = 'APPROVER_DECISION' "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_act() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
        "CREATE TRIGGER refuse_act BEFORE INSERT ON audit_events FOR EACH ROW "
        "WHEN (NEW.event_type = 'APPROVER_DECISION') EXECUTE FUNCTION refuse_act()",
    ],
}


@on_both_engines
def test_a_decision_commits_with_its_event_or_not_at_all(tmp_path: Path, db_url: str) -> None:
    """A gateway acts on a decision as soon as it sees it: the act's event must be on record by then (it
    once came in a second transaction, and a run's TOOL_STARTED could precede it)."""
    home = GatewayHome(tmp_path, db_url=db_url)
    try:
        refused_then_decided(home)
    finally:
        home.engine.dispose()


def refused_then_decided(home: GatewayHome) -> None:
    clock = FakeClock()
    store = ConsentStore(home.engine)
    store.insert_request(dataclasses.replace(QUESTION, created_at=clock.now(), expires_at=clock.now() + 60))
    with home.engine.begin() as connection:
        for statement in REFUSE_DECISION_EVENTS[home.engine.dialect.name]:
            connection.exec_driver_sql(statement)
    approver = Actor("approvals:ada@host", Channel.APPROVER)

    with pytest.raises(StorageUnavailableError):
        decide_question(ConsentDesk.on(home.engine, clock), QUESTION.id, Decision.ALLOW_ONCE, approver)

    row = store.fetch_request(QUESTION.id)
    assert row is not None and row.status == QuestionStatus.PENDING, "no event, no decision"
    with home.engine.begin() as connection:
        connection.exec_driver_sql(
            "DROP TRIGGER refuse_act" + (" ON audit_events" if home.engine.dialect.name == "postgresql" else "")
        )
    assert decide_question(ConsentDesk.on(home.engine, clock), QUESTION.id, Decision.ALLOW_ONCE, approver)
    (event,) = events(home, "APPROVER_DECISION")
    assert event["detail"]["recorded"] is True
    assert AuditLog(home.engine, clock).verify().ok


def test_a_decision_on_an_id_no_question_can_have_is_on_record(home: GatewayHome) -> None:
    approver = Actor("approvals:ada@host", Channel.APPROVER)
    assert not decide_question(ConsentDesk.on(home.engine, FakeClock()), "../q1", Decision.ALLOW_ONCE, approver)
    (event,) = events(home, "APPROVER_DECISION")
    assert (event["run_id"], event["detail"]["recorded"]) == ("../q1", False)


def test_only_a_front_end_that_decides_questions_may_decide_one(home: GatewayHome) -> None:
    desk = ConsentDesk.on(home.engine, FakeClock())
    with pytest.raises(ValueError, match="not a front end"):
        decide_question(desk, QUESTION.id, Decision.ALLOW_ONCE, Actor("cli:ada", Channel.CLI))
    assert events(home, "APPROVER_DECISION", "CONSOLE_DECISION") == []


def revoke_through_the_cli(home: GatewayHome, clock: FakeClock, grant_id: int) -> str:
    assert cmd_consent_revoke(home.settings, argparse.Namespace(grant_id=grant_id)) == 0
    return approver_name()


def revoke_through_the_console(home: GatewayHome, clock: FakeClock, grant_id: int) -> str:
    console, cookie, csrf = console_of(home, clock)
    assert post(console, f"/grants/{grant_id}/revoke", {"csrf": csrf}, cookie) == 303
    return "console:ada"


REVOKERS: dict[str, tuple[Callable[[GatewayHome, FakeClock, int], str], str]] = {
    "cli": (revoke_through_the_cli, "cli"),
    "console": (revoke_through_the_console, "console"),
}


def a_grant(home: GatewayHome) -> int:
    grant = Grant(
        id=0, user="ada", workspace="default", server_id="mcp-write-gateway", tool_name="run_pytest",
        args_hash=None, decision=GrantDecision.DENY, fingerprint="f" * 64, granted_at=0.0, expires_at=None,
        granted_by="approvals:ada@host", channel=Channel.APPROVER,
    )  # fmt: skip
    return ConsentStore(home.engine).insert_grant(grant)


@pytest.mark.parametrize("front_end", REVOKERS)
def test_a_revocation_through_each_front_end_leaves_the_same_row_and_event(home: GatewayHome, front_end: str) -> None:
    clock = FakeClock()
    revoke, channel = REVOKERS[front_end]
    grant_id = a_grant(home)

    who = revoke(home, clock, grant_id)

    stored = ConsentStore(home.engine).fetch_grant(grant_id)
    assert stored is not None and stored.revoked_at is not None
    (event,) = events(home, "APPROVER_DECISION", "CONSOLE_DECISION", "CONSENT_REVOKED", "mcp.permission.decision")
    assert event["event_type"] == "CONSENT_REVOKED"
    assert (event["run_id"], event["user"], event["workspace"], event["tool_name"], event["args_hash"]) == (
        None, "ada", "default", "run_pytest", None,
    )  # fmt: skip
    assert event["detail"] == {"grant_id": grant_id, "decision": "DENY", "revoked_by": who, "channel": channel}


def test_the_console_finds_a_grant_by_its_id_as_its_page_links_it(home: GatewayHome) -> None:
    clock = FakeClock()
    grant_id = a_grant(home)
    console, cookie, csrf = console_of(home, clock)
    for spelling in (f"0{grant_id}", f"{grant_id}x", "٣", "9" * 30, str(grant_id + 1)):
        assert post(console, f"/grants/{spelling}/revoke", {"csrf": csrf}, cookie) == 404, spelling
    assert events(home, "CONSENT_REVOKED") == []
    assert post(console, f"/grants/{grant_id}/revoke", {"csrf": csrf}, cookie) == 303
    assert post(console, f"/grants/{grant_id}/revoke", {"csrf": csrf}, cookie) == 303, "revoked already: found"
    assert len(events(home, "CONSENT_REVOKED")) == 1, "a revoked grant is not revoked again"


def test_fetch_grant_reads_one_grant_revoked_or_not(home: GatewayHome) -> None:
    store = ConsentStore(home.engine)
    grant_id = a_grant(home)
    assert store.fetch_grant(grant_id + 1) is None
    found = store.fetch_grant(grant_id)
    assert found is not None and (found.id, found.decision, found.revoked_at) == (grant_id, GrantDecision.DENY, None)
    store.revoke_grant(grant_id, 5.0)
    revoked = store.fetch_grant(grant_id)
    assert revoked is not None and revoked.revoked_at == 5.0
