"""The console's upstream page and its accept route in process (Starlette's TestClient on `build_app`), on a
real database, both engines (decision 85): the pins' states, a changed definition's diff escaped, Accept
for an ADMIN only, the form's CSRF, the digest the form showed, the event with the console actor.

Chromium against a real console: tests/e2e/test_console_upstreams_browser.py."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from gateway.audit import AuditLog
from gateway.clock import SystemClock
from gateway.console.app import build_app
from gateway.console.serve import host_names, open_console
from gateway.console.upstreams import MAX_DIFFS, tool_field, tool_of_field
from gateway.upstreams.pins import PinState, PinStore
from tests.e2e.test_upstreams import OFFERED, install_server, upstream_policy
from tests.gateway.test_console_routes import PORT, session_csrf, signed_in, three_users
from tests.harness import GatewayHome

HOSTILE = "\u202eevil\u2066\x1b[2J<b>x</b>\r\n"
"""Bidi override and isolate, a terminal escape, markup, a CR LF: in a name and a description."""


@pytest.fixture
def gw(make_gateway: Callable[..., GatewayHome], tmp_path: Path, db_url: str) -> GatewayHome:
    return three_users(make_gateway, tmp_path)


@pytest.fixture
def app(gw: GatewayHome) -> Iterator[ASGIApp]:
    console = open_console(gw.settings, tls=False, hosts=host_names("127.0.0.1", PORT))
    yield build_app(console)
    console.chain.stop()
    console.stores.engine.dispose()


def tool(name: str, description: str = "Commit the staged changes.") -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": {"type": "object"}}


def pins_of(gw: GatewayHome) -> PinStore:
    clock = SystemClock()
    return PinStore(gw.engine, AuditLog(gw.engine, clock), clock)


def accepted_events(gw: GatewayHome) -> list[dict[str, Any]]:
    log = AuditLog(gw.engine, SystemClock())
    return [e.to_json() for e in log.events() if e.event_type == "TOOL_DEFINITION_ACCEPTED"]


def changed(gw: GatewayHome, name: str = "git_commit") -> str:
    """A pin of `git` whose definition changed; the digest the page shows for it."""
    pins = pins_of(gw)
    pins.observe("git", [tool(name), tool("git_status")])
    seen = pins.observe("git", [tool(name, f"Commit, then push. {HOSTILE}"), tool("git_status")])[name].seen_sha256
    assert seen is not None
    return seen


def accept_form(client: TestClient, name: str, seen: str, csrf: str | None = None) -> Any:
    data = {"tool": tool_field(name), "seen": seen, "csrf": csrf or session_csrf(client)}
    return client.post("/upstreams/git/accept", data=data, follow_redirects=False)


def test_the_page_lists_upstreams_tools_and_states_and_shows_the_diff_escaped(gw: GatewayHome, app: ASGIApp) -> None:
    seen = changed(gw)
    pins_of(gw).observe("hostile", [tool(HOSTILE)])
    page = signed_in(app, "ada").get("/upstreams")
    assert page.status_code == 200
    text = page.text
    assert 'href="/upstreams" aria-current="page"' in text
    assert re.search(r'data-tool="git_commit" data-state="changed"', text)
    assert re.search(r'data-tool="git_status" data-state="pinned"', text)
    for raw in ("\u202e", "\u2066", "\x1b", "<b>", "\r"):
        assert raw not in text, repr(raw)
    assert html.escape("\\u202eevil\\u2066\\u001b[2J<b>x</b>", quote=False) in text
    assert f'name="seen" value="{seen}"' in text
    assert '<span class="del">-  "description": "Commit the staged changes.",\n</span>' in text
    assert '<button type="submit" class="accept">Accept this definition</button>' in text


def test_a_user_sees_the_page_without_accept_and_cannot_post_it(gw: GatewayHome, app: ASGIApp) -> None:
    seen = changed(gw)
    alice = signed_in(app, "alice")
    page = alice.get("/upstreams")
    assert page.status_code == 200 and 'class="accept"' not in page.text
    assert '<p class="note">Only an ADMIN can accept a changed definition.</p>' in page.text
    assert accept_form(alice, "git_commit", seen).status_code == 403
    assert pins_of(gw).pins("git")[0].state is PinState.CHANGED
    assert accepted_events(gw) == []


def test_an_admin_accepts_what_the_form_showed_and_the_event_names_the_console(gw: GatewayHome, app: ASGIApp) -> None:
    seen = changed(gw)
    ada = signed_in(app, "ada")
    answer = accept_form(ada, "git_commit", seen)
    assert (answer.status_code, answer.headers["location"]) == (303, "/upstreams?m=accepted")
    assert pins_of(gw).pins("git")[0].state is PinState.PINNED
    (event,) = accepted_events(gw)
    assert event["detail"]["accepted_by"] == "console:ada" and event["detail"]["channel"] == "console"
    assert "Accepted: the new definition is pinned" in ada.get("/upstreams?m=accepted").text
    again = accept_form(ada, "git_commit", seen)
    assert again.headers["location"] == "/upstreams?m=not_accepted"
    assert len(accepted_events(gw)) == 1


def test_an_accept_of_a_digest_no_longer_seen_accepts_nothing(gw: GatewayHome, app: ASGIApp) -> None:
    shown = changed(gw)
    pins_of(gw).observe("git", [tool("git_commit", "changed again after the page was read")])
    answer = accept_form(signed_in(app, "ada"), "git_commit", shown)
    assert answer.headers["location"] == "/upstreams?m=not_accepted"
    assert pins_of(gw).pins("git")[0].state is PinState.CHANGED
    assert accepted_events(gw) == []


def test_an_accept_needs_the_sessions_csrf_token(gw: GatewayHome, app: ASGIApp) -> None:
    seen = changed(gw)
    answer = accept_form(signed_in(app, "ada"), "git_commit", seen, csrf="forged")
    assert answer.status_code == 403
    assert accepted_events(gw) == []


def test_a_hostile_name_goes_through_the_form_unchanged(gw: GatewayHome, app: ASGIApp) -> None:
    seen = changed(gw, HOSTILE)
    ada = signed_in(app, "ada")
    field = re.search(r'name="tool" value="([^"]+)"', ada.get("/upstreams").text)
    assert field is not None
    sent = html.unescape(field.group(1))
    assert sent.isascii() and tool_of_field(sent) == HOSTILE
    assert accept_form(ada, HOSTILE, seen).headers["location"] == "/upstreams?m=accepted"


def test_a_tool_field_that_is_no_name_accepts_nothing(gw: GatewayHome, app: ASGIApp) -> None:
    """Each field on one gateway and session (a refusal changes nothing the next one sees): a gateway, a console
    and a sign-in each cost about 50 ms of CPU, most of what a field's own test spent."""
    seen = changed(gw)
    ada = signed_in(app, "ada")
    csrf = session_csrf(ada)
    for field in ("", "not json", "42", '["a"]', '"' + "x" * 5000 + '"'):
        answer = ada.post(
            "/upstreams/git/accept", data={"tool": field, "seen": seen, "csrf": csrf}, follow_redirects=False
        )
        assert answer.headers["location"] == "/upstreams?m=not_accepted", field[:20]
        assert accepted_events(gw) == [], field[:20]
    assert accept_form(ada, "git_commit", seen, csrf).headers["location"] == "/upstreams?m=accepted", "still acceptable"


