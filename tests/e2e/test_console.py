"""The web console in a real Chromium (Debian's `chromium`, driven by Playwright; `make chromium`), against
a real `mcp-gateway console` and real `serve` sessions sharing one database.

One console, one browser and one gateway serve the whole module. The cards' behaviour on real
cards (docs/console.md, "Invocations: the cards"), approvals decided in the browser
(allow runs the waiting call; deny; timeout; a race with the terminal approver: one decision),
grants revoked, another tenant's card and run a 404, CSRF-less and cross-origin posts and bad
sign-ins refused, the pages' accessibility, and a screenshot of each page (into a temp folder;
UPDATE_SCREENSHOTS=1: into docs/console/).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright
from sqlalchemy import select

from gateway import db
from gateway.audit import AuditLog, EventDraft, EventType
from gateway.calls import CardStatus, Opened
from gateway.clock import SystemClock
from gateway.console.app import REPLAY_MAX
from tests.deadlines import scaled
from tests.e2e.console_server import CHROMIUM, CHROMIUM_ARGS, START_S, free_port, running_console, stop
from tests.harness import GatewayHome, StdioSession, as_approver

DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
UPDATE_SCREENSHOTS = os.environ.get("UPDATE_SCREENSHOTS") == "1"
"""The screenshots go to the test's temp folder, so a run leaves the tree clean; `UPDATE_SCREENSHOTS=1`
writes them into docs/console/ instead, to refresh the pictures docs/console.md shows."""
PASSWORDS = {"ada": "ada-console-pw-1", "alice": "alice-console-pw-1", "bob": "bob-console-pw-1"}
RUN = {"test_path": "tests"}

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: make chromium")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> GatewayHome:
    root = tmp_path_factory.mktemp("console")
    other = root / "other-workspace"
    other.mkdir()
    gateway = GatewayHome(root, {"consent": {"timeout_s": 20}})
    gateway.write_policy({"consent": {"timeout_s": 20}, "workspaces": {"other": str(other)}})
    gateway.users.add("ada", "ADMIN", ("default",), PASSWORDS["ada"])
    gateway.users.add("alice", "USER", ("default",), PASSWORDS["alice"])
    gateway.users.add("bob", "USER", ("other",), PASSWORDS["bob"])
    return gateway


@pytest.fixture(scope="module")
def console(gw: GatewayHome) -> Iterator[str]:
    with running_console(gw) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = launch(p)
        yield chromium
        chromium.close()


def launch(p: Playwright) -> Browser:
    # Playwright gives each launch a fresh profile folder (--user-data-dir) of its own.
    return p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def serve(gw: GatewayHome) -> Iterator[StdioSession]:
    """A client without elicitation: its consent questions wait for an approver (the console here)."""
    session = StdioSession(gw)
    try:  # stopped when it fails to start too
        assert "result" in session.initialize()
        yield session
    finally:
        session.close()


def signed_in(browser: Browser, console: str, user: str, **options: Any) -> BrowserContext:
    context = browser.new_context(base_url=console, viewport={"width": 1000, "height": 800}, **options)
    page = context.new_page()
    page.goto("/login")
    page.fill("#user", user)
    page.fill("#password", PASSWORDS[user])
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/calls$"))
    page.close()
    return context


@pytest.fixture(scope="module")
def ada(browser: Browser, console: str) -> Iterator[BrowserContext]:
    context = signed_in(browser, console, "ada", permissions=["clipboard-read", "clipboard-write"])
    yield context
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if UPDATE_SCREENSHOTS:
        DOCS_SHOTS.mkdir(exist_ok=True)
        return DOCS_SHOTS
    return tmp_path_factory.mktemp("screenshots")


def shot(folder: Path, page: Page, name: str) -> None:
    page.screenshot(path=str(folder / f"{name}.png"))


def rows(gw: GatewayHome, table: Any, **where: Any) -> list[dict[str, Any]]:
    query = select(table)
    for column, value in where.items():
        query = query.where(table.c[column] == value)
    with gw.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(query)]


def wait_question(gw: GatewayHome, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = rows(gw, db.consent_requests, status="pending")
        if pending:
            return pending[-1]
        time.sleep(0.05)
    raise AssertionError("no consent question was asked")


HISTORY = """() => {
  window.__history = {};
  const note = (card) => {
    const run = card.dataset.run, status = card.dataset.status;
    const seen = window.__history[run] || (window.__history[run] = []);
    if (status && seen[seen.length - 1] !== status) seen.push(status);
  };
  document.querySelectorAll('article.card').forEach(note);
  new MutationObserver((changes) => changes.forEach((c) => {
    const card = c.target.closest && c.target.closest('article.card');
    if (card) note(card);
    c.addedNodes.forEach((n) => { if (n.matches && n.matches('article.card')) note(n); });
  })).observe(document.getElementById('cards'), {subtree: true, childList: true, attributes: true, attributeFilter: ['data-status']});
}"""


# --- sign-in and the refusals ----------------------------------------------------------------------


def test_sign_in_refusals_csrf_origin_host_and_rate_limit(gw: GatewayHome, console: str, browser: Browser) -> None:
    context = browser.new_context(base_url=console)
    page = context.new_page()
    page.goto("/calls")
    expect(page).to_have_url(re.compile(r"/login$"))  # nothing without signing in
    page.fill("#user", "alice")
    page.fill("#password", "wrong password")
    page.click("button[type=submit]")
    expect(page.get_by_role("alert")).to_have_text("Wrong user name or password.")
    # The route-level refusals (CSRF 403 at sign-in and on every POST, Origin 403, Host 421) are
    # tests/gateway/test_console_routes.py; here, what a person sees.
    ada = signed_in(browser, console, "ada")
    # A request for another host name (DNS rebinding) is not answered, by the real server either.
    port = console.rsplit(":", 1)[1]
    rebound = urllib.request.Request(console + "/login", headers={"Host": f"evil.example:{port}"})  # noqa: S310
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(rebound)  # noqa: S310  (the console's own http URL)
    assert refused.value.code == 421
    refused.value.close()
    # Five failures for a name, then 429 whatever the password (a name that is no user: not stored).
    for _ in range(5):
        page.fill("#user", "eve")
        page.fill("#password", "still wrong")
        page.click("button[type=submit]")
        expect(page.get_by_role("alert")).to_have_text("Wrong user name or password.")
    page.fill("#user", "eve")
    page.fill("#password", "maybe this one")
    with page.expect_response(lambda r: r.url.endswith("/login") and r.request.method == "POST") as answer:
        page.click("button[type=submit]")
    assert answer.value.status == 429
    expect(page.get_by_role("alert")).to_contain_text("Too many failed sign-ins")
    events = [e for e in gw.audit_events() if e["event_type"] == "CONSOLE_SIGN_IN"]
    assert [e["detail"]["ok"] for e in events].count(False) == 7
    assert {e["user"] for e in events if not e["detail"]["ok"]} == {"alice", None}
    assert {e["detail"].get("reason") for e in events if not e["detail"]["ok"]} == {"bad_credentials", "rate_limited"}
    assert any(e["detail"]["ok"] and e["user"] == "ada" for e in events)
    log = json.dumps(gw.audit_events())
    assert "wrong password" not in log and PASSWORDS["alice"] not in log and "gw_session" not in log
    ada.close()
    context.close()


# --- approvals in the browser and the live cards ----------------------------------------------------


def test_allow_once_in_the_browser_runs_the_waiting_call_and_its_card_goes_live(
    gw: GatewayHome, console: str, ada: BrowserContext, serve: StdioSession, shots: Path
) -> None:
    cards = ada.new_page()
    cards.goto("/calls")
    cards.wait_for_selector("body[data-ready='1']")
    cards.evaluate(HISTORY)
    call = serve.send_call("run_pytest", RUN, gw.token("alice"))
    question = wait_question(gw)
    run_id = question["id"]
    card = cards.locator(f"article.card[data-run='{run_id}']")
    # The card mounts pending, its tool name visible, its arguments collapsed.
    expect(card).to_have_attribute("data-status", "pending")
    expect(card.get_by_role("heading")).to_have_text("run_pytest")
    expect(card).to_have_attribute("role", "region")
    expect(card).to_have_attribute("aria-label", "Tool invocation: run_pytest")
    expect(card.locator("details.args pre.raw")).not_to_be_visible()
    # The Arguments summary opens them and closes them again; the form view is read-only and schema-driven.
    card.locator("details.args summary").click()
    expect(card.locator("details.args pre.raw")).to_contain_text('"test_path": "tests"')
    card.get_by_role("button", name="Form view").click()
    field = card.locator("form.form-view input[readonly]").first
    expect(field).to_have_value("tests")
    expect(card.locator("form.form-view label").first).to_have_text("test_path *")
    # Copy gives the whole arguments.
    card.get_by_role("button", name="Copy arguments").click()
    assert json.loads(cards.evaluate("navigator.clipboard.readText()")) == {"test_path": "tests"}
    card.locator("details.args summary").click()
    expect(card.locator("details.args form.form-view")).not_to_be_visible()
    card.locator("header p.origin").click()  # the header opens and closes them too
    expect(card.locator("details.args")).to_have_attribute("open", "")
    card.locator("header p.origin").click()
    expect(card.locator("details.args")).not_to_have_attribute("open", "")

    approvals = ada.new_page()
    approvals.goto("/approvals")
    block = approvals.locator(f"article.question[data-id='{run_id}']")
    expect(block).to_have_attribute("role", "region")
    expect(block.get_by_role("heading")).to_contain_text("Allow this tool to run? run_pytest")
    expect(block).to_contain_text("Requested by alice in workspace default")
    expect(block.locator("pre.preview")).to_have_text('test_path: "tests"')
    expect(block.locator(".countdown")).to_contain_text("Answer within")
    labels = block.locator("form.choices button").all_inner_texts()
    assert labels == ["Allow once", "Allow always", "Deny once", "Deny always", "Allow for this session"]
    # Keyboard: the default (Allow once: least commitment) has the focus.
    expect(block.get_by_role("button", name="Allow once")).to_be_focused()
    shot(shots, approvals, "approvals")
    approvals.keyboard.press("Enter")
    expect(approvals.get_by_role("status").first).to_have_text("Recorded: Allow once.")

    answer = serve.wait_response(call, timeout=60)
    assert "result" in answer, answer
    # pending -> running -> done, then the result (auto-expanded) with the artifacts as resource links.
    expect(card).to_have_attribute("data-status", "done", timeout=15000)
    history = cards.evaluate(f"window.__history['{run_id}']")
    assert history == ["pending", "running", "done"], history
    expect(card.locator(".badge")).to_have_text("✓ Done")
    expect(card.locator("details.result")).to_have_attribute("open", "")
    links = card.locator("a.chip.link")
    expect(links.first).to_be_visible()
    assert f"/runs/{run_id}/files/" in str(links.first.get_attribute("href"))
    decided = rows(gw, db.consent_requests, id=run_id)[0]
    assert (decided["decision"], decided["decided_by"]) == ("ALLOW_ONCE", "console:ada")
    (console_event,) = [e for e in gw.events_of(run_id) if e["event_type"] == "CONSOLE_DECISION"]
    assert console_event["detail"]["recorded"] is True
    (decision,) = [e for e in gw.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]
    assert decision["detail"]["decided_by"] == "console:ada"
    shot(shots, cards, "calls")
    # The card's own page, and a run's page with its evidence.
    single = ada.new_page()
    single.goto(f"/runs/{run_id}")
    expect(single.locator("details").first).to_contain_text("evidence.json")
    expect(single.locator("dl.governance")).to_contain_text("attempts_total")
    shot(shots, single, "run")
    for page in (cards, approvals, single):
        page.close()


def test_deny_in_the_browser_and_escape(gw: GatewayHome, ada: BrowserContext, serve: StdioSession) -> None:
    call = serve.send_call("run_pytest", RUN, gw.token("alice"))
    run_id = wait_question(gw)["id"]
    page = ada.new_page()
    page.goto("/approvals")
    block = page.locator(f"article.question[data-id='{run_id}']")
    expect(block).to_be_visible()
    page.keyboard.press("Escape")  # Esc is Deny once, as at the terminal
    expect(page.get_by_role("status").first).to_have_text("Recorded: Deny once.")
    answer = serve.wait_response(call, timeout=30)
    assert answer["error"]["code"] == -32008, answer
    cards = ada.new_page()
    cards.goto(f"/calls/{run_id}")
    card = cards.locator(f"article.card[data-run='{run_id}']")
    expect(card).to_have_attribute("data-status", "error")
    expect(card.locator(".refusal")).to_contain_text("Refused -32008 (consent_denied)")
    expect(card.locator("details.result")).not_to_have_attribute("open", "")  # collapsed on error
    page.close()
    cards.close()


def test_a_race_with_the_terminal_approver_records_one_decision(
    gw: GatewayHome, ada: BrowserContext, serve: StdioSession
) -> None:
    call = serve.send_call("run_pytest", RUN, gw.token("alice"))
    run_id = wait_question(gw)["id"]
    page = ada.new_page()
    page.goto("/approvals")
    deny = page.locator(f"article.question[data-id='{run_id}']").get_by_role("button", name="Deny once")
    expect(deny).to_be_visible()
    # The page follows the questions every 1.5 s; hold it still, as a person's page that has not
    # reloaded yet: the terminal's decision must not take the button away before the click.
    page.evaluate("() => { window.fetch = () => new Promise(() => {}); }")
    argv = gw.cli_argv("approvals")
    terminal = as_approver(pexpect.spawn(argv[0], argv[1:], encoding="utf-8", timeout=30, dimensions=(50, 200)))
    try:
        terminal.expect("consent request")
        terminal.send("1")  # allow once at the terminal ...
        deny.click()  # ... and deny once in the browser, at once
        terminal.expect(r"-> (ALLOW_ONCE|not recorded)")
    finally:
        terminal.terminate(force=True)
    answer = serve.wait_response(call, timeout=60)
    row = rows(gw, db.consent_requests, id=run_id)[0]
    decisions = [e for e in gw.events_of(run_id) if e["event_type"] == "mcp.permission.decision"]
    assert len(decisions) == 1
    (attempt,) = [e for e in gw.events_of(run_id) if e["event_type"] == "CONSOLE_DECISION"]
    if row["decided_by"] == "console:ada":
        assert row["decision"] == "DENY_ONCE" and attempt["detail"]["recorded"] is True
        assert answer["error"]["code"] == -32008
    else:
        assert row["decided_by"].startswith("approvals:") and row["decision"] == "ALLOW_ONCE"
        assert attempt["detail"]["recorded"] is False
        expect(page.get_by_role("status").first).to_contain_text("Not recorded")
        assert "result" in answer
    page.close()


def test_an_unanswered_question_times_out(gw: GatewayHome, ada: BrowserContext, serve: StdioSession) -> None:
    gw.write_policy({"consent": {"timeout_s": 2}, "workspaces": {"other": str(gw.root / "other-workspace")}})
    quick = StdioSession(gw)
    try:
        assert "result" in quick.initialize()
        call = quick.send_call("run_pytest", RUN, gw.token("alice"))
        run_id = wait_question(gw)["id"]
        page = ada.new_page()
        page.goto("/approvals")
        expect(page.locator(f"article.question[data-id='{run_id}']")).to_be_visible()
        answer = quick.wait_response(call, timeout=30)
        assert answer["error"]["code"] == -32008 and answer["error"]["data"]["reason"] == "consent_timeout"
        expect(page.locator(f"article.question[data-id='{run_id}']")).to_have_count(0, timeout=10000)
        page.goto(f"/calls/{run_id}")
        expect(page.locator("article.card .refusal")).to_contain_text("consent_timeout")
        page.close()
    finally:
        quick.close()
        gw.write_policy({"consent": {"timeout_s": 20}, "workspaces": {"other": str(gw.root / "other-workspace")}})


# --- tenants ---------------------------------------------------------------------------------------


def test_another_tenants_card_and_run_are_404_and_a_user_cannot_decide(
    gw: GatewayHome, console: str, browser: Browser, serve: StdioSession
) -> None:
    alice_run = rows(gw, db.tool_calls, user_name="alice")[0]["run_id"]
    bob = signed_in(browser, console, "bob")
    page = bob.new_page()
    for path in (f"/calls/{alice_run}", f"/runs/{alice_run}", f"/api/calls/{alice_run}"):
        assert page.goto(path).status == 404, path  # type: ignore[union-attr]
    page.goto("/calls")
    page.wait_for_selector("body[data-ready='1']")
    expect(page.locator("article.card")).to_have_count(0)
    expect(page.locator("#empty")).to_be_visible()
    page.goto("/audit")
    expect(page.locator(f"tr:has-text('{alice_run}')")).to_have_count(0)
    bob.close()
    # alice, a USER: her own cards, and her questions shown without the buttons (no CONSENT_DECIDE).
    alice = signed_in(browser, console, "alice")
    page = alice.new_page()
    assert page.goto(f"/calls/{alice_run}").status == 200  # type: ignore[union-attr]
    call = serve.send_call("run_pytest", RUN, gw.token("alice"))
    run_id = wait_question(gw)["id"]
    page.goto("/approvals")
    block = page.locator(f"article.question[data-id='{run_id}']")
    expect(block).to_contain_text("Your role lacks CONSENT_DECIDE")
    expect(block.locator("button")).to_have_count(0)
    # Her POST to decide is refused (403): tests/gateway/test_console_routes.py.
    alice.close()
    # The question is left to expire? No: deny it as ada so the session is free for the next test.
    ada = signed_in(browser, console, "ada")
    deny_page = ada.new_page()
    deny_page.goto("/approvals")
    deny_page.locator(f"article.question[data-id='{run_id}']").get_by_role("button", name="Deny always").click()
    expect(deny_page.get_by_role("status").first).to_have_text("Recorded: Deny always.")
    assert serve.wait_response(call, timeout=30)["error"]["code"] == -32008
    ada.close()


# --- grants ------------------------------------------------------------------------------------------


def test_grants_list_filter_and_revoke(gw: GatewayHome, ada: BrowserContext, shots: Path) -> None:
    page = ada.new_page()
    page.goto("/grants?user=alice&tool=run_pytest")
    row = page.locator("tr[data-state='active']").first
    expect(row).to_contain_text("DENY")
    grant_id = row.get_attribute("data-grant")
    shot(shots, page, "grants")
    row.get_by_role("button", name=re.compile("Revoke")).click()
    expect(page.locator(f"tr[data-grant='{grant_id}']")).to_have_attribute("data-state", "revoked")
    page.goto("/grants?state=active&user=alice")
    expect(page.locator(f"tr[data-grant='{grant_id}']")).to_have_count(0)
    (event,) = [e for e in gw.audit_events() if e["event_type"] == "CONSENT_REVOKED"]
    assert event["detail"]["revoked_by"] == "console:ada" and event["detail"]["grant_id"] == int(str(grant_id))
    page.close()


# --- the four content types and truncation ------------------------------------------------------------


PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5d6ad3c0000000049454e44ae426082"
    )
).decode()


def test_each_content_type_and_truncation(gw: GatewayHome, ada: BrowserContext, shots: Path) -> None:
    long_text = "\n".join(f"line {i:03d} " + "x" * 60 for i in range(80))
    result: list[dict[str, Any]] = [
        {"type": "text", "text": long_text},
        {"type": "image", "mimeType": "image/png", "data": PNG},
        {"type": "resource_link", "uri": "mcp-gateway://runs/r-demo/stdout.txt", "name": "stdout.txt"},
        {
            "type": "resource",
            "resource": {"uri": "file:///notes.md", "mimeType": "text/markdown", "text": "# notes <b>x</b>"},
        },
        {"type": "text", "text": "<img src=x onerror=alert(1)>"},
    ]
    card = Opened("r-content-types", "alice", "default", "mcp-write-gateway", "list_artifacts", {"limit": 3}, CardStatus.DONE,
                  SystemClock().now(), result=result)  # fmt: skip
    AuditLog(gw.engine, SystemClock()).append(
        EventDraft(EventType.TOOL_FINISHED, run_id="r-content-types"), along=[card]
    )
    page = ada.new_page()
    page.goto("/calls/r-content-types")
    article = page.locator("article.card[data-run='r-content-types']")
    blocks = article.locator("details.result > .block")
    expect(blocks).to_have_count(5)
    image = article.locator("img.thumb")
    expect(image).to_have_attribute("src", f"data:image/png;base64,{PNG}")
    article.get_by_role("button", name="Show the image at full size").click()
    expect(image).to_have_class(re.compile("full"))
    expect(article.locator("a.chip.link")).to_have_attribute("href", "/runs/r-demo/files/stdout.txt")
    expect(article.locator(".resource-block pre")).to_have_text("# notes <b>x</b>")  # text, not markup
    expect(blocks.nth(4).locator("pre")).to_have_text("<img src=x onerror=alert(1)>")
    assert page.locator("img").count() == 1  # the hostile text made no element
    # Over 30 lines: clipped, Show more opens the whole, which was in the DOM all along.
    first = blocks.nth(0)
    pre = first.locator("pre")
    expect(pre).to_have_class(re.compile("clipped"))
    clipped = pre.evaluate("e => e.clientHeight")
    assert pre.evaluate("e => e.scrollHeight") > clipped
    first.get_by_role("button", name="Show more").click()
    expect(pre).not_to_have_class(re.compile("clipped"))
    assert pre.evaluate("e => e.clientHeight") > clipped
    expect(first.get_by_role("button", name="Show less")).to_have_attribute("aria-expanded", "true")
    # Copy gives the whole text, whatever is shown.
    first.get_by_role("button", name="Show less").click()
    first.get_by_role("button", name="Copy full result").click()
    assert page.evaluate("navigator.clipboard.readText()") == long_text
    page.evaluate("() => window.scrollTo(0, 0)")
    shot(shots, page, "card")
    page.close()


# --- accessibility -------------------------------------------------------------------------------------


def test_status_is_announced_and_reduced_motion_stops_the_dot(browser: Browser, console: str, gw: GatewayHome) -> None:
    for motion, animation in (("no-preference", "breathe"), ("reduce", "none")):
        context = signed_in(browser, console, "ada", reduced_motion=motion)
        page = context.new_page()
        page.goto("/calls/r-content-types")
        badge = page.locator("article.card .badge")
        expect(badge).to_have_attribute("aria-live", "polite")
        expect(badge).to_have_attribute("role", "status")
        page.evaluate("document.querySelector('article.card').dataset.status = 'running';"
                      "document.querySelector('article.card .badge').dataset.status = 'running'")  # fmt: skip
        assert page.locator(".badge .dot").evaluate("e => getComputedStyle(e).animationName") == animation
        expect(page.get_by_role("navigation")).to_be_visible()
        expect(page.locator("#cards")).to_have_attribute("role", "feed")
        context.close()


# --- audit, runs, language ------------------------------------------------------------------------------


def test_audit_filters_keyset_pages_export_and_chain(gw: GatewayHome, ada: BrowserContext, shots: Path) -> None:
    log = AuditLog(gw.engine, SystemClock())
    log.append(*[EventDraft(EventType.TOKEN_ISSUED, user="alice", detail={"n": i}) for i in range(70)])
    page = ada.new_page()
    page.goto("/audit?event_type=TOKEN_ISSUED")
    # The chain is checked in the background every 2 s: within a few, the page names the newest event.
    intact = f"Hash chain intact: {log.head().last_id} events verified"
    deadline = time.monotonic() + 15
    while intact not in page.locator("p.chain").inner_text():
        assert time.monotonic() < deadline, page.locator("p.chain").inner_text()
        time.sleep(0.5)
        page.reload()
    expect(page.locator("tbody tr")).to_have_count(50)
    newest = int(str(page.locator("tbody tr").first.get_attribute("data-event")))
    shot(shots, page, "audit")
    page.get_by_role("link", name="Older events").click()
    expect(page.locator("tbody tr")).to_have_count(20)
    assert int(str(page.locator("tbody tr").first.get_attribute("data-event"))) < newest
    exported = ada.request.get("/audit/export.jsonl?event_type=TOKEN_ISSUED&user=alice").text().splitlines()
    events = [json.loads(line) for line in exported]
    assert len(events) == 70 and {e["event_type"] for e in events} == {"TOKEN_ISSUED"}
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    page.goto("/runs")
    expect(page.locator("tbody tr").first).to_be_visible()
    shot(shots, page, "runs")
    page.close()


def test_language_from_the_browser_and_the_switch(browser: Browser, console: str, shots: Path) -> None:
    context = browser.new_context(base_url=console, locale="pt-BR")
    page = context.new_page()
    page.goto("/login")
    expect(page.get_by_role("heading", level=1)).to_have_text("Entrar")
    page.fill("#user", "ada")
    page.fill("#password", PASSWORDS["ada"])
    page.click("button[type=submit]")
    page.goto("/approvals")
    expect(page.get_by_role("heading", level=1)).to_have_text("Aprovações")
    shot(shots, page, "approvals-pt-BR")
    page.get_by_role("link", name="en-US").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Approvals")
    context.close()


def test_the_live_stream_ends_when_its_session_does(browser: Browser, console: str) -> None:
    import http.client

    context = signed_in(browser, console, "ada")
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in context.cookies())
    host, port = console.removeprefix("http://").split(":")
    stream = http.client.HTTPConnection(host, int(port), timeout=30)
    stream.request("GET", "/api/stream?after=0", headers={"Cookie": cookie})
    answer = stream.getresponse()
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/event-stream")
    page = context.new_page()
    page.goto("/calls")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    started = time.monotonic()
    while answer.readline():  # read until the console closes the stream
        assert time.monotonic() - started < 20, "the stream outlived its session"
    answer.close()
    stream.close()
    context.close()


def test_a_page_far_behind_its_stream_reloads(gw: GatewayHome, ada: BrowserContext) -> None:
    """A stream more than REPLAY_MAX cards behind is told to reload, and the page does (once)."""
    log = AuditLog(gw.engine, SystemClock())
    now = SystemClock().now()
    for n in range(REPLAY_MAX + 10):
        run_id = f"behind-{n:04d}"
        card = Opened(run_id, "ada", "default", "mcp-write-gateway", "list_artifacts", {}, CardStatus.DONE, now)
        log.append(EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, user="ada", workspace="default"), along=[card])
    page = ada.new_page()
    # The first read of the page says it saw nothing yet (head 0): its stream starts 210 cards behind.
    page.route("**/api/calls", lambda route: route.fulfill(json={"cards": [], "head": 0}), times=1)
    loads: list[str] = []
    page.on("load", lambda loaded: loads.append(loaded.url))
    page.goto("/calls")
    # The stream's `reload`: the page loads again, reads the newest cards and the head, and stays.
    expect(page.locator("article.card[data-run='behind-0209']")).to_have_count(1, timeout=30000)
    assert len(loads) == 2, loads
    page.wait_for_timeout(1500)  # a few polls of the new stream: no second reload
    assert len(loads) == 2, loads
    page.close()


def test_the_console_refuses_a_network_interface_without_tls(gw: GatewayHome) -> None:
    result = gw.cli("console", "--host", "0.0.0.0", "--port", str(free_port()))  # noqa: S104  (refused: the point)
    assert result.returncode == 1
    assert "without TLS" in result.stderr and "--tls-cert" in result.stderr


def test_under_tls_the_cookie_is_secure(gw: GatewayHome) -> None:
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "console.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = gw.root / "cert.pem", gw.root / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    port = free_port()
    argv = gw.cli_argv("console", "--port", str(port), "--tls-cert", str(cert_path), "--tls-key", str(key_path))
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # our own self-signed certificate
    try:
        deadline = time.monotonic() + scaled(START_S)
        while True:
            try:
                answer = urllib.request.urlopen(f"https://127.0.0.1:{port}/login", context=context, timeout=2)
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
        with answer:
            cookie = answer.headers["Set-Cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    finally:
        stop(process)


def test_user_passwd_reads_stdin_and_is_audited(gw: GatewayHome) -> None:
    result = gw.cli("user", "passwd", "bob", stdin="a-new-one\n")
    assert result.returncode == 0, result.stderr
    stored = gw.users.fetch_password_hash("bob")
    assert stored is not None and "a-new-one" not in stored
    assert gw.cli("user", "passwd", "nobody", stdin="x\n").returncode == 1
    events = [e for e in gw.audit_events() if e["event_type"] == "USER_PASSWORD_SET"]
    assert [e["user"] for e in events] == ["bob"] and "a-new-one" not in json.dumps(events)
    PASSWORDS["bob"] = "a-new-one"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
