"""The console's routes in process (Starlette's TestClient on `build_app`), on a real database: sign-in and
its CSRF, the session's CSRF on every POST, the Origin and Host checks, the per-workspace 404, and
the decide and revoke routes with the events they leave.

What needs a browser (the pages' scripts, the live cards, CSP as enforced, keyboard, screenshots)
is tests/e2e/test_console.py (Chromium against a real `mcp-gateway console`).
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from passlib.hash import pbkdf2_sha256
from sqlalchemy import update
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from gateway import db
from gateway.audit import AuditLog
from gateway.clock import SystemClock
from gateway.consent.store import ConsentStore
from gateway.console.app import build_app
from gateway.console.serve import host_names, open_console
from gateway.runs import RunRecord, RunStore
from gateway.users import hash_password
from tests.harness import GatewayHome
from tests.memory_session import MemorySession

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
PASSWORDS = {"ada": "ada-console-pw-1", "alice": "alice-console-pw-1", "bob": "bob-console-pw-1"}
RUN = {"test_path": "tests"}
SessionFactory = Callable[..., MemorySession]


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayHome], tmp_path: Path) -> GatewayHome:
    return three_users(make_gateway, tmp_path)


def three_users(make_gateway: Callable[..., GatewayHome], tmp_path: Path) -> GatewayHome:
    """A gateway with ada (ADMIN) and alice (USER) in `default`, bob (USER) in `other`, each with a password."""
    other = tmp_path / "other-workspace"
    other.mkdir()
    gateway = make_gateway({"workspaces": {"other": str(other)}})
    for name, role, workspace in (("ada", "ADMIN", "default"), ("alice", "USER", "default"), ("bob", "USER", "other")):
        gateway.users.add(name, role, (workspace,))
        with gateway.engine.begin() as connection:
            connection.execute(
                update(db.users).where(db.users.c.name == name).values(password_hash=password_hash(PASSWORDS[name]))
            )
    return gateway


TEST_ROUNDS = 1_000
"""PBKDF2 rounds of the hashes these tests store: signing in verifies a hash at the rounds it names, and
at the gateway's 600,000 (`hash_password`) each sign-in cost about 0.13 s of CPU, most of what the console's
route tests spent (test_console_upstreams.py alone signs in about 40 times). The routes are what these tests
are about; `test_a_hash_at_the_gateways_own_rounds_signs_in` and tests/gateway/test_users.py keep the
gateway's own hashes covered, and an unknown name still costs a full-strength verification (`NO_USER_HASH`)."""


@functools.cache
def password_hash(password: str) -> str:
    """A PBKDF2-SHA256 hash of `password` at TEST_ROUNDS, made once per process, that every gateway of these
    tests (and test_console_review.py's) stores for its user. Signing in checks the password against it in full."""
    return str(pbkdf2_sha256.using(rounds=TEST_ROUNDS).hash(password))


@pytest.fixture
def app(gw: GatewayHome) -> Iterator[ASGIApp]:
    with running_app(gw) as built:
        yield built


@contextmanager
def running_app(gw: GatewayHome) -> Iterator[ASGIApp]:
    """The console as `mcp-gateway console` builds it on 127.0.0.1:8765 (plain HTTP: its own Host names only)."""
    console = open_console(gw.settings, tls=False, hosts=host_names("127.0.0.1", PORT))
    try:
        yield build_app(console)
    finally:
        console.chain.stop()
        console.stores.engine.dispose()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def signed_in(app: ASGIApp, user: str) -> TestClient:
    client = TestClient(app, base_url=BASE)
    token = csrf_of(client.get("/login").text)
    answer = client.post(
        "/login", data={"user": user, "password": PASSWORDS[user], "csrf": token}, follow_redirects=False
    )
    assert (answer.status_code, answer.headers["location"]) == (303, "/calls"), answer.text
    return client


def session_csrf(client: TestClient) -> str:
    """The session's CSRF token, as a page's forms carry it."""
    return csrf_of(client.get("/calls").text)


def events(gw: GatewayHome, kind: str) -> list[dict[str, Any]]:
    """The audit events of one type, as `audit export` prints them (read in process)."""
    return [e.to_json() for e in AuditLog(gw.engine, SystemClock()).events() if e.event_type == kind]