def test_at_most_max_diffs_are_shown_and_the_rest_are_counted(gw: GatewayHome, app: ASGIApp) -> None:
    pins = pins_of(gw)
    names = [f"t{n:02}" for n in range(MAX_DIFFS + 3)]
    pins.observe("git", [tool(n) for n in names])
    pins.observe("git", [tool(n, "changed") for n in names])
    text = signed_in(app, "ada").get("/upstreams").text
    assert text.count('<pre class="diff"') == MAX_DIFFS
    assert "3 more changed definitions are not shown here" in text


def test_no_upstream_says_so(app: ASGIApp) -> None:
    assert "No upstream server" in signed_in(app, "alice").get("/upstreams").text


def test_the_policys_tools_not_seen_yet_and_a_refused_one_with_why(
    make_gateway: Callable[..., GatewayHome], tmp_path: Path, db_url: str
) -> None:
    gateway = three_users(make_gateway, tmp_path)
    install_server(gateway)
    gateway.write_policy(upstream_policy())
    pins = pins_of(gateway)
    pins.observe("up", [tool("echo"), tool("big")])
    pins.observe("up", [tool("echo"), tool("big", "x" * 70_000)])
    console = open_console(gateway.settings, tls=False, hosts=host_names("127.0.0.1", PORT))
    try:
        text = signed_in(build_app(console), "alice").get("/upstreams").text
    finally:
        console.chain.stop()
        console.stores.engine.dispose()
    states = dict(re.findall(r'<tr data-tool="([^"]+)" data-state="([^"]+)"', text))
    assert states == {name: {"echo": "pinned", "big": "refused"}.get(name, "not seen") for name in OFFERED}
    assert "in the policy" in text
    assert "the definition is 70," in text and "more than 65,536" in text
    assert "x" * 1000 not in text, "a refused definition's text is neither stored nor shown"
