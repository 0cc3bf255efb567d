"""The console's list of invocations for many tools (docs/console.md, "Invocations: the cards"): filters by
tool, upstream, user and outcome, keyset pages back, every bad value a clear 400 (never a 500), in process
(Starlette's TestClient on the console's app, a real database). The pages' script in Chromium:
tests/e2e/test_console_calls_browser.py."""

from __future__ import annotations

import shutil
import subprocess
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.calls import PAGE_MAX, CallQuery, CardStatus, Opened
from gateway.clock import SystemClock
from gateway.console.app import CSP
from gateway.console.views import FilterError, call_query_of, call_query_string
from tests.gateway.test_console_routes import running_app, signed_in, three_users
from tests.harness import GatewayHome
from tests.pg_cluster import on_both_engines

CARDS = [
    # run_id, user, workspace, tool, status, code, reason
    ("c01", "alice", "default", "run_pytest", CardStatus.DONE, None, None),
    ("c02", "alice", "default", "git__git_commit", CardStatus.ERROR, -32008, "consent_denied"),
    ("c03", "ada", "default", "git__git_status", CardStatus.DONE, None, None),
    ("c04", "bob", "other", "git__git_commit", CardStatus.ERROR, -32004, "tool_definition_changed"),
    ("c05", "alice", "default", "fs__write_file", CardStatus.PENDING, None, None),
    ("c06", "alice", "default", "git_x__y", CardStatus.DONE, None, None),  # not upstream git's: git_x's
    ("c07", "ada", "default", "list_artifacts", CardStatus.CANCELLED, None, None),
    ("c08", "alice", "default", "gitXX_commit", CardStatus.DONE, None, None),  # `_` is no wildcard
]


def add_cards(gw: GatewayHome, cards: list[tuple[Any, ...]]) -> None:
    log = AuditLog(gw.engine, SystemClock())
    for run_id, user, workspace, tool, status, code, reason in cards:
        card = Opened(run_id, user, workspace, "mcp-write-gateway", tool, {}, status, SystemClock().now(),
                      code=code, reason=reason)  # fmt: skip
        log.append(EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, user=user, workspace=workspace), along=[card])


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayHome], tmp_path: Path) -> GatewayHome:
    gateway = three_users(make_gateway, tmp_path)
    add_cards(gateway, CARDS)
    return gateway


@pytest.fixture
def app(gw: GatewayHome) -> Iterator[ASGIApp]:
    with running_app(gw) as built:
        yield built


def listed(client: TestClient, query: str = "") -> list[str]:
    answer = client.get("/api/calls" + (f"?{query}" if query else ""))
    assert answer.status_code == 200, answer.text
    return [card["run_id"] for card in reversed(answer.json()["cards"])]  # newest first


FILTERS = [
    ("", ["c08", "c07", "c06", "c05", "c04", "c03", "c02", "c01"]),
    ("tool=git__git_commit", ["c04", "c02"]),
    ("upstream=git", ["c04", "c03", "c02"]),
    ("upstream=git_x", ["c06"]),
    ("upstream=fs&outcome=pending", ["c05"]),
    ("user=alice", ["c08", "c06", "c05", "c02", "c01"]),
    ("outcome=error", ["c04", "c02"]),
    ("upstream=git&user=alice&outcome=error", ["c02"]),
    ("tool=&upstream=&user=&outcome=", ["c08", "c07", "c06", "c05", "c04", "c03", "c02", "c01"]),  # empty fields
    ("tool=nothing_like_it", []),
]


@on_both_engines
def test_the_filters_of_the_list(app: ASGIApp) -> None:
    ada = signed_in(app, "ada")
    for query, expected in FILTERS:
        assert listed(ada, query) == expected, query


def test_a_user_sees_only_their_workspaces_whatever_the_filter(app: ASGIApp) -> None:
    bob = signed_in(app, "bob")
    assert listed(bob, "upstream=git") == ["c04"]
    assert listed(bob, "user=alice") == []


@on_both_engines
def test_pages_back_by_keyset_cover_every_card_once(gw: GatewayHome, app: ASGIApp) -> None:
    add_cards(gw, [(f"p{n:03d}", "alice", "default", "git__git_log", CardStatus.DONE, None, None) for n in range(23)])
    ada = signed_in(app, "ada")
    seen: list[str] = []
    query = "upstream=git&limit=5"
    pages = 0
    while True:
        answer = ada.get(f"/api/calls?{query}").json()
        page = [card["run_id"] for card in reversed(answer["cards"])]
        assert 0 < len(page) <= 5
        seen += page
        pages += 1
        if answer["older"] is None:
            break
        query = f"upstream=git&limit=5&before={answer['older']}"
    expected = [f"p{n:03d}" for n in reversed(range(23))] + ["c04", "c03", "c02"]
    assert seen == expected, "newest first, each card once, none left out"
    assert pages == 6


