"""The list of invocations for many tools in a real Chromium against a real `mcp-gateway console`
(docs/console.md, "Invocations: the cards"): a collapsed card shows its outcome's code and reason, the tool
icon is drawn (the console's own SVG: no font, nothing from elsewhere, the CSP as strict), the filter form
and the pages back are in the URL, an older page is not live while the newest page streams only what
passes its filters, and a bad value in the URL is a 400 page."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, expect

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.calls import CardStatus, Moved, Opened, OpenRow, replace_open_connections
from gateway.clock import SystemClock
from tests.e2e.console_server import CHROMIUM, signed_in_browser
from tests.gateway.test_console_calls_list import CARDS, add_cards
from tests.harness import GatewayHome

PASSWORD = "ada-console-pw-1"
GIT_LOG = [(f"p{n:03d}", "ada", "default", "git__git_log", CardStatus.DONE, None, None) for n in range(7)]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: make chromium")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> GatewayHome:
    root = tmp_path_factory.mktemp("console-calls")
    (root / "other-workspace").mkdir()
    gateway = GatewayHome(root)
    gateway.write_policy({"workspaces": {"other": str(root / "other-workspace")}})
    gateway.users.add("ada", "ADMIN", ("default",), PASSWORD)
    add_cards(gateway, CARDS)
    add_cards(gateway, GIT_LOG)
    return gateway


@pytest.fixture(scope="module")
def ada(gw: GatewayHome) -> Iterator[BrowserContext]:
    with signed_in_browser(gw, "ada", PASSWORD, viewport={"width": 1000, "height": 800}) as context:
        yield context


def opened(ada: BrowserContext, path: str, icon_loads: list[int] | None = None) -> tuple[Page, list[str]]:
    """A page of the console, ready (its script has read the cards), with the CSP violations it reported;
    `icon_loads` gets the status of each load of the tool icon."""
    page = ada.new_page()
    refused: list[str] = []
    if icon_loads is not None:
        page.on("response", lambda r: icon_loads.append(r.status) if r.url.endswith("/static/tool.svg") else None)

    def note(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    page.on("console", note)
    page.goto(path)
    expect(page.locator("body[data-ready='1']")).to_have_count(1)
    return page, refused


def shown_runs(page: Page) -> list[str]:
    return [str(run) for run in page.locator("article.card").evaluate_all("cards => cards.map(c => c.dataset.run)")]


def test_a_collapsed_card_shows_its_code_and_reason_and_the_icon_is_drawn(ada: BrowserContext) -> None:
    icon_loads: list[int] = []
    page, refused = opened(ada, "/calls", icon_loads)
    card = page.locator("article.card[data-run='c02']")
    expect(card.locator("details.args")).not_to_have_attribute("open", "")
    expect(card.locator("details.result")).not_to_have_attribute("open", "")
    outcome = card.locator("header .outcome")
    expect(outcome).to_be_visible()
    expect(outcome).to_have_text("-32008 consent_denied")
    expect(page.locator("article.card[data-run='c04'] header .outcome")).to_have_text("-32004 tool_definition_changed")
    expect(page.locator("article.card[data-run='c01'] header .outcome")).to_be_hidden()  # done: no refusal
    icon = card.locator("header .icon")
    assert "/static/tool.svg" in icon.evaluate("i => getComputedStyle(i).backgroundImage")
    assert icon.evaluate("i => i.getBoundingClientRect().width") > 0
    assert icon.evaluate("i => i.textContent") == "", "no glyph a font might lack"
    assert icon_loads and set(icon_loads) <= {200, 304}, "the icon file is served and drawn"
    assert refused == [], refused
    page.close()


def test_the_filter_form_puts_its_values_in_the_url_and_lists_only_what_passes(ada: BrowserContext) -> None:
    page, _ = opened(ada, "/calls")
    page.fill("#f-upstream", "git")
    page.select_option("#f-outcome", "error")
    page.click("form.filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"/calls\?.*upstream=git.*outcome=error"))
    expect(page.locator("body[data-ready='1']")).to_have_count(1)
    assert shown_runs(page) == ["c04", "c02"]
    expect(page.locator("#f-upstream")).to_have_value("git")
    page.close()
    page, _ = opened(ada, "/calls?user=alice&tool=run_pytest")
    assert shown_runs(page) == ["c01"]
    page.close()


def test_pages_back_and_to_the_newest_by_the_urls_cursor(ada: BrowserContext) -> None:
    page, _ = opened(ada, "/calls?upstream=git&limit=4")
    pages = [shown_runs(page)]
    expect(page.locator("#paging a[rel=first]")).to_have_count(0)
    while page.locator("#paging a[rel=next]").count():
        page.click("#paging a[rel=next]")
        expect(page.locator("body[data-ready='1']")).to_have_count(1)
        query = parse_qs(urlsplit(page.url).query)
        assert query["upstream"] == ["git"] and query["limit"] == ["4"] and query["before"][0].isdigit()
        expect(page.locator("body[data-live]")).to_have_count(0)  # an older page: no live stream
        expect(page.locator("#live")).to_contain_text("not live")
        pages.append(shown_runs(page))
    newest = [f"p{n:03d}" for n in reversed(range(7))]
    assert [run for runs in pages for run in runs] == [*newest, "c04", "c03", "c02"]
    assert [len(runs) for runs in pages] == [4, 4, 2]
    page.click("#paging a[rel=first]")
    expect(page).to_have_url(re.compile(r"/calls\?upstream=git&limit=4$"))
    expect(page.locator("body[data-ready='1']")).to_have_count(1)
    assert shown_runs(page) == newest[:4]
    page.close()


def test_the_newest_page_streams_only_the_cards_its_filters_pass(gw: GatewayHome, ada: BrowserContext) -> None:
    page, _ = opened(ada, "/calls?upstream=fs")
    assert shown_runs(page) == ["c05"]
    add_cards(gw, [("live-run", "ada", "default", "run_pytest", CardStatus.DONE, None, None)])
    add_cards(gw, [("live-fs", "ada", "default", "fs__read_file", CardStatus.ERROR, -32603, "upstream_unavailable")])
    expect(page.locator("article.card[data-run='live-fs'] .outcome")).to_have_text("-32603 upstream_unavailable")
    assert shown_runs(page) == ["live-fs", "c05"], "the run_pytest card did not pass the filter"
    page.close()


def test_a_running_cards_connections_come_live_and_are_drawn_escaped(gw: GatewayHome, ada: BrowserContext) -> None:
    """A running card's page; a connection's NET_CONNECT is written with the card's move (as a live run's writer does,
    decision 98): the page's stream draws it under Connections, open while running, its host escaped."""
    log = AuditLog(gw.engine, SystemClock())
    now = SystemClock().now()
    opened_card = Opened("net-1", "ada", "default", "mcp-write-gateway", "fetch", {}, CardStatus.RUNNING, now)
    entry = EventDraft(EventType.MCP_TOOL_CALL, run_id="net-1", user="ada", workspace="default")
    log.append(entry, along=[opened_card])
    page, refused = opened(ada, "/calls/net-1")
    expect(page.locator("article.card[data-run='net-1'] details.connections")).to_have_count(0)
    detail = {
        "host": "origin.test", "port": 8443, "method": "CONNECT", "decision": "allowed", "rule": "allow: origin.test",
        "reason": None, "address": "127.0.0.1", "bytes_up": 1200, "bytes_down": 34567, "duration_ms": 12, "count": 1,
    }  # fmt: skip
    hostile = {**detail, "host": "evil\u202etset.example", "decision": "refused", "reason": "no_rule", "address": None}
    for connection in (detail, hostile):
        event = EventDraft(EventType.NET_CONNECT, run_id="net-1", user="ada", workspace="default", detail=connection)
        log.append(event, along=[Moved("net-1", CardStatus.RUNNING, now)])
    links = page.locator("article.card[data-run='net-1'] details.connections")
    expect(links.locator("li.connection")).to_have_count(2)
    expect(links).to_have_attribute("open", "")
    expect(links.locator("summary")).to_have_text("Connections (2)")
    expect(links.locator("li.connection.allowed")).to_contain_text("origin.test:8443 CONNECT · allowed")
    expect(links.locator("li.connection.allowed")).to_contain_text("34,567 B")
    expect(links.locator("li.connection.refused")).to_contain_text("evil\\u202etset.example:8443")
    expect(links.locator("li.connection.refused")).to_contain_text("refused (no_rule)")
    assert refused == [], refused
    page.close()


