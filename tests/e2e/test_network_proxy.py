"""Network by domain over real stdio (docs/policy.md, "Network by domain"; decision 90): runs reach hosts through the proxy.

A declared tool runs urllib or curl inside the sandbox; its only way out is the gateway's proxy at
127.0.0.1:3128 in its own namespace. The one origin is a listener this test opens on 127.0.0.1, named
through `resolve`; every other address is refused by rule before anything is dialled.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import select, update

from gateway import db
from gateway.calls import CallStore
from gateway.clock import SystemClock
from gateway.consent.actions import Actor, decide_question
from gateway.consent.stage import Decision
from gateway.consent.store import Channel
from tests.e2e.console_server import running_console
from tests.e2e.test_console_limits import Stream, session_cookie
from tests.e2e.test_dead_gateway_calls import SWEEPING
from tests.gateway.test_console_routes import PASSWORDS, password_hash, running_app, session_csrf, signed_in
from tests.harness import FORM_ELICITATION, ConsentDesk, GatewayHome, StdioSession, reachable_by_everyone

SessionFactory = Callable[..., StdioSession]
GatewayFactory = Callable[..., GatewayHome]

FETCH = f"""\
#!{sys.executable}
import json, sys, urllib.error, urllib.request
url = sys.argv[1]
try:
    with urllib.request.urlopen(url, timeout=20) as response:
        print(json.dumps({{"status": response.status, "body": response.read().decode()}}))
except urllib.error.HTTPError as exc:
    print(json.dumps({{"status": exc.code, "body": exc.read().decode()}}))
except OSError as exc:
    print(json.dumps({{"status": None, "body": type(exc).__name__ + ": " + str(exc)}}))
"""
BODY = b"served on the host's loopback"
BIG = bytes(range(256)) * (4 * 4096)  # 4 MiB: relayed by splice (decision 97)
DRIP = bytes(range(256)) * 2048  # 512 KiB, its first half sent at once and the rest when the test lets it go
DIGEST = f"""\
#!{sys.executable}
import hashlib, json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as response:
    body = response.read()