def wait_question(gw: GatewayHome, user: str) -> str:
    """The id of `user`'s open consent question, once the gateway has asked it."""
    store = ConsentStore(gw.engine)
    deadline = time.monotonic() + 60
    while not (mine := [q for q in store.fetch_pending(time.time()) if q.user == user]):
        assert time.monotonic() < deadline, "no consent question was asked"
        time.sleep(0.02)  # the question is a row the gateway's thread writes: nothing here to await
    return mine[0].id


# --- signing in ------------------------------------------------------------------------------------


def test_nothing_is_shown_without_signing_in(app: ASGIApp) -> None:
    client = TestClient(app, base_url=BASE)
    for path in ("/calls", "/approvals", "/grants", "/audit", "/runs"):
        answer = client.get(path, follow_redirects=False)
        assert (answer.status_code, answer.headers["location"]) == (303, "/login"), path
    assert client.get("/api/calls").status_code == 401
    refused = client.post("/approvals/x", data={"decision": "ALLOW_ONCE"}, follow_redirects=False)
    assert (refused.status_code, refused.headers["location"]) == (303, "/login")


def test_a_sign_in_needs_the_forms_token_and_the_password(gw: GatewayHome, app: ASGIApp) -> None:
    client = TestClient(app, base_url=BASE)
    form = client.get("/login")
    assert form.status_code == 200
    pre = form.headers["set-cookie"]
    assert "HttpOnly" in pre and "SameSite=strict" in pre and "Secure" not in pre  # plain HTTP on loopback
    good = {"user": "alice", "password": PASSWORDS["alice"]}
    # A sign-in POST without the form's token, and one with a forged token: 403, and nothing audited.
    assert client.post("/login", data=good).status_code == 403
    forged = client.post("/login", data=good | {"csrf": "0" * 64})
    assert forged.status_code == 403 and "CSRF" in forged.text
    token = csrf_of(form.text)
    wrong = client.post("/login", data=good | {"csrf": token, "password": "wrong password"})
    assert wrong.status_code == 401 and "Wrong user name or password." in wrong.text
    # A name that is no user is answered as a wrong password is, and is not stored: it may be a password
    # typed into the wrong field.
    unknown = client.post("/login", data={"user": "eve typed her secret", "password": "still wrong", "csrf": token})
    assert unknown.status_code == 401 and "Wrong user name or password." in unknown.text
    right = client.post("/login", data=good | {"csrf": token}, follow_redirects=False)
    assert (right.status_code, right.headers["location"]) == (303, "/calls")
    assert "HttpOnly" in right.headers["set-cookie"] and "SameSite=strict" in right.headers["set-cookie"]
    assert client.get("/calls").status_code == 200
    sign_ins = events(gw, "CONSOLE_SIGN_IN")
    assert [(e["user"], e["detail"]["ok"], e["detail"].get("reason")) for e in sign_ins] == [
        ("alice", False, "bad_credentials"),
        (None, False, "bad_credentials"),
        ("alice", True, None),
    ]
    log = json.dumps(sign_ins)
    assert "wrong password" not in log and PASSWORDS["alice"] not in log and "gw_session" not in log
    assert "eve typed her secret" not in log and "still wrong" not in log


def test_a_hash_at_the_gateways_own_rounds_signs_in(gw: GatewayHome, app: ASGIApp) -> None:
    """What `user passwd` stores (`hash_password`, 600,000 rounds) signs in with its password and no other."""
    stored = hash_password(PASSWORDS["ada"])
    assert stored.startswith("$pbkdf2-sha256$600000$")
    with gw.engine.begin() as connection:
        connection.execute(update(db.users).where(db.users.c.name == "ada").values(password_hash=stored))
    signed_in(app, "ada")
    client = TestClient(app, base_url=BASE)
    token = csrf_of(client.get("/login").text)
    wrong = client.post("/login", data={"user": "ada", "password": PASSWORDS["alice"], "csrf": token})
    assert wrong.status_code == 401