def test_the_page_carries_its_checked_query_and_an_older_page_is_not_live(app: ASGIApp) -> None:
    ada = signed_in(app, "ada")
    page = ada.get("/calls?outcome=error&upstream=git&tool=").text
    assert 'data-query="upstream=git&amp;outcome=error"' in page
    assert 'name="upstream" value="git"' in page and '<option value="error" selected>' in page
    assert 'data-live="1"' in page
    older = ada.get("/calls?upstream=git&before=3").text
    assert 'data-live="1"' not in older and 'data-filters="upstream=git"' in older


BAD = [
    ("outcome=broken", "outcome must be one of pending, running, reviewing, done, error, cancelled"),
    ("limit=0", "limit must be a whole number from 1 to 200"),
    (f"limit={PAGE_MAX + 1}", "limit must be a whole number from 1 to 200, not 201"),
    ("limit=ten", "limit must be a whole number from 1 to 200"),
    ("before=-1", "before must be a card cursor"),
    ("before=1e9", "before must be a card cursor"),
    ("before=" + "9" * 40, "before must be a card cursor"),
    ("tool=run%20pytest", "tool must be a tool name"),
    ("tool=" + "x" * 129, "tool must be a tool name"),
    ("upstream=git__x", "upstream must be an upstream's name"),
    (
        "upstream=%E2%80%AEgit",
        "upstream must be an upstream's name (letters, digits, - and single _; at most 64), not '\\u202egit'",
    ),
    ("user=%0Aalice", "user must be a user name"),
    ("user=" + "a" * 65, "user must be a user name of at most 64 characters"),
    ("tool=a&tool=b", "tool is given twice"),
    ("sort=newest", "unknown parameter 'sort'"),
]


def test_a_bad_filter_or_paging_value_is_a_clear_400(app: ASGIApp) -> None:
    ada = signed_in(app, "ada")
    for query, why in BAD:
        api = ada.get(f"/api/calls?{query}")
        assert api.status_code == 400 and why in api.json()["error"], (query, api.text)
        page = ada.get(f"/calls?{query}")
        assert page.status_code == 400 and "This list cannot be shown" in page.text, (query, page.text)
        assert page.headers["content-security-policy"] == CSP
        stream = ada.get(f"/api/stream?after=1&{query}")
        assert stream.status_code == 400 and why in stream.json()["error"], (query, stream.text)


def test_the_stream_takes_its_own_keys_besides_the_filters() -> None:
    query = call_query_of([("after", "5"), ("run", "x"), ("upstream", "git")], extra=("after", "run"))
    assert query == CallQuery(upstream="git")
    with pytest.raises(FilterError, match="unknown parameter 'after'"):
        call_query_of([("after", "5")])


def test_the_query_string_round_trips() -> None:
    query = CallQuery(tool="a.b", upstream="git", user="ada lovelace", status=CardStatus.ERROR, before=9, limit=20)
    assert call_query_of(_items(call_query_string(query))) == query
    assert call_query_string(CallQuery()) == ""


def _items(query: str) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(query, keep_blank_values=True)


def test_the_tool_icon_is_the_consoles_own_file(app: ASGIApp) -> None:
    ada = signed_in(app, "ada")
    icon = ada.get("/static/tool.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.headers["content-security-policy"] == CSP
    assert "<script" not in icon.text and "href" not in icon.text
    assert "img-src 'self' data:;" in CSP and "font-src" not in CSP, "no web font, nothing from elsewhere"


CONSOLE = Path(__file__).resolve().parents[2] / "gateway" / "console"


@pytest.mark.skipif(shutil.which("fc-list") is None, reason="needs fontconfig's fc-list (it comes with chromium)")
def test_every_symbol_the_console_draws_has_a_glyph_in_an_installed_font() -> None:
    """The class of the missing tool icon: a symbol of the console's own (a badge's, a chip's) that no installed
    font has is drawn as an empty box. Emoji need a colour emoji font that a server seldom has."""
    sources = [CONSOLE / "static" / "console.js", *CONSOLE.glob("*.py")]
    symbols = sorted(
        {ch for path in sources for ch in path.read_text() if ord(ch) > 0x7F and unicodedata.category(ch)[0] == "S"}
    )
    assert symbols, "the scan found the console's symbols"
    fc_list = str(shutil.which("fc-list"))
    missing = [
        f"U+{ord(ch):04X} {ch}"
        for ch in symbols
        if not subprocess.run(
            [fc_list, f":charset={ord(ch):x}", "family"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
    ]
    assert missing == [], f"no installed font draws {missing}: use a symbol DejaVu has, or an SVG of the console's own"