def test_a_connection_still_open_is_drawn_open_with_its_bytes_so_far_then_closed(
    gw: GatewayHome, ada: BrowserContext
) -> None:
    """A running card's page; its run's open connection is written as the live writer writes it (decision 102): the
    stream draws it open with its bytes so far, its host escaped, redraws it when its bytes move, and draws it
    closed once its row goes with its NET_CONNECT and the card's move."""
    log = AuditLog(gw.engine, SystemClock())
    now = SystemClock().now()
    opened_card = Opened("open-1", "ada", "default", "mcp-write-gateway", "fetch", {}, CardStatus.RUNNING, now)
    log.append(
        EventDraft(EventType.MCP_TOOL_CALL, run_id="open-1", user="ada", workspace="default"), along=[opened_card]
    )
    page, refused = opened(ada, "/calls/open-1")
    links = page.locator("article.card[data-run='open-1'] details.connections")
    expect(links).to_have_count(0)
    host = "evil\u202etset.example"
    row = OpenRow(1, host, 8443, "CONNECT", "127.0.0.1", "allow: *.example", 900, 262144, now)
    for down in (262144, 524288):
        with gw.engine.begin() as connection:
            replace_open_connections(connection, "open-1", "open-1", [dataclasses.replace(row, bytes_down=down)], now)
        expect(links.locator("li.connection.open")).to_contain_text(f"{down:,} B")
    expect(links).to_have_attribute("open", "")
    expect(links.locator("li.connection.open")).to_contain_text("evil\\u202etset.example:8443 CONNECT · open")
    expect(links.locator("summary")).to_have_text("Connections (1)")
    detail = {
        "host": host, "port": 8443, "method": "CONNECT", "decision": "allowed", "rule": "allow: *.example",
        "reason": None, "address": "127.0.0.1", "bytes_up": 900, "bytes_down": 600000, "duration_ms": 1500, "count": 1,
    }  # fmt: skip
    with gw.engine.begin() as connection:
        replace_open_connections(connection, "open-1", "open-1", [], now)
        event = EventDraft(EventType.NET_CONNECT, run_id="open-1", user="ada", workspace="default", detail=detail)
        log.append_within(connection, event, along=[Moved("open-1", CardStatus.RUNNING, now)])
    expect(links.locator("li.connection.allowed")).to_contain_text("600,000 B")
    expect(links.locator("li.connection.open")).to_have_count(0)
    assert refused == [], refused
    page.close()


def test_a_bad_value_in_the_url_is_a_400_page(ada: BrowserContext) -> None:
    page = ada.new_page()
    for path, why in (("/calls?limit=0", "limit must be"), ("/calls?outcome=maybe", "outcome must be one of")):
        answer = page.goto(path)
        assert answer is not None and answer.status == 400
        expect(page.get_by_role("alert")).to_contain_text(why)
    page.close()
