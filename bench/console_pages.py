"""How fast the web console answers with a big log: `mcp-gateway console` on a database of 100,000 audit events.

The script fills a fresh state folder (SQLite, as `mcp-gateway init` makes it): `--events` audit
events (a tenth of them calls with their invocation cards, the rest token and sign-in events of
several users), runs, stored decisions and a pending consent question. It starts a real
`mcp-gateway console` subprocess, signs in as an ADMIN over HTTP, and times each page
`--rounds` times (after one unmeasured request each): p50, p95 and max per page, against the
200 ms target.

Then the live view: a writer appends calls at `--rate` a second for `--seconds` (each call two
transactions, as a gateway makes them: the entry with its pending card, then the end with the
card done), while one server-sent-events client follows /api/stream. For each call the delay
from its end's commit to the client receiving the card done is recorded; the client keeps up
when every call arrives and the delay stays bounded (p95 and max printed, target p95 < 1 s).
With `--streams N` (default 50), the pages are timed again while N live views are open, each
without a cursor (as a signed-in user can open them: 4 per session, 8 per user, so spread over
several users), to show that open streams do not slow the pages (each starts at the newest
change; before, each replayed every card from the first).

It exits 0 whether or not the targets are met (the figures are the output), 1 if the console
misbehaves.

    .venv/bin/python bench/console_pages.py [--events 100000] [--rounds 30] [--rate 20] [--seconds 10] [--streams 50]
"""

from __future__ import annotations

import argparse
import http.client
import http.cookiejar
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gateway.audit import AuditLog, EventDraft, EventType  # noqa: E402
from gateway.calls import Moved, Opened  # noqa: E402
from gateway.clock import SystemClock  # noqa: E402
from gateway.consent.store import ConsentStore, Grant, GrantDecision, PendingRequest  # noqa: E402
from gateway.runs import RunRecord, RunStore  # noqa: E402
from tests.harness import GatewayHome  # noqa: E402

TARGET_MS = 200.0
TARGET_LAG_S = 1.0
PASSWORD = "bench-console-pw"  # noqa: S105  (the throwaway database's user)
USERS = ("ada", "alice", "bob", "carol", "dave")