def test_five_failures_for_a_name_then_429_whatever_the_password(gw: GatewayHome, app: ASGIApp) -> None:
    """A user's name, so that the sixth attempt can bring the right password and still be refused unchecked. (An
    unknown name is limited by the same count, taken before the name is looked up; each of its failures costs a
    verification at the gateway's own rounds, 0.15 s of CPU here, and the test above shows one.)"""
    client = TestClient(app, base_url=BASE)
    token = csrf_of(client.get("/login").text)
    for _ in range(5):
        answer = client.post("/login", data={"user": "bob", "password": "still wrong", "csrf": token})
        assert answer.status_code == 401 and "Wrong user name or password." in answer.text
    limited = client.post("/login", data={"user": "bob", "password": PASSWORDS["bob"], "csrf": token})
    assert limited.status_code == 429 and "Too many failed sign-ins" in limited.text
    assert 1 <= int(limited.headers["retry-after"]) <= 3600
    sign_ins = events(gw, "CONSOLE_SIGN_IN")
    assert [(e["user"], e["detail"]["ok"], e["detail"].get("reason")) for e in sign_ins] == [
        ("bob", False, "bad_credentials")
    ] * 5 + [("bob", False, "rate_limited")]
    assert PASSWORDS["bob"] not in json.dumps(sign_ins)


# --- every POST: the session's CSRF token and the same origin; every request: our own Host -----------


