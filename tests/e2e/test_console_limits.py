"""The web console's limits against a real `mcp-gateway console` over HTTP (127.0.0.1 only): the sign-in
limit under concurrent guesses, the address limit on loopback, and the live stream's start, replay
cap and number per session and user."""

from __future__ import annotations

import http.client
import json
import re
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlencode

import pytest

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.calls import CallStore, CardStatus, Opened
from gateway.clock import SystemClock
from gateway.console.app import REPLAY_MAX
from gateway.console.sessions import FAILURES_PER_ADDRESS, FAILURES_PER_NAME, STREAMS_PER_SESSION, STREAMS_PER_USER
from tests.e2e.console_server import running_console
from tests.harness import GatewayHome

PASSWORD = "ada-console-pw-1"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: str
    cookies: dict[str, str]
    """name=value of each Set-Cookie, by name."""


def request(
    base: str,
    method: str,
    path: str,
    *,
    cookie: str = "",
    form: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> Answer:
    """One HTTP request to the console at `base`, sent from the loopback address `source`."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120, source_address=(source, 0))
    try:
        headers = {"Cookie": cookie} if cookie else {}
        body = None
        if form is not None:
            body = urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        cookies = [c.split(";", 1)[0] for c in answer.headers.get_all("set-cookie") or []]
        return Answer(
            answer.status,
            {k.lower(): v for k, v in answer.getheaders()},
            answer.read().decode(),
            {c.split("=", 1)[0]: c for c in cookies},
        )
    finally:
        connection.close()


def sign_in_form(base: str) -> tuple[str, str]:
    """The pre-session cookie and the sign-in form's CSRF token."""
    page = request(base, "GET", "/login")
    cookie = page.cookies["gw_pre"]
    token = re.search(r'name="csrf" value="([^"]+)"', page.body)
    assert token is not None, page.body
    return cookie, token.group(1)


def sign_in(base: str, user: str, password: str, source: str = "127.0.0.1") -> Answer:
    cookie, token = sign_in_form(base)
    return request(
        base, "POST", "/login", cookie=cookie, form={"user": user, "password": password, "csrf": token}, source=source
    )


def sign_in_events(gw: GatewayHome) -> list[dict[str, object]]:
    return [e["detail"] for e in gw.audit_events() if e["event_type"] == "CONSOLE_SIGN_IN"]


@pytest.fixture
def gw(tmp_path_factory: pytest.TempPathFactory) -> GatewayHome:
    gateway = GatewayHome(tmp_path_factory.mktemp("console-limits"))
    gateway.users.add("ada", "ADMIN", ("default",), PASSWORD)
    return gateway


@pytest.fixture
def console(gw: GatewayHome) -> Iterator[str]:
    with running_console(gw) as url:
        yield url


def test_thirty_concurrent_wrong_passwords_check_at_most_the_limit(gw: GatewayHome, console: str) -> None:
    cookie, token = sign_in_form(console)
    start = threading.Barrier(30)

    def guess(n: int) -> int:
        start.wait(timeout=60)
        form = {"user": "ada", "password": f"guess-{n}", "csrf": token}
        return request(console, "POST", "/login", cookie=cookie, form=form).status

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(guess, range(30), timeout=180))
    assert len(answers) == 30
    # At most the limit's number of "wrong password" answers (each a password checked), the rest refused unchecked.
    assert answers.count(401) == FAILURES_PER_NAME, answers
    assert answers.count(429) == 30 - FAILURES_PER_NAME, answers
    checked = [e for e in sign_in_events(gw) if e.get("reason") == "bad_credentials"]
    assert len(checked) == FAILURES_PER_NAME
    # The right password is refused too now, unchecked, until the window has passed.
    assert sign_in(console, "ada", PASSWORD).status == 429


def test_the_address_limit_binds_every_local_address_together(gw: GatewayHome, console: str) -> None:
    answers = [sign_in(console, f"nobody{i}", "wrong", source=f"127.0.{i // 200}.{2 + i % 200}") for i in range(25)]
    statuses = [a.status for a in answers]
    # Each from another 127.x address, each another name: the twenty-first is refused all the same.
    assert statuses == [401] * FAILURES_PER_ADDRESS + [429] * (25 - FAILURES_PER_ADDRESS), statuses
    assert int(answers[-1].headers["retry-after"]) > 0
    assert sign_in(console, "ada", PASSWORD, source="127.3.4.5").status == 429  # a right password waits too


# --- the live stream ---------------------------------------------------------------------------------


def add_cards(gw: GatewayHome, count: int, prefix: str) -> int:
    """`count` done cards, each written with its own audit event as a gateway writes it (so each has
    its own cursor); returns the last one's cursor."""
    log = AuditLog(gw.engine, SystemClock())
    now = time.time()
    for n in range(count):
        run_id = f"{prefix}-{n:06d}"
        card = Opened(run_id, "ada", "default", "mcp-write-gateway", "list_artifacts", {}, CardStatus.DONE, now)
        log.append(EventDraft(EventType.MCP_TOOL_CALL, run_id=run_id, user="ada", workspace="default"), along=[card])
    return CallStore(gw.engine).fetch_head()


def session_cookie(base: str, user: str, password: str) -> str:
    answer = sign_in(base, user, password)
    assert answer.status == 303, answer
    return answer.cookies["gw_session"]