print(json.dumps({{"status": response.status, "bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}}))
"""


class Origin(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow":  # an answer that never comes while the test looks (the thread is a daemon)
            if isinstance(self.server, OriginServer):
                self.server.slow_asked.set()
            time.sleep(60)
        if self.path == "/hold" and isinstance(self.server, OriginServer):  # answered once the test lets it go
            self.server.released.wait(timeout=90)
        if self.path == "/drip" and isinstance(self.server, OriginServer):  # half now, the rest once let go
            self.send_response(200)
            self.send_header("Content-Length", str(len(DRIP)))
            self.end_headers()
            with contextlib.suppress(OSError):  # a run killed with its gateway reads no more
                self.wfile.write(DRIP[: len(DRIP) // 2])
                self.wfile.flush()
                self.server.released.wait(timeout=90)
                self.wfile.write(DRIP[len(DRIP) // 2 :])
            return
        body = BIG if self.path == "/big" else BODY
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class OriginServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Origin)
        self.slow_asked = threading.Event()
        self.released = threading.Event()


@pytest.fixture
def origin() -> Iterator[OriginServer]:
    server = OriginServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def tool(command: list[str]) -> dict[str, Any]:
    return {
        "description": "Fetch a URL",
        "command": command,
        "arguments": {"url": {"type": "string", "pattern": "http://[!-~]+", "max_length": 200}},
        "annotations": {"destructiveHint": False, "idempotentHint": True, "openWorldHint": True},
    }


def gateway_with(make_gateway: GatewayFactory, programs: dict[str, str], policy: dict[str, Any]) -> GatewayHome:
    """A gateway whose policy is `policy`, with `programs` (name -> text) in bin/ beside it, and alice a USER."""
    gw = make_gateway()
    folder = gw.policy_path.parent / "bin"
    folder.mkdir(exist_ok=True)
    for name, text in programs.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    reachable_by_everyone(folder)
    gw.write_policy(policy)
    gw.add_user("alice", "USER")
    return gw


@pytest.fixture
def proxied(make_gateway: GatewayFactory, origin: http.server.ThreadingHTTPServer) -> GatewayHome:
    port = origin.server_address[1]
    tools = {"fetch": tool(["bin/fetch", "{url}"]), "digest": tool(["bin/digest", "{url}"])}
    if shutil.which("curl"):
        tools["curl"] = tool(["curl", "-sS", "-i", "--max-time", "20", "{url}"])
        tools["tunnel"] = tool(["curl", "-sS", "-p", "--max-time", "60", "-o", "/dev/null", "-D", "-", "{url}"])
    return gateway_with(
        make_gateway,
        {"fetch": FETCH, "digest": DIGEST},
        {
            "tools": {"allowlist": list(tools), "declared": tools},
            "sandbox": {
                "allowed_paths": ["bin"],
                "network": {
                    "allow": [f"origin.test:{port}", f"*.example.test:{port}"],
                    "deny": ["denied.test"],
                    "resolve": {
                        "origin.test": "127.0.0.1",
                        "api.example.test": "127.0.0.1",
                        "denied.test": "127.0.0.1",
                    },
                },
            },
        },
    )


def allow_once(message: dict[str, Any]) -> dict[str, Any]:
    return {"action": "accept", "content": {"decision": "allow_once"}}


@contextlib.contextmanager
def session_of(gw: GatewayHome, open_session: SessionFactory) -> Iterator[Callable[[str, str], dict[str, Any]]]:
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    token = gw.token("alice")
    yield lambda name, url: session.call_tool(name, {"url": url}, token, timeout=120)


def fetched(response: dict[str, Any]) -> dict[str, Any]:
    result = response["result"]
    parsed: dict[str, Any] = json.loads(result["content"][0]["text"].splitlines()[0])
    return parsed


def net_events(gw: GatewayHome, response: dict[str, Any]) -> list[dict[str, Any]]:
    run_id = response["result"]["structuredContent"]["run_id"]
    return [e for e in gw.events_of(run_id) if e["event_type"] == "NET_CONNECT"]


@pytest.mark.parametrize("way", ["digest", "tunnel"], ids=["urllib plainly", "curl through CONNECT"])
def test_a_large_download_inside_a_run_is_relayed_whole_and_counted_once(
    way: str, proxied: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    if way == "tunnel" and shutil.which("curl") is None:
        pytest.skip("needs curl")
    host = "origin.test" if way == "digest" else "api.example.test"
    with session_of(proxied, open_session) as call:
        response = call(way, f"http://{host}:{origin.server_address[1]}/big")
    if way == "digest":
        assert fetched(response) == {"status": 200, "bytes": len(BIG), "sha256": hashlib.sha256(BIG).hexdigest()}
    else:
        assert not response["result"].get("isError")  # curl exits 18 on a body cut short
        assert f"Content-Length: {len(BIG)}" in response["result"]["content"][0]["text"]
    [event] = net_events(proxied, response)
    assert (event["detail"]["method"], event["detail"]["decision"], event["detail"]["reason"]) == (
        "GET" if way == "digest" else "CONNECT", "allowed", None,
    )  # fmt: skip
    assert len(BIG) < event["detail"]["bytes_down"] < len(BIG) + 1024  # the body and a head, counted exactly once


def test_an_allowed_host_is_fetched_by_urllib_inside_a_run_and_recorded(
    db_url: str, proxied: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    port = origin.server_address[1]
    with session_of(proxied, open_session) as call:
        response = call("fetch", f"http://origin.test:{port}/x")
    assert fetched(response) == {"status": 200, "body": BODY.decode()}
    [event] = net_events(proxied, response)
    assert {k: event["detail"][k] for k in ("host", "port", "decision", "rule", "address")} == {
        "host": "origin.test", "port": port, "decision": "allowed", "rule": f"allow: origin.test:{port}",
        "address": "127.0.0.1",
    }  # fmt: skip
    kinds = [e["event_type"] for e in proxied.events_of(response["result"]["structuredContent"]["run_id"])]
    assert kinds.index("TOOL_STARTED") < kinds.index("NET_CONNECT") < kinds.index("SANDBOX_EXEC")
    assert proxied.chain_ok()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_inside_a_run_fetches_an_allowed_host_and_gets_403_for_a_denied_one(
    proxied: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    port = origin.server_address[1]
    with session_of(proxied, open_session) as call:
        allowed = call("curl", f"http://api.example.test:{port}/")
        denied = call("curl", f"http://denied.test:{port}/")
    assert BODY.decode() in allowed["result"]["content"][0]["text"]
    text = denied["result"]["content"][0]["text"]
    assert "403 Forbidden" in text
    assert "denied.test" in text and "deny: denied.test" in text and "sandbox.network" in text
    [event] = net_events(proxied, denied)
    assert (event["detail"]["decision"], event["detail"]["reason"]) == ("refused", "denied_by_rule")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:{port}/", "no_rule"),  # an IP literal no rule names
        ("http://169.254.169.254/latest/meta-data/", "no_rule"),  # the metadata address: refused before any dial
        ("http://origin.test:1/", "no_rule"),  # a port the rule does not name
        ("http://elsewhere.test/", "no_rule"),
    ],
)
def test_what_no_rule_names_is_refused_inside_a_run_and_nothing_is_dialled(
    proxied: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer, url: str, reason: str
) -> None:
    with session_of(proxied, open_session) as call:
        response = call("fetch", url.format(port=origin.server_address[1]))
    answer = fetched(response)
    assert answer["status"] == 403
    assert "no rule in sandbox.network names it" in answer["body"]
    [event] = net_events(proxied, response)
    assert (event["detail"]["reason"], event["detail"]["address"]) == (reason, None)  # never dialled


@pytest.fixture
def asking(make_gateway: GatewayFactory, origin: http.server.ThreadingHTTPServer) -> GatewayHome:
    port = origin.server_address[1]
    return gateway_with(
        make_gateway,
        {"fetch": FETCH},
        {
            "tools": {"allowlist": ["fetch"], "declared": {"fetch": tool(["bin/fetch", "{url}"])}},
            "sandbox": {
                "allowed_paths": ["bin"],
                "network": {
                    "ask": [f"*.ask.test:{port}"],
                    "resolve": {"a.ask.test": "127.0.0.1", "b.ask.test": "127.0.0.1"},
                },
            },
            "consent": {"timeout_s": 5},
        },
    )


def test_an_ask_host_waits_for_a_person_allow_once_then_deny_always_then_a_cancelled_dialog(
    db_url: str, asking: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    url = f"http://a.ask.test:{origin.server_address[1]}/"
    session = open_session(asking, capabilities=FORM_ELICITATION)
    token = asking.token("alice")
    asked: list[str] = []

    def person(host_answer: str | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def respond(message: dict[str, Any]) -> dict[str, Any]:
            text = message["params"]["message"]
            asked.append(text)
            if "network:" not in text:
                return {"action": "accept", "content": {"decision": "allow_once"}}  # the tool's own question
            if host_answer is None:
                return {"action": "cancel"}
            return {"action": "accept", "content": {"decision": host_answer}}

        return respond

    session.responder = person("allow_once")
    allowed = session.call_tool("fetch", {"url": url}, token, timeout=120)
    assert fetched(allowed) == {"status": 200, "body": BODY.decode()}
    assert any("network:a.ask.test" in a and "wants to connect to a.ask.test" in a for a in asked)
    run_id = allowed["result"]["structuredContent"]["run_id"]
    decisions = [e for e in asking.all_events() if e["event_type"] == "mcp.permission.decision"]
    assert [(d["tool_name"], d["detail"]["decision"]) for d in decisions] == [
        ("fetch", "ALLOW_ONCE"), ("network:a.ask.test", "ALLOW_ONCE"),
    ]  # fmt: skip
    assert decisions[0]["run_id"] == run_id
    assert (decisions[1]["detail"]["for_run"], decisions[1]["detail"]["about"]) == (run_id, "network_host")

    session.responder = person("deny_always")
    denied = session.call_tool("fetch", {"url": url}, token, timeout=120)
    assert fetched(denied)["status"] == 403
    assert "refused by a person" in fetched(denied)["body"]

    asked.clear()
    session.responder = person("allow_once")  # the stored deny answers: the person is not asked about the host
    again = session.call_tool("fetch", {"url": url}, token, timeout=120)
    assert fetched(again)["status"] == 403
    assert not any("network:" in a for a in asked)
    [event] = net_events(asking, again)
    assert event["detail"]["reason"] == "denied_by_person"

    session.responder = person(None)  # the dialog cancelled: deny once, nothing stored
    cancelled = session.call_tool("fetch", {"url": url.replace("a.ask", "b.ask")}, token, timeout=120)
    assert fetched(cancelled)["status"] == 403
    assert asking.chain_ok()


def test_a_host_question_waiting_for_a_person_is_live_in_the_console_and_decided_there(
    asking: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    """While the run waits on its connection, the console (the real app, on the same database) lists the host's
    question on its Approvals page and /api/questions, and an ADMIN's answer there lets the connection through."""
    asking.users.add("ada", "ADMIN", ("default",))
    with asking.engine.begin() as connection:
        connection.execute(
            update(db.users).where(db.users.c.name == "ada").values(password_hash=password_hash(PASSWORDS["ada"]))
        )
    desk = ConsentDesk.on(asking.engine, SystemClock())
    session = open_session(asking)  # no elicitation capability: the questions wait in the database
    url = f"http://a.ask.test:{origin.server_address[1]}/"
    request_id = session.send_call("fetch", {"url": url}, asking.token("alice"))
    with running_app(asking) as app:
        ada = signed_in(app, "ada")
        csrf = session_csrf(ada)
        answered: dict[str, str] = {}
        deadline = time.monotonic() + 90
        while "network" not in answered:
            assert time.monotonic() < deadline, "the host's question never showed"
            listed = ada.get("/api/questions").json()["ids"]
            for question in desk.consent_store.fetch_pending(desk.clock.now()):
                if question.id not in listed or question.id in answered.values():
                    continue
                kind = "network" if question.tool_name == "network:a.ask.test" else "tool"
                if kind == "network":
                    page = ada.get("/approvals").text
                    assert "a.ask.test" in page and "wants to connect to a.ask.test" in page
                decided = ada.post(
                    f"/approvals/{question.id}", data={"decision": "ALLOW_ONCE", "csrf": csrf}, follow_redirects=False
                )
                assert decided.headers["location"] == "/approvals?m=decided&d=ALLOW_ONCE"
                answered[kind] = question.id
            time.sleep(0.05)
    response = session.wait_response(request_id, timeout=90)
    assert fetched(response) == {"status": 200, "body": BODY.decode()}
    [event] = net_events(asking, response)
    assert (event["detail"]["decision"], event["detail"]["host"]) == ("allowed", "a.ask.test")


# --- an upstream server behind the proxy ------------------------------------------------------------

FETCH_SERVER = Path(__file__).resolve().parents[1] / "upstreams" / "fetch_server.py"


def fetch_upstream(make_gateway: GatewayFactory, network: dict[str, Any], more: dict[str, Any]) -> GatewayHome:
    """A gateway whose upstream `web` is tests/upstreams/fetch_server.py behind the proxy with `network`."""
    return gateway_with(
        make_gateway,
        {"fetch-server": f"#!{sys.executable}\n" + FETCH_SERVER.read_text()},
        {
            "tools": {"allowlist": ["web__fetch"]},
            "sandbox": {"allowed_paths": ["bin"]},
            "upstreams": {
                "web": {"command": ["bin/fetch-server"], "tools": ["fetch"], "timeout_s": 60, "network": network}
            },
            **more,
        },
    )


def test_an_upstream_server_reaches_an_allowed_host_through_its_proxy_and_nothing_else(
    make_gateway: GatewayFactory, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    port = origin.server_address[1]
    gw = fetch_upstream(make_gateway, {"allow": [f"origin.test:{port}"], "resolve": {"origin.test": "127.0.0.1"}}, {})
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    token = gw.token("alice")
    allowed = session.call_tool("web__fetch", {"url": f"http://origin.test:{port}/"}, token, timeout=120)
    refused = session.call_tool("web__fetch", {"url": f"http://127.0.0.1:{port}/"}, token, timeout=120)
    assert json.loads(allowed["result"]["content"][0]["text"]) == {"status": 200, "body": BODY.decode()}
    answer = json.loads(refused["result"]["content"][0]["text"])
    assert answer["status"] == 403 and "upstreams.web.network" in answer["body"]
    for response, decision in ((allowed, "allowed"), (refused, "refused")):
        run_id = response["result"]["_meta"]["mcp-write-gateway/run_id"]
        events = gw.events_of(run_id)
        kinds = [e["event_type"] for e in events]
        assert kinds.index("NET_CONNECT") < kinds.index("UPSTREAM_CALL")
        [event] = [e for e in events if e["event_type"] == "NET_CONNECT"]
        assert event["detail"]["decision"] == decision


def test_an_upstream_calls_ended_connection_is_on_its_card_while_the_call_is_in_flight(
    make_gateway: GatewayFactory, open_session: SessionFactory, origin: OriginServer
) -> None:
    """The server fetches once (that connection ends), then holds a second fetch: while the call is in flight, its
    card in the console (the real app's route) shows the first connection; after it, one NET_CONNECT each, before
    UPSTREAM_CALL (decision 98)."""
    port = origin.server_address[1]
    gw = fetch_upstream(make_gateway, {"allow": [f"origin.test:{port}"], "resolve": {"origin.test": "127.0.0.1"}}, {})
    gw.users.add("ada", "ADMIN", ("default",), PASSWORDS["ada"])
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    url = f"http://origin.test:{port}"
    request_id = session.send_call("web__fetch", {"url": url + "/x", "then": url + "/hold"}, gw.token("alice"))
    try:
        with running_app(gw) as app:
            ada = signed_in(app, "ada")
            deadline = time.monotonic() + 90
            live: list[Any] = []
            while not live:
                assert time.monotonic() < deadline, "the call's connection never showed on its card"
                session.pump(0.1)
                cards = ada.get("/api/calls").json()["cards"]
                live = [c for c in cards if c["tool_name"] == "web__fetch" and c["connections"]]
            [card] = live
            assert card["status"] == "running" and not origin.released.is_set()
            assert [(c["host"], c["decision"]) for c in card["connections"]] == [("origin.test", "allowed")]
    finally:
        origin.released.set()
    response = session.wait_response(request_id, timeout=90)
    answer = json.loads(response["result"]["content"][0]["text"])
    assert answer["first"]["status"] == 200 and answer["then"]["status"] == 200
    kinds = [e["event_type"] for e in gw.events_of(card["run_id"])]
    assert kinds.count("NET_CONNECT") == 2 and kinds[-3:] == ["NET_CONNECT", "UPSTREAM_CALL", "TOOL_FINISHED"], kinds
    assert gw.chain_ok()


def test_an_upstream_servers_ask_host_goes_to_the_person_of_the_call_in_flight_and_its_own_traffic_is_refused(
    make_gateway: GatewayFactory, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    port = origin.server_address[1]
    network = {"ask": [f"*.ask.test:{port}"], "resolve": {f"{h}.ask.test": "127.0.0.1" for h in ("a", "b", "c")}}
    gw = fetch_upstream(make_gateway, network, {"consent": {"timeout_s": 5}})
    session = open_session(gw, capabilities=FORM_ELICITATION)
    token = gw.token("alice")
    asked: list[str] = []

    def person(host_answer: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def respond(message: dict[str, Any]) -> dict[str, Any]:
            text = message["params"]["message"]
            asked.append(text)
            decision = host_answer if "network:" in text else "allow_once"  # the call's own question: allowed
            return {"action": "accept", "content": {"decision": decision}}

        return respond

    def call(host: str, **more: object) -> dict[str, Any]:
        response = session.call_tool("web__fetch", {"url": f"http://{host}:{port}/", **more}, token, timeout=120)
        return dict(json.loads(response["result"]["content"][0]["text"]), run_id=run_id_of(response))

    def run_id_of(response: dict[str, Any]) -> str:
        return str(response["result"]["_meta"]["mcp-write-gateway/run_id"])

    session.responder = person("allow_once")
    allowed = call("a.ask.test")
    assert (allowed["status"], allowed["body"]) == (200, BODY.decode())
    assert any("network:a.ask.test" in a and "wants to connect to a.ask.test" in a for a in asked)
    [question] = [e for e in gw.all_events() if e["tool_name"] == "network:a.ask.test"]
    assert (question["user"], question["detail"]["decision"], question["detail"]["for_run"]) == (
        "alice", "ALLOW_ONCE", allowed["run_id"],
    )  # fmt: skip

    session.responder = person("deny_always")
    denied = call("b.ask.test")
    assert denied["status"] == 403 and "refused by a person" in denied["body"]
    assert "upstreams.web.network" in denied["body"]

    asked.clear()
    session.responder = person("allow_once")
    later = call("c.ask.test", later=True)  # returns at once; the server fetches a second later, in no call
    time.sleep(3)
    after = call("a.ask.test")  # allowed once before: asked again, and answered
    assert after["status"] == 200
    assert not any("network:c.ask.test" in a for a in asked)  # nobody was asked about the server's own traffic
    records = [
        e["detail"]
        for run_id in (later["run_id"], after["run_id"])
        for e in gw.events_of(run_id)
        if e["event_type"] == "NET_CONNECT"
    ]
    [background] = [r for r in records if r["host"] == "c.ask.test"]
    assert (background["decision"], background["reason"], background["address"]) == (
        "refused", "needs_a_person", None,
    )  # fmt: skip
    assert gw.chain_ok()


# --- a hostile run -------------------------------------------------------------------------------------

HOSTILE = f"""\
#!{sys.executable}
import json, socket, ssl, sys, contextlib
out = {{}}
mode = sys.argv[1].split("/")[3]
if mode == "flood":  # 40 held open and silent (32 served, waiting for a head), then 1,460 more: 503 at once
    held = [socket.create_connection(("127.0.0.1", 3128), timeout=20) for _ in range(40)]
    answers = {{}}
    for _ in range(1460):
        with socket.create_connection(("127.0.0.1", 3128), timeout=20) as s:
            s.shutdown(socket.SHUT_WR)
            first = s.recv(12).decode()
            answers[first] = answers.get(first, 0) + 1
    out["answers"] = answers
elif mode == "escape":  # every way out but the proxy
    for name, make in (
        ("udp_dns", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53))),
        ("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
        ("resolve", lambda: socket.getaddrinfo("example.com", 443)),
        ("tcp_direct", lambda: socket.create_connection(("1.1.1.1", 443), timeout=3)),
        ("tcp_loopback", lambda: socket.create_connection(("127.0.0.1", 22), timeout=3)),
    ):
        try:
            make()
            out[name] = "reached"
        except OSError as exc:
            out[name] = type(exc).__name__
elif mode == "sni":  # CONNECT an allowed host, then a ClientHello naming another
    host = sys.argv[1].split("/")[2]
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="evil.test")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(f"CONNECT {{host}} HTTP/1.1\\r\\n\\r\\n".encode())
    head = s.recv(4096)
    s.sendall(outgoing.read())
    out["head"] = head.decode().split("\\r\\n")[0]
    out["after"] = len(s.recv(4096))
print(json.dumps(out))
"""


@pytest.fixture
def hostile(make_gateway: GatewayFactory, origin: http.server.ThreadingHTTPServer) -> GatewayHome:
    port = origin.server_address[1]
    return gateway_with(
        make_gateway,
        {"hostile": HOSTILE},
        {
            "tools": {"allowlist": ["hostile"], "declared": {"hostile": tool(["bin/hostile", "{url}"])}},
            "sandbox": {
                "allowed_paths": ["bin"],
                "network": {"allow": [f"origin.test:{port}"], "resolve": {"origin.test": "127.0.0.1"}},
            },
        },
    )


def test_a_run_that_floods_the_proxy_gets_503_past_the_caps_and_one_event_for_them(
    hostile: GatewayHome, open_session: SessionFactory
) -> None:
    with session_of(hostile, open_session) as call:
        response = call("hostile", "http://x/flood")
    assert fetched(response)["answers"] == {"HTTP/1.1 503": 1460}  # 32 open already: every one answered at once
    [summary] = net_events(hostile, response)  # the 32 that sent nothing are not recorded; the 1,468 refused, once
    assert (summary["detail"]["reason"], summary["detail"]["count"]) == ("connection_cap", 1468)


def test_a_run_has_no_way_out_but_the_proxy(hostile: GatewayHome, open_session: SessionFactory) -> None:
    with session_of(hostile, open_session) as call:
        response = call("hostile", "http://x/escape")
    assert "reached" not in fetched(response).values(), fetched(response)


def test_a_client_hello_naming_another_host_than_connect_is_refused_inside_a_run(
    hostile: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    with session_of(hostile, open_session) as call:
        response = call("hostile", f"http://origin.test:{origin.server_address[1]}/sni")
    assert fetched(response) == {"head": "HTTP/1.1 200 Connection established", "after": 0}
    [event] = net_events(hostile, response)
    assert (event["detail"]["reason"], event["detail"]["address"]) == ("sni_mismatch", None)


def test_a_cancelled_run_still_records_its_connections_before_its_end(
    proxied: GatewayHome, open_session: SessionFactory, origin: OriginServer
) -> None:
    session = open_session(proxied, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    url = f"http://origin.test:{origin.server_address[1]}/slow"
    request_id = session.send_call("fetch", {"url": url}, proxied.token("alice"))
    deadline = time.monotonic() + 60
    run_id = None
    while run_id is None and time.monotonic() < deadline:  # the run is on once its proxy has dialled the origin
        started = [e for e in proxied.all_events() if e["event_type"] == "TOOL_STARTED"]
        run_id = started[0]["run_id"] if started and origin.slow_asked.is_set() else None
        session.pump(0.1)  # the tool's consent question answered meanwhile
    assert run_id is not None
    session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})
    while time.monotonic() < deadline and "TOOL_FINISHED" not in [e["event_type"] for e in proxied.events_of(run_id)]:
        session.pump(0.1)
    events = proxied.events_of(run_id)
    kinds = [e["event_type"] for e in events]
    assert kinds[-2:] == ["NET_CONNECT", "TOOL_FINISHED"]
    assert events[-1]["detail"] == {"status": "cancelled"}
    assert (events[-2]["detail"]["host"], events[-2]["detail"]["decision"]) == ("origin.test", "allowed")
    assert proxied.chain_ok()


HOLD = f"""\
#!{sys.executable}
import json, sys, urllib.request
first = urllib.request.urlopen(sys.argv[1] + "/x", timeout=20).read()
second = urllib.request.urlopen(sys.argv[1] + "/hold", timeout=90).read()
print(json.dumps({{"first": first.decode(), "second": second.decode()}}))
"""


def holding(make_gateway: GatewayFactory, origin: OriginServer) -> GatewayHome:
    """A gateway whose tool `hold` fetches /x from the origin, then /hold (held until the test releases it)."""
    port = origin.server_address[1]
    return gateway_with(
        make_gateway,
        {"hold": HOLD},
        {
            "tools": {"allowlist": ["hold"], "declared": {"hold": tool(["bin/hold", "{url}"])}},
            "sandbox": {
                "allowed_paths": ["bin"],
                "network": {"allow": [f"origin.test:{port}"], "resolve": {"origin.test": "127.0.0.1"}},
            },
        },
    )


def test_a_live_runs_connections_show_on_its_card_in_the_console_while_it_runs(
    db_url: str, make_gateway: GatewayFactory, open_session: SessionFactory, origin: OriginServer
) -> None:
    """A run fetches once (that connection closes), then holds a second connection open until the test lets it go.
    While it holds, the console (the real app in process for its routes, a real `mcp-gateway console` for its
    stream) shows the first connection on the running card; after the run, each connection has exactly one
    NET_CONNECT, between TOOL_STARTED and SANDBOX_EXEC, and the card shows both (decision 98)."""
    port = origin.server_address[1]
    gw = holding(make_gateway, origin)
    gw.users.add("ada", "ADMIN", ("default",), PASSWORDS["ada"])
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    with running_console(gw) as base, running_app(gw) as app:
        stream = Stream(base, session_cookie(base, "ada", PASSWORDS["ada"]), "?after=0")
        try:
            request_id = session.send_call("hold", {"url": f"http://origin.test:{port}"}, gw.token("alice"))
            deadline = time.monotonic() + 90
            live: dict[str, Any] | None = None
            while live is None:
                assert time.monotonic() < deadline, f"no live card with a connection: {stream.cards()}"
                session.pump(0.1)  # the tool's consent question answered meanwhile
                live = next((c for c in stream.cards() if c["status"] == "running" and c["connections"]), None)
            assert not origin.released.is_set()  # the run holds its second connection: it is on
            [first, *held] = live["connections"]
            assert (first["host"], first["port"], first["method"], first["decision"], first["reason"]) == (
                "origin.test", port, "GET", "allowed", None,
            )  # fmt: skip
            assert first["bytes_down"] > len(BODY) and first["bytes_up"] > 0 and not first["open"]
            # The held one shows as open once it has been (decision 102): nothing down yet.
            assert [(c["open"], c["bytes_down"]) for c in held] in ([], [(True, 0)])
            assert live["connections_total"] == 1 + len(held)
            run_id = str(live["run_id"])
            ada = signed_in(app, "ada")  # the route reads the same card, still running
            routed = ada.get(f"/api/calls/{run_id}").json()["card"]
            assert routed["status"] == "running" and routed["connections"][0] == first
            assert [(c["open"], c["bytes_down"]) for c in routed["connections"][1:]] in ([], [(True, 0)])
            origin.released.set()
            response = session.wait_response(request_id, timeout=90)
        finally:
            origin.released.set()
            stream.close()
    assert json.loads(response["result"]["content"][0]["text"].splitlines()[0]) == {
        "first": BODY.decode(), "second": BODY.decode(),
    }  # fmt: skip
    events = gw.events_of(run_id)
    kinds = [e["event_type"] for e in events]
    assert kinds.count("NET_CONNECT") == 2, kinds  # one per connection: the live one was not written again
    assert kinds.index("TOOL_STARTED") < kinds.index("NET_CONNECT") and kinds[-3:] == [
        "NET_CONNECT", "SANDBOX_EXEC", "TOOL_FINISHED",
    ], kinds  # fmt: skip
    live_event = events[kinds.index("NET_CONNECT")]
    assert live_event["id"] <= int(live["last_event_id"])  # committed while the run was on, the card moved with it
    assert gw.chain_ok()
    ended = CallStore(gw.engine).fetch(run_id)
    assert ended is not None and ended.status == "done" and ended.connections_total == 2
    assert [c["bytes_down"] > len(BODY) for c in ended.connections] == [True, True]


def test_a_run_cancelled_after_a_live_write_records_each_connection_once_before_its_end(
    make_gateway: GatewayFactory, open_session: SessionFactory, origin: OriginServer
) -> None:
    """The first connection is written while the run is on; the call is cancelled while the second is held: the
    writer ends with the run, the cut connection is written with the terminal event, one NET_CONNECT each."""
    gw = holding(make_gateway, origin)
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    url = f"http://origin.test:{origin.server_address[1]}"
    request_id = session.send_call("hold", {"url": url}, gw.token("alice"))
    deadline = time.monotonic() + 90
    try:
        written: list[dict[str, Any]] = []
        while not written:  # the first connection's NET_CONNECT, committed while the run holds the second
            assert time.monotonic() < deadline, "no connection was written while the run was on"
            session.pump(0.1)
            written = [e for e in gw.all_events() if e["event_type"] == "NET_CONNECT"]
        run_id = written[0]["run_id"]
        session.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}})
        while "TOOL_FINISHED" not in [e["event_type"] for e in gw.events_of(run_id)]:
            assert time.monotonic() < deadline, "the cancelled call left no end"
            session.pump(0.1)
    finally:
        origin.released.set()
    events = gw.events_of(run_id)
    kinds = [e["event_type"] for e in events]
    assert kinds[-3:] == ["NET_CONNECT", "NET_CONNECT", "TOOL_FINISHED"], kinds
    assert kinds.count("NET_CONNECT") == 2 and events[-1]["detail"] == {"status": "cancelled"}
    assert [e["detail"]["bytes_down"] > len(BODY) for e in events[-3:-1]] == [True, False]  # the held one was cut
    assert gw.chain_ok()


def test_a_connection_the_audit_log_refuses_while_the_run_is_on_ends_the_run_at_once_with_audit_unavailable(
    make_gateway: GatewayFactory, open_session: SessionFactory, origin: OriginServer
) -> None:
    """The live write of a connection fails (the log refuses NET_CONNECT): the run is killed while it still holds
    its second connection, the call answers -32603 audit_unavailable at once, never hangs, and its record is
    closed as failed (decision 98: the same handling as the trail's other writes)."""
    gw = holding(make_gateway, origin)
    with gw.engine.begin() as connection:
        connection.execute(
            sqlalchemy.text(
                "CREATE TRIGGER lose_connections BEFORE INSERT ON audit_events "
                "WHEN NEW.event_type = 'NET_CONNECT' BEGIN SELECT RAISE(ABORT, 'disk failure'); END"
            )
        )
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    started = time.monotonic()
    try:
        response = session.call_tool(
            "hold", {"url": f"http://origin.test:{origin.server_address[1]}"}, gw.token("alice"), timeout=80
        )
    finally:
        origin.released.set()
    assert time.monotonic() - started < 80  # the held connection would have lasted 90 s
    assert (response["error"]["code"], response["error"]["data"]["reason"]) == (-32603, "audit_unavailable")
    run_id = response["error"]["data"]["run_id"]
    kinds = [e["event_type"] for e in gw.events_of(run_id)]
    assert "TOOL_STARTED" in kinds and "NET_CONNECT" not in kinds and "SANDBOX_EXEC" not in kinds, kinds
    with gw.engine.connect() as connection:
        status = connection.execute(select(db.runs.c.status).where(db.runs.c.run_id == run_id)).scalar_one()
    assert status == "failed"
    assert gw.chain_ok()


def test_policy_check_and_explain_show_what_a_run_may_reach(proxied: GatewayHome) -> None:
    checked = proxied.cli("policy", "check")
    assert checked.returncode == 0, checked.stderr
    assert "sandbox.network: through the gateway's proxy (deny: denied.test; allow: origin.test:" in checked.stdout
    explained = proxied.cli(
        "policy", "explain", "--role", "USER", "--tool", "fetch", "--args", '{"url": "http://origin.test/"}'
    )
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert "network: through the gateway's proxy (deny: denied.test;" in explained.stdout


def test_an_ask_host_goes_to_the_approver_when_the_client_cannot_be_asked_and_no_answer_refuses(
    asking: GatewayHome, open_session: SessionFactory, origin: http.server.ThreadingHTTPServer
) -> None:
    """No elicitation: the tool's question and then the host's wait in the database, where the approver (or the
    console) answers them through gateway/consent/actions.py; a host nobody answers is refused at the timeout."""
    desk = ConsentDesk.on(asking.engine, SystemClock())
    by = Actor("approvals:test", Channel.APPROVER)
    session = open_session(asking)  # no elicitation capability
    token = asking.token("alice")
    port = origin.server_address[1]

    def call_answering(url: str, host_decision: Decision | None) -> dict[str, Any]:
        request_id = session.send_call("fetch", {"url": url}, token)
        deadline = time.monotonic() + 90
        seen: set[str] = set()
        while time.monotonic() < deadline:
            for question in desk.consent_store.fetch_pending(desk.clock.now()):
                if question.id in seen:
                    continue
                seen.add(question.id)
                if question.tool_name == "fetch":
                    decide_question(desk, question.id, Decision.ALLOW_ONCE, by)
                elif host_decision is not None:
                    assert question.tool_name in {"network:a.ask.test", "network:b.ask.test"}
                    decide_question(desk, question.id, host_decision, by)
            try:
                return session.wait_response(request_id, timeout=0.2)
            except queue.Empty:
                continue
        raise AssertionError("no answer")

    allowed = call_answering(f"http://a.ask.test:{port}/", Decision.ALLOW_ALWAYS)
    assert fetched(allowed) == {"status": 200, "body": BODY.decode()}
    again = call_answering(f"http://a.ask.test:{port}/", None)  # the stored Allow always answers: nobody asked
    assert fetched(again)["status"] == 200
    started = time.monotonic()
    unanswered = call_answering(f"http://b.ask.test:{port}/", None)  # consent.timeout_s is 5
    assert fetched(unanswered)["status"] == 403
    assert time.monotonic() - started >= 5
    [event] = net_events(asking, unanswered)
    assert event["detail"]["reason"] == "denied_by_person"
    decisions = [
        e["detail"]
        for e in asking.all_events()
        if e["tool_name"] == "network:b.ask.test" and e["event_type"] == "mcp.permission.decision"
    ]
    assert [(d["decision"], d["origin"]) for d in decisions] == [("DENY_ONCE", "timeout")]


DRIPPING = f"""\
#!{sys.executable}
import json, sys, urllib.request
body = urllib.request.urlopen(sys.argv[1] + "/drip", timeout=120).read()
print(json.dumps({{"bytes": len(body)}}))
"""


def dripping(make_gateway: GatewayFactory, origin: OriginServer) -> GatewayHome:
    """A gateway whose tool `drip` downloads /drip: half of it at once, the rest once the test releases it."""
    port = origin.server_address[1]
    return gateway_with(
        make_gateway,
        {"drip": DRIPPING},
        {
            "tools": {"allowlist": ["drip"], "declared": {"drip": tool(["bin/drip", "{url}"])}},
            "sandbox": {
                "allowed_paths": ["bin"],
                "network": {"allow": [f"origin.test:{port}"], "resolve": {"origin.test": "127.0.0.1"}},
            },
        },
    )


def connections_of(card: dict[str, Any]) -> list[dict[str, Any]]:
    shown = card["connections"]
    assert isinstance(shown, list)
    return shown


def open_rows(gw: GatewayHome, run_id: str | None = None) -> list[dict[str, Any]]:
    o = db.open_connections
    query = select(o) if run_id is None else select(o).where(o.c.run_id == run_id)
    with gw.engine.connect() as connection:
        return [dict(row._mapping) for row in connection.execute(query)]


def test_a_connection_still_open_shows_on_the_running_card_with_its_bytes_so_far_then_once_closed(
    db_url: str, make_gateway: GatewayFactory, open_session: SessionFactory, origin: OriginServer
) -> None:
    """A run downloads 512 KiB; the origin sends half and holds the rest. While it holds, the console (a real
    `mcp-gateway console`'s stream, and the app's routes in process) shows the connection on the running card as
    open, with its bytes so far, and the audit log has no NET_CONNECT for it yet; once let go, the run ends, the
    connection has exactly one NET_CONNECT with every byte, its row is gone and the card shows it closed
    (decision 102)."""
    port = origin.server_address[1]
    gw = dripping(make_gateway, origin)
    gw.users.add("ada", "ADMIN", ("default",), PASSWORDS["ada"])
    session = open_session(gw, capabilities=FORM_ELICITATION)
    session.responder = allow_once
    half = len(DRIP) // 2
    with running_console(gw) as base, running_app(gw) as app:
        stream = Stream(base, session_cookie(base, "ada", PASSWORDS["ada"]), "?after=0")
        try:
            request_id = session.send_call("drip", {"url": f"http://origin.test:{port}"}, gw.token("alice"))
            deadline = time.monotonic() + 90
            live: dict[str, Any] | None = None
            while live is None:
                assert time.monotonic() < deadline, f"no live card with an open connection: {stream.cards()}"
                session.pump(0.1)  # the tool's consent question answered meanwhile
                live = next(
                    (
                        c for c in stream.cards()
                        if c["status"] == "running"
                        and any(x["open"] and x["bytes_down"] >= half for x in connections_of(c))
                    ),
                    None,
                )  # fmt: skip
            assert not origin.released.is_set()  # the origin holds the rest: the connection is open
            [shown] = connections_of(live)
            assert (shown["host"], shown["port"], shown["method"], shown["decision"], shown["open"]) == (
                "origin.test", port, "GET", "allowed", True,
            )  # fmt: skip
            assert half <= shown["bytes_down"] < len(DRIP) and shown["bytes_up"] > 0
            assert live["connections_total"] == 1
            run_id = str(live["run_id"])
            assert [e["event_type"] for e in gw.events_of(run_id)].count("NET_CONNECT") == 0, "not in the log yet"
            [row] = open_rows(gw, run_id)
            assert (row["host"], row["port"], row["bytes_down"]) == ("origin.test", port, shown["bytes_down"])
            ada = signed_in(app, "ada")  # the route reads the same card, still running, the connection still open
            routed = ada.get(f"/api/calls/{run_id}").json()["card"]
            assert routed["status"] == "running" and routed["connections"] == [shown]
            origin.released.set()
            response = session.wait_response(request_id, timeout=90)
            closed = None
            while closed is None:  # the stream sends the card again once the connection closed
                assert time.monotonic() < deadline, f"the closed connection never reached the stream: {stream.cards()}"
                time.sleep(0.1)
                mine = [c for c in stream.cards() if c["run_id"] == run_id]
                closed = next((c for c in mine if connections_of(c) and not connections_of(c)[-1]["open"]), None)
        finally:
            origin.released.set()
            stream.close()
    assert json.loads(response["result"]["content"][0]["text"].splitlines()[0]) == {"bytes": len(DRIP)}
    events = gw.events_of(run_id)
    nets = [e["detail"] for e in events if e["event_type"] == "NET_CONNECT"]
    assert len(nets) == 1, events  # one per connection: its rows were never events
    assert nets[0]["decision"] == "allowed" and len(DRIP) < nets[0]["bytes_down"] < len(DRIP) + 1024
    assert [(c["open"], c["bytes_down"]) for c in connections_of(closed)] == [(False, nets[0]["bytes_down"])]
    assert open_rows(gw) == []
    assert gw.chain_ok()
    ended = CallStore(gw.engine).fetch(run_id)
    assert ended is not None and ended.status == "done" and [c["open"] for c in ended.connections] == [False]


def test_a_connection_open_when_its_gateway_is_killed_stays_on_the_card_until_the_sweep_logs_it_once(
    db_url: str, make_gateway: GatewayFactory, open_session: SessionFactory, origin: OriginServer
) -> None:
    """The gateway is killed (`kill -9`) while its run holds a download open: the card still shows the connection
    open with its bytes so far; the next sweep (another gateway's) closes the run and writes that connection's one
    NET_CONNECT (`run_abandoned`, the bytes its card last showed) before the run's end, and deletes its row."""
    gw = dripping(make_gateway, origin)
    runner = open_session(gw, env=SWEEPING, capabilities=FORM_ELICITATION)
    runner.responder = allow_once
    half = len(DRIP) // 2
    try:
        runner.send_call("drip", {"url": f"http://origin.test:{origin.server_address[1]}"}, gw.token("alice"))
        deadline = time.monotonic() + 90
        rows: list[dict[str, Any]] = []
        while not (rows and rows[0]["bytes_down"] >= half):
            assert time.monotonic() < deadline, "the held connection never got its row"
            runner.pump(0.1)
            rows = open_rows(gw)
        [row] = rows
        run_id = str(row["run_id"])
        os.kill(runner.process.pid, signal.SIGKILL)
        runner.process.wait(timeout=10)
        card = CallStore(gw.engine).fetch(run_id)  # the dead gateway's card still shows it, as last written
        assert card is not None and card.status == "running"
        assert [(c["open"], c["bytes_down"]) for c in card.connections] == [(True, row["bytes_down"])]
        survivor = open_session(gw, env=SWEEPING)  # the one gateway left to sweep, started once the card was seen
        while (card := CallStore(gw.engine).fetch(run_id)) is not None and card.status == "running":
            assert time.monotonic() < deadline, survivor.stderr_text()
            time.sleep(0.1)
    finally:
        origin.released.set()
    events = gw.events_of(run_id)
    assert [e["event_type"] for e in events][-2:] == ["NET_CONNECT", "TOOL_FINISHED"], events
    lost, finished = events[-2]["detail"], events[-1]["detail"]
    assert finished == {"status": "abandoned", "reason": "gateway_lost"}
    assert (lost["host"], lost["decision"], lost["reason"], lost["bytes_down"], lost["bytes_up"]) == (
        "origin.test", "allowed", "run_abandoned", row["bytes_down"], row["bytes_up"],
    )  # fmt: skip
    assert [e["event_type"] for e in events].count("NET_CONNECT") == 1
    assert open_rows(gw) == []
    assert card is not None and [(c["open"], c["reason"]) for c in card.connections] == [(False, "run_abandoned")]
    assert gw.chain_ok()