def fill(home: GatewayHome, events: int) -> str:
    """`events` audit events, a tenth of them calls with cards; returns one call's run id."""
    log = AuditLog(home.engine, SystemClock())
    runs = RunStore(home.engine, home.home / "artifacts")
    now = time.time()
    batch: list[EventDraft] = []
    cards = []
    last_run = ""
    for i in range(events):
        user = USERS[i % len(USERS)]
        if i % 10 == 0:
            last_run = f"bench-run-{i:07d}"
            batch.append(
                EventDraft(
                    EventType.MCP_TOOL_CALL, run_id=last_run, user=user, workspace="default", tool_name="run_pytest"
                )
            )
            cards.append(Opened(last_run, user, "default", "mcp-write-gateway", "run_pytest", {"test_path": "tests"}, "done", now,
                                result=[{"type": "text", "text": f"{i} passed"}]))  # fmt: skip
        else:
            code = -32003 if i % 7 == 0 else None
            kind = EventType.POLICY_BLOCKED if code else EventType.TOKEN_ISSUED
            batch.append(EventDraft(kind, user=user, workspace="default", code=code, detail={"n": i}))
        if len(batch) == 1000:
            log.append(*batch, along=cards)
            batch, cards = [], []
    if batch:
        log.append(*batch, along=cards)
    for i in range(200):
        runs.insert(RunRecord(f"bench-run-{i * 10:07d}", USERS[i % 5], "default", "run_pytest", now - i, "passed", 0))
    store = ConsentStore(home.engine)
    for i in range(50):
        store.insert_grant(Grant(0, USERS[i % 5], "default", "mcp-write-gateway", "run_pytest", None, GrantDecision.ALLOW,
                                 "f" * 64, now, now + 86400, "bench"))  # fmt: skip
    store.insert_request(
        PendingRequest(
            "bench-question",
            now,
            now + 3600,
            "bench-session",
            "alice",
            "default",
            "mcp-write-gateway",
            "run_pytest",
            "a" * 64,
            'test_path: "tests"',
            "medium",
            False,
        )
    )
    return last_run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Client:
    """A signed-in browser, as far as the console can tell: its cookies, over plain HTTP."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def sign_in(self, user: str) -> None:
        form = self.opener.open(self.base + "/login").read().decode()
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', form)
        if match is None:
            raise SystemExit("no CSRF token on the sign-in form")
        data = urllib.parse.urlencode({"user": user, "password": PASSWORD, "csrf": match.group(1)}).encode()
        sign_in = urllib.request.Request(self.base + "/login", data=data)  # noqa: S310  (our own http URL)
        answer = self.opener.open(sign_in)
        if not answer.geturl().endswith("/calls"):
            raise SystemExit(f"sign-in failed: {answer.geturl()}")

    def get_ms(self, path: str) -> float:
        started = time.perf_counter()
        with self.opener.open(self.base + path) as answer:
            answer.read()
            if answer.status != 200:
                raise SystemExit(f"{path}: {answer.status}")
        return (time.perf_counter() - started) * 1000

    def cookie_header(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.jar)


def pages(run_id: str, newest: int) -> dict[str, str]:
    return {
        "/calls": "/calls",
        "/calls/<id>": f"/calls/{run_id}",
        "/api/calls": "/api/calls",
        "/api/calls/<id>": f"/api/calls/{run_id}",
        "/approvals": "/approvals",
        "/grants": "/grants",
        "/grants?user": "/grants?user=alice&tool=run_pytest",
        "/audit": "/audit",
        "/audit?user": "/audit?user=alice",
        "/audit?type+code": "/audit?event_type=POLICY_BLOCKED&code=-32003",
        "/audit?before (middle)": f"/audit?before={newest // 2}",
        "/audit?since": "/audit?since=2000-01-01T00:00:00Z&tool=run_pytest",
        "/runs": "/runs",
        "/runs/<id>": "/runs/bench-run-0000000",
    }


def measure_pages(client: Client, run_id: str, newest: int, rounds: int) -> bool:
    print(f"{'page':28} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  (target < {TARGET_MS:.0f} ms)")
    ok = True
    for name, path in pages(run_id, newest).items():
        client.get_ms(path)  # unmeasured: first use of the statement
        times = sorted(client.get_ms(path) for _ in range(rounds))
        p50, p95 = statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]
        ok = ok and p95 < TARGET_MS
        print(f"{name:28} {p50:8.1f} {p95:8.1f} {times[-1]:8.1f}  {'ok' if p95 < TARGET_MS else 'OVER'}")
    return ok


def follow(
    base: str, cookie: str, *, after: int, want: set[str], seen: dict[str, float], stop: threading.Event
) -> None:
    """Read /api/stream, noting when each wanted card arrives done."""
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", f"/api/stream?after={after}", headers={"Cookie": cookie, "Accept": "text/event-stream"})
    response = connection.getresponse()
    while not stop.is_set():
        line = response.fp.readline()
        if not line:
            break
        if line.startswith(b"data:"):
            card = json.loads(line[5:])
            if card["run_id"] in want and card["status"] == "done":
                seen.setdefault(card["run_id"], time.monotonic())
    connection.close()


STREAMS_PER_SESSION = 4
STREAMS_PER_USER = 8


def stream_users(count: int) -> list[str]:
    return [f"streamer{n}" for n in range(-(-count // STREAMS_PER_USER))]


def open_streams(base: str, count: int) -> list[http.client.HTTPConnection]:
    """`count` live views without a cursor, 4 per session and 8 per user (the console's limits)."""
    host, port = urllib.parse.urlsplit(base).netloc.split(":")
    connections: list[http.client.HTTPConnection] = []
    sessions = [stream_users(count)[n // 2] for n in range(-(-count // STREAMS_PER_SESSION))]
    for n, user in enumerate(sessions):
        client = Client(base)
        client.sign_in(user)
        for _ in range(min(STREAMS_PER_SESSION, count - n * STREAMS_PER_SESSION)):
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.request("GET", "/api/stream", headers={"Cookie": client.cookie_header()})
            answer = connection.getresponse()
            if answer.status != 200:
                raise SystemExit(f"stream refused: {answer.status} {answer.read()[:200]!r}")
            connections.append(connection)
    return connections


def measure_live(home: GatewayHome, client: Client, rate: int, seconds: int) -> bool:
    log = AuditLog(home.engine, SystemClock())
    after = log.head().last_id
    total = rate * seconds
    want = {f"live-{i:05d}" for i in range(total)}
    seen: dict[str, float] = {}
    ended: dict[str, float] = {}
    stop = threading.Event()
    reader = threading.Thread(
        target=follow,
        args=(client.base, client.cookie_header()),
        kwargs={"after": after, "want": want, "seen": seen, "stop": stop},
        daemon=True,
    )
    reader.start()
    time.sleep(0.5)
    started = time.monotonic()
    for i in range(total):
        run_id = f"live-{i:05d}"
        now = time.time()
        entry = EventDraft(
            EventType.MCP_TOOL_CALL, run_id=run_id, user="alice", workspace="default", tool_name="list_artifacts"
        )
        log.append(
            entry, along=[Opened(run_id, "alice", "default", "mcp-write-gateway", "list_artifacts", {}, "running", now)]
        )
        end = EventDraft(
            EventType.TOOL_FINISHED, run_id=run_id, user="alice", workspace="default", tool_name="list_artifacts"
        )
        log.append(end, along=[Moved(run_id, "done", now, result=[{"type": "text", "text": "ok"}])])
        ended[run_id] = time.monotonic()
        pause = started + (i + 1) / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    written = time.monotonic() - started
    deadline = time.monotonic() + 10
    while len(seen) < total and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    lags = sorted(seen[r] - ended[r] for r in seen)
    print(
        f"\nlive view: {total} calls written at {total / written:.1f}/s; the stream delivered {len(seen)} of them done"
    )
    if not lags:
        print("  the stream delivered nothing: FALLING BEHIND")
        return False
    p50, p95 = statistics.median(lags), lags[max(0, int(len(lags) * 0.95) - 1)]
    ok = len(seen) == total and p95 < TARGET_LAG_S
    print(f"  delay commit -> client: p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms  "
          f"({'keeps up' if ok else 'FALLING BEHIND'}; target p95 < {TARGET_LAG_S * 1000:.0f} ms)")  # fmt: skip
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--streams", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-console-") as folder:
        root = Path(folder) / "gw"
        root.mkdir()
        home = GatewayHome(root)
        home.users.add("ada", "ADMIN", ("default",), PASSWORD)
        for user in USERS[1:]:
            home.users.add(user, "USER", ("default",))
        for user in stream_users(args.streams):
            home.users.add(user, "VIEWER", ("default",), PASSWORD)
        started = time.monotonic()
        run_id = fill(home, args.events)
        newest = AuditLog(home.engine, SystemClock()).head().last_id
        print(f"filled: {newest} audit events in {time.monotonic() - started:.1f} s (SQLite, {home.url})")
        port = free_port()
        log = (root / "console.log").open("wb")
        console = subprocess.Popen(home.cli_argv("console", "--port", str(port)), stdout=log, stderr=log, cwd=REPO)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(base + "/login", timeout=2).close()  # noqa: S310  (our own http URL)
                    break
                except OSError:
                    if time.monotonic() > deadline or console.poll() is not None:
                        print((root / "console.log").read_text(), file=sys.stderr)
                        return 1
                    time.sleep(0.1)
            client = Client(base)
            client.sign_in("ada")
            pages_ok = measure_pages(client, run_id, newest, args.rounds)
            if args.streams:
                streams = open_streams(base, args.streams)
                print(f"\nthe same pages with {len(streams)} live views open (no cursor):")
                pages_ok = measure_pages(client, run_id, newest, args.rounds) and pages_ok
                for connection in streams:
                    connection.close()
            live_ok = measure_live(home, client, args.rate, args.seconds)
            print(f"\nverdict: pages {'under' if pages_ok else 'OVER'} {TARGET_MS:.0f} ms at p95; "
                  f"live view {'keeps up' if live_ok else 'falls behind'} at {args.rate} calls/s")  # fmt: skip
        finally:
            console.terminate()
            console.wait(timeout=10)
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