def test_a_post_without_the_sessions_token_or_from_another_origin_is_403(app: ASGIApp) -> None:
    ada = signed_in(app, "ada")
    csrf = session_csrf(ada)
    refused = ada.post("/grants/1/revoke", data={})
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert ada.post("/grants/1/revoke", data={"csrf": "0" * 64}).status_code == 403
    cross = ada.post("/logout", data={"csrf": csrf}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and cross.text == "cross-origin form refused"
    assert ada.get("/calls").status_code == 200, "still signed in"
    out = ada.post("/logout", data={"csrf": csrf}, headers={"Origin": BASE}, follow_redirects=False)
    assert (out.status_code, out.headers["location"]) == (303, "/login")
    assert ada.get("/calls", follow_redirects=False).status_code == 303, "signed out"


def test_a_request_for_another_host_name_is_not_answered(app: ASGIApp) -> None:
    rebound = TestClient(app, base_url=f"http://evil.example:{PORT}")  # DNS rebinding: our address, their name
    for answer in (rebound.get("/login"), rebound.post("/login", data={})):
        assert answer.status_code == 421 and answer.text == "this console answers only to its own address"
    assert TestClient(app, base_url=f"http://localhost:{PORT}").get("/login").status_code == 200


def test_every_answer_carries_the_security_headers(app: ASGIApp) -> None:
    client = TestClient(app, base_url=BASE)
    for answer in (
        client.get("/login"),
        client.get("/calls", follow_redirects=False),
        client.get("/api/calls"),
        TestClient(app, base_url=f"http://evil.example:{PORT}").get("/login"),
    ):
        headers = answer.headers
        assert "script-src 'self'" in headers["content-security-policy"], answer.url
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"


# --- tenants, deciding and revoking --------------------------------------------------------------------


def test_another_tenants_card_and_run_are_404(gw: GatewayHome, app: ASGIApp, open_memory: SessionFactory) -> None:
    gateway = open_memory(gw)  # a client without elicitation: alice's call waits, its card in workspace default
    gateway.request_soon("tools/call", {"name": "run_pytest", "arguments": RUN, "auth": {"token": gw.token("alice")}})
    run_id = wait_question(gw, "alice")
    RunStore(gw.engine, gw.home / "artifacts").insert(  # and a run of that id, as a finished run leaves it
        RunRecord(run_id, "alice", "default", "run_pytest", time.time(), "done", 0)
    )
    bob = signed_in(app, "bob")  # workspace other
    for path in (f"/calls/{run_id}", f"/runs/{run_id}", f"/api/calls/{run_id}"):
        assert bob.get(path).status_code == 404, path
    assert bob.get("/api/calls").json()["cards"] == []
    assert run_id not in bob.get("/audit").text
    alice = signed_in(app, "alice")
    for path in (f"/calls/{run_id}", f"/runs/{run_id}", f"/api/calls/{run_id}"):
        assert alice.get(path).status_code == 200, path
    assert alice.get(f"/api/calls/{run_id}").json()["card"]["run_id"] == run_id


def test_a_question_is_decided_once_by_whoever_may_and_its_grant_revoked(
    gw: GatewayHome, app: ASGIApp, open_memory: SessionFactory
) -> None:
    gateway = open_memory(gw)  # a client without elicitation: the question waits for an approver
    waiting = gateway.request_soon(
        "tools/call", {"name": "run_pytest", "arguments": RUN, "auth": {"token": gw.token("alice")}}
    )
    question = wait_question(gw, "alice")
    alice, bob, ada = signed_in(app, "alice"), signed_in(app, "bob"), signed_in(app, "ada")
    deny_always = {"decision": "DENY_ALWAYS"}
    # alice, a USER, sees her question but may not decide it; bob, of another workspace, does not see it.
    assert "Your role lacks CONSENT_DECIDE" in alice.get("/approvals").text
    assert alice.post(f"/approvals/{question}", data=deny_always | {"csrf": session_csrf(alice)}).status_code == 403
    assert bob.post(f"/approvals/{question}", data=deny_always | {"csrf": session_csrf(bob)}).status_code == 404
    assert ada.post(f"/approvals/{question}", data=deny_always).status_code == 403  # no CSRF token
    assert ConsentStore(gw.engine).fetch_request(question).status == "pending"  # type: ignore[union-attr]
    csrf = session_csrf(ada)
    decided = ada.post(f"/approvals/{question}", data=deny_always | {"csrf": csrf}, follow_redirects=False)
    assert (decided.status_code, decided.headers["location"]) == (303, "/approvals?m=decided&d=DENY_ALWAYS")
    answer = waiting.result()
    assert answer["error"]["code"] == -32008 and answer["error"]["data"]["reason"] == "consent_denied_always"
    again = ada.post(f"/approvals/{question}", data={"decision": "ALLOW_ONCE", "csrf": csrf}, follow_redirects=False)
    assert again.headers["location"] == "/approvals?m=not_recorded", "one decision per question"
    trail = gw.events_of(question)
    decisions = [e for e in trail if e["event_type"] == "mcp.permission.decision"]
    assert [(e["detail"]["decision"], e["detail"]["decided_by"]) for e in decisions] == [("DENY_ALWAYS", "console:ada")]
    attempts = [e for e in trail if e["event_type"] == "CONSOLE_DECISION"]
    assert [(e["detail"]["decision"], e["detail"]["recorded"]) for e in attempts] == [
        ("DENY_ALWAYS", True),
        ("ALLOW_ONCE", False),
    ]
    assert all(e["user"] == "alice" and e["detail"]["decided_by"] == "console:ada" for e in attempts)

    (grant,) = ConsentStore(gw.engine).list_grants("alice")
    assert grant.decision == "DENY"
    revoke = f"/grants/{grant.id}/revoke"
    assert ada.post(revoke, data={}).status_code == 403  # no CSRF token
    assert alice.post(revoke, data={"csrf": session_csrf(alice)}).status_code == 403  # no CONSENT_DECIDE
    assert bob.post(revoke, data={"csrf": session_csrf(bob)}).status_code == 404  # not bob's workspace
    assert ada.post("/grants/999999/revoke", data={"csrf": csrf}).status_code == 404
    assert ConsentStore(gw.engine).list_grants("alice") == [grant], "still active"
    revoked = ada.post(revoke, data={"csrf": csrf}, follow_redirects=False)
    assert (revoked.status_code, revoked.headers["location"]) == (303, "/grants")
    assert ConsentStore(gw.engine).list_grants("alice") == []
    (event,) = events(gw, "CONSENT_REVOKED")
    assert event["detail"]["revoked_by"] == "console:ada" and event["detail"]["grant_id"] == grant.id
    assert event["user"] == "alice" and event["tool_name"] == "run_pytest"


def test_the_console_knows_the_policys_declared_tools(gw: GatewayHome) -> None:
    program = gw.policy_path.parent / "bin" / "lint"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    gw.write_policy({
        "sandbox": {"allowed_paths": ["bin"]},
        "tools": {"declared": {"lint": {"description": "Lint", "command": ["bin/lint", "{path}"],
                                        "arguments": {"path": {"type": "path", "default": "."}}}}},
    })  # fmt: skip
    console = open_console(gw.settings, tls=False, hosts=host_names("127.0.0.1", PORT))
    try:
        tools = signed_in(build_app(console), "alice").get("/api/tools").json()
    finally:
        console.chain.stop()
        console.stores.engine.dispose()
    assert tools["lint"]["title"] == "Lint"
    assert tools["lint"]["inputSchema"]["properties"]["path"]["default"] == "."
    assert "run_pytest" in tools