class Stream:
    """One `/api/stream` held open, its events collected by a thread as they arrive."""

    def __init__(self, base: str, cookie: str, query: str = "", headers: dict[str, str] | None = None) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=60)
        self.connection.request("GET", "/api/stream" + query, headers={"Cookie": cookie, **(headers or {})})
        self.answer = self.connection.getresponse()
        self.status = self.answer.status
        self.events: list[tuple[str, str]] = []
        self.ended = threading.Event()
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = self.answer.read().decode()
            self.answer.close()
            self.connection.close()
            self.ended.set()

    def _read(self) -> None:
        kind, data = "message", ""
        try:
            while line := self.answer.readline():
                text = line.decode().rstrip("\r\n")
                if text.startswith("event:"):
                    kind = text.split(":", 1)[1].strip()
                elif text.startswith("data:"):
                    data = text.split(":", 1)[1].strip()
                elif not text and data:
                    self.events.append((kind, data))
                    kind, data = "message", ""
        except (OSError, ValueError, AttributeError):
            pass  # closed by the test
        finally:
            self.ended.set()

    def cards(self) -> list[dict[str, object]]:
        return [json.loads(data) for kind, data in list(self.events) if kind == "card"]

    def close(self) -> None:
        if self.status == 200 and self.connection.sock is not None:
            self.connection.sock.shutdown(socket.SHUT_RDWR)
        self.ended.wait(timeout=30)
        self.answer.close()
        self.connection.close()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_stream_starts_at_the_head_and_a_far_cursor_is_told_to_reload(gw: GatewayHome, console: str) -> None:
    head = add_cards(gw, 3 * REPLAY_MAX, "old")
    cookie = session_cookie(console, "ada", PASSWORD)
    fresh = Stream(console, cookie)  # no `after`: from now on
    behind = Stream(console, cookie, f"?after={head - 50}")  # 50 behind: replayed
    far = Stream(console, cookie, "?after=0")  # 600 behind: more than the cap
    reconnected = Stream(console, cookie, "?after=0", {"Last-Event-ID": str(head - 3)})  # an EventSource's retry
    try:
        wait_for(lambda: len(behind.cards()) == 50, "the 50 cards behind the cursor")
        far.ended.wait(timeout=60)
        assert far.events and far.events[0][0] == "reload" and "reload the page" in far.events[0][1], far.events
        assert all(kind != "card" for kind, _ in far.events)
        wait_for(lambda: len(reconnected.cards()) == 3, "the 3 cards after Last-Event-ID")
        time.sleep(1.5)  # a few polls: nothing old comes to the fresh stream
        assert fresh.cards() == []
        add_cards(gw, 1, "new")
        wait_for(lambda: len(fresh.cards()) == 1, "the new card")
        assert [c["run_id"] for c in fresh.cards()] == ["new-000000"]
        wait_for(lambda: len(behind.cards()) == 51 and len(reconnected.cards()) == 4, "the new card on every stream")
    finally:
        for stream in (fresh, behind, far, reconnected):
            stream.close()


def test_streams_are_limited_per_session_and_per_user(gw: GatewayHome, console: str) -> None:
    first = session_cookie(console, "ada", PASSWORD)
    second = session_cookie(console, "ada", PASSWORD)
    third = session_cookie(console, "ada", PASSWORD)
    held = [Stream(console, first) for _ in range(STREAMS_PER_SESSION)]
    try:
        assert [s.status for s in held] == [200] * STREAMS_PER_SESSION
        refused = Stream(console, first)
        assert refused.status == 429
        assert "already has 4 live views open" in json.loads(refused.body)["error"]
        held += [Stream(console, second) for _ in range(STREAMS_PER_USER - STREAMS_PER_SESSION)]
        assert [s.status for s in held] == [200] * STREAMS_PER_USER
        refused = Stream(console, third)  # a new session of the same user: over the user's share
        assert refused.status == 429 and "user ada already has 8" in json.loads(refused.body)["error"]
        held.pop(0).close()  # a closed stream gives its place back once the console sees it gone

        def one_more() -> bool:
            again = Stream(console, first)
            if again.status == 200:
                held.append(again)
            return again.status == 200

        wait_for(one_more, "the closed stream's place given back")
    finally:
        for stream in held:
            stream.close()


def test_pages_stay_fast_with_fifty_streams_open(gw: GatewayHome, console: str) -> None:
    """A coarse bound, not a benchmark (bench/console_pages.py --streams times it)."""
    add_cards(gw, 5 * REPLAY_MAX, "old")
    users = [f"user{n}" for n in range(7)]
    for name in users:
        gw.users.add(name, "ADMIN", ("default",), PASSWORD)
    cookies = [session_cookie(console, name, PASSWORD) for name in users for _ in range(2)]
    reader = cookies[0]

    def page_ms() -> float:
        started = time.monotonic()
        answer = request(console, "GET", "/api/calls", cookie=reader)
        assert answer.status == 200
        return (time.monotonic() - started) * 1000

    before = statistics.median(page_ms() for _ in range(10))
    streams = [Stream(console, cookies[n % len(cookies)], "?after=0" if n % 2 else "") for n in range(50)]
    try:
        assert [s.status for s in streams] == [200] * 50
        during = statistics.median(page_ms() for _ in range(10))
        assert during < max(20 * before, 1000.0), (before, during)
        assert all(not s.cards() for s in streams)  # no backlog replayed: nothing older than the head, or reload
    finally:
        for stream in streams:
            stream.close()
