"""gateway/proxy/: the egress proxy over real sockets on 127.0.0.1, with real clients (urllib, curl, raw bytes).

Every origin is a listener the test opened on 127.0.0.1, reached through `resolve` (or a resolver the test
hands in, which records what was asked); `dial` is wrapped so a test can show that nothing was dialled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from ipaddress import ip_address
from types import MappingProxyType

import anyio
import pytest

from gateway.proxy import ConnectionLog, NetConnect, Outcome, ProxyLimits, RefusedFor, serve_proxy
from gateway.proxy.server import Resolver, dial, resolve_host
from gateway.rules.egress import Address, EgressRules, parse_pattern

LOOPBACK = ip_address("127.0.0.1")
WAIT_S = 30


def rules(
    allow: tuple[str, ...] = (), ask: tuple[str, ...] = (), deny: tuple[str, ...] = (), resolve: tuple[str, ...] = ()
) -> EgressRules:
    return EgressRules(
        allow=tuple(parse_pattern(p) for p in allow),
        ask=tuple(parse_pattern(p) for p in ask),
        deny=tuple(parse_pattern(p) for p in deny),
        resolve=MappingProxyType(dict.fromkeys(resolve, LOOPBACK)),
    )


@dataclass
class Origin:
    """An HTTP/1.1 origin on 127.0.0.1 that answers every request with `body` and keeps what it received."""

    body: bytes = b"hello from the origin"
    port: int = 0
    accepted: int = 0
    received: list[bytes] = field(default_factory=list)
    raw: bool = False
    """Keep the bytes as they come and answer nothing (a tunnel's far end)."""
    lingers: bool = False
    """After its answer, send bytes past it and keep the connection open (Connection: close ignored)."""
    chunked: bool = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            if self.raw:
                data = await reader.read(65536)
                self.received.append(data)
                writer.write(b"raw:" + data[:16])
                await writer.drain()
                return
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            self.received.append(head + (await reader.readexactly(length) if length else b""))
            if self.chunked:
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(self.body), self.body))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nKeep-Alive: timeout=5\r\n\r\n" % len(self.body))
                writer.write(self.body)
            await writer.drain()
            if self.lingers:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nsmuggle")
                await writer.drain()
                await asyncio.sleep(WAIT_S)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@dataclass
class Proxy:
    port: int
    records: list[NetConnect]
    dialled: list[tuple[Address, int]]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def ended(self, n: int) -> list[NetConnect]:
        """The first `n` records, once that many connections have ended."""
        with anyio.fail_after(WAIT_S):
            while len(self.records) < n:
                await anyio.sleep(0.01)
        return self.records[:n]


@contextlib.asynccontextmanager
async def origin_and_proxy(
    egress: Callable[[int], EgressRules],
    origin: Origin | None = None,
    limits: ProxyLimits | None = None,
    resolve: Resolver | None = None,
    ask: Callable[[str, int, str], Awaitable[bool]] | None = None,
    *,
    splice: bool = True,
) -> AsyncIterator[tuple[Origin, Proxy]]:
    origin = origin or Origin()
    server = await asyncio.start_server(origin.handle, "127.0.0.1", 0)
    origin.port = server.sockets[0].getsockname()[1]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    proxy = Proxy(listener.getsockname()[1], [], [])

    async def spying_dial(address: Address, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        proxy.dialled.append((address, port))
        return await dial(address, port)

    serve = functools.partial(
        serve_proxy,
        listener,
        egress(origin.port),
        limits or ProxyLimits(max_bytes=64 * 1024 * 1024),
        proxy.records.append,
        dial=spying_dial,
        ask=ask,
        resolve=resolve or resolve_host,
        splice=splice,
    )
    async with server, anyio.create_task_group() as group:
        group.start_soon(serve)
        yield origin, proxy
        group.cancel_scope.cancel()
    assert listener.fileno() == -1  # the proxy closed its listener when it was cancelled


def fetch(proxy_url: str, url: str, data: bytes | None = None) -> tuple[int, bytes]:
    """urllib through the proxy, as a run's Python would use HTTP_PROXY."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url}))
    try:
        request = urllib.request.Request(url, data=data)  # noqa: S310  (the test's own http:// URL)
        with opener.open(request, timeout=WAIT_S) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def exchange(port: int, data: bytes, *, read_until_close: bool = True) -> bytes:
    """Raw bytes to the proxy; what it answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        with anyio.fail_after(WAIT_S):
            return await reader.read(-1) if read_until_close else await reader.read(65536)
    finally:
        writer.close()


def client_hello(server_name: str) -> bytes:
    """A real TLS ClientHello for `server_name`, as Python's ssl writes it."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@dataclass
class Seen:
    answer: bytes = b""
    records: list[NetConnect] = field(default_factory=list)
    dialled: list[tuple[Address, int]] = field(default_factory=list)
    accepted: int = 0
    status: int = 0
    received: list[bytes] = field(default_factory=list)


# --- let through ---------------------------------------------------------------------------


def test_an_allowed_host_is_fetched_by_urllib_its_head_rewritten_and_its_connection_recorded() -> None:
    seen = Seen()

    async def main() -> None:
        egress = lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",))  # noqa: E731
        async with origin_and_proxy(egress) as (origin, proxy):
            url = f"http://Origin.TEST:{origin.port}/a/b?c=1#frag"
            seen.status, seen.answer = await anyio.to_thread.run_sync(fetch, proxy.url, url, b"payload")
            seen.records = await proxy.ended(1)
            seen.received = origin.received

    anyio.run(main)
    assert (seen.status, seen.answer) == (200, b"hello from the origin")
    [request] = seen.received
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /a/b?c=1 HTTP/1.1"  # origin form, no fragment
    assert b"Connection: close" in lines
    assert not any(line.lower().startswith((b"proxy-", b"keep-alive")) for line in lines)
    assert body == b"payload"
    [record] = seen.records
    assert (record.host, record.decision, record.reason, record.address) == (
        "origin.test", Outcome.ALLOWED, None, "127.0.0.1",
    )  # fmt: skip
    assert record.rule is not None and record.rule.startswith("allow: origin.test:")
    assert record.bytes_up >= len(request) and record.bytes_down > len(b"hello from the origin")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
@pytest.mark.parametrize("tunnel", [False, True], ids=["absolute-form", "CONNECT"])
def test_curl_fetches_an_allowed_host_plainly_and_through_a_tunnel(tunnel: bool) -> None:
    seen = Seen()

    async def main() -> None:
        egress = lambda port: rules(allow=(f"*.example.test:{port}",), resolve=("api.example.test",))  # noqa: E731
        async with origin_and_proxy(egress) as (origin, proxy):
            argv = ["curl", "-sS", "--max-time", "20", "-x", proxy.url, f"http://api.example.test:{origin.port}/x"]
            done = await anyio.run_process([*argv, *(["-p"] if tunnel else [])], check=False)
            seen.status, seen.answer = done.returncode, done.stdout
            seen.records = await proxy.ended(1)

    anyio.run(main)
    assert (seen.status, seen.answer) == (0, b"hello from the origin")
    [record] = seen.records
    assert (record.method, record.decision) == ("CONNECT" if tunnel else "GET", Outcome.ALLOWED)


# --- refused ---------------------------------------------------------------------------------


def refused(
    egress: Callable[[int], EgressRules],
    request: Callable[[int], bytes],
    *,
    origin: Origin | None = None,
    limits: ProxyLimits | None = None,
    resolve: Resolver | None = None,
    ask: Callable[[str, int, str], Awaitable[bool]] | None = None,
    splice: bool = True,
) -> Seen:
    """One raw request through the proxy: its answer, the records, what was dialled, what the origin accepted."""
    seen = Seen()

    async def main() -> None:
        async with origin_and_proxy(egress, origin, limits, resolve, ask, splice=splice) as (o, proxy):
            seen.answer = await exchange(proxy.port, request(o.port))
            seen.records = await proxy.ended(1)
            seen.dialled = list(proxy.dialled)
            seen.accepted = o.accepted

    anyio.run(main)
    return seen


DENYING = lambda port: rules(  # noqa: E731
    allow=("*", f"origin.test:{port}", "ok.test"),
    deny=("*.internal", "169.254.169.254"),
    resolve=("origin.test", "db.internal", "ok.test"),
)


@pytest.mark.parametrize(
    ("target", "reason", "words"),
    [
        ("db.internal:80", RefusedFor.DENIED_BY_RULE, "the rule 'deny: *.internal' in sandbox.network"),
        ("169.254.169.254:80", RefusedFor.DENIED_BY_RULE, "deny: 169.254.169.254"),
        ("127.0.0.1:{port}", RefusedFor.NO_RULE, "'*' never matches an IP address"),
        ("[::1]:{port}", RefusedFor.NO_RULE, "no rule in sandbox.network names it"),
        ("0x7f.1:{port}", RefusedFor.NO_RULE, "127.0.0.1"),  # read as WHATWG reads it: an IP literal
        ("2130706433:{port}", RefusedFor.NO_RULE, "127.0.0.1"),
        ("ok.test:{port}", RefusedFor.NO_RULE, "a pattern without ':port' stands for 80 and 443"),
    ],
)
@pytest.mark.parametrize("method", ["GET", "CONNECT"])
def test_a_refused_host_gets_403_naming_the_host_the_rule_and_the_key_and_nothing_is_dialled(
    method: str, target: str, reason: RefusedFor, words: str
) -> None:
    def request(port: int) -> bytes:
        where = target.format(port=port)
        if method == "CONNECT":
            return f"CONNECT {where} HTTP/1.1\r\nHost: {where}\r\n\r\n".encode()
        return f"GET http://{where}/ HTTP/1.1\r\n\r\n".encode()

    seen = refused(DENYING, request)
    answer = seen.answer
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert words.encode() in answer
    [record] = seen.records
    assert (record.decision, record.reason, record.method) == (Outcome.REFUSED, reason, method)
    assert seen.dialled == [] and seen.accepted == 0


def test_a_name_that_resolves_to_the_metadata_address_is_refused_before_any_connection() -> None:
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[Address]:
        asked.append(host)
        return [ip_address("169.254.169.254")]

    seen = refused(
        lambda port: rules(allow=("metadata.test",)),
        lambda port: b"GET http://metadata.test/latest/meta-data/ HTTP/1.1\r\n\r\n",
        resolve=resolver,
    )
    assert asked == ["metadata.test"]
    assert b"169.254.169.254, which is link-local" in seen.answer
    [record] = seen.records
    assert record.reason is RefusedFor.ADDRESS_NOT_PUBLIC
    assert seen.dialled == []


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.0.0.1", "::ffff:127.0.0.1", "fe80::1", "0.0.0.0", "fd00:ec2::254"],  # noqa: S104
)
def test_dns_rebinding_to_any_address_that_is_not_public_is_refused(address: str) -> None:
    async def resolver(host: str, port: int) -> list[Address]:
        return [ip_address("93.184.216.34"), ip_address(address)]  # one public, one not: refused whole

    seen = refused(
        lambda port: rules(allow=("rebind.test",)),
        lambda port: b"CONNECT rebind.test:443 HTTP/1.1\r\n\r\n",
        resolve=resolver,
    )
    assert seen.answer.startswith(b"HTTP/1.1 403")
    assert seen.dialled == []


def connect_to(host: str) -> Callable[[int], bytes]:
    return lambda port: f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode()


def test_ask_refuses_until_a_person_can_be_asked_and_lets_through_when_one_says_yes() -> None:
    seen = refused(
        lambda port: rules(ask=("*",), resolve=("origin.test",)),
        lambda port: b"CONNECT origin.test:443 HTTP/1.1\r\n\r\n",
    )
    assert b"needs a person's decision" in seen.answer
    assert seen.records[0].reason is RefusedFor.NEEDS_A_PERSON

    questions: list[tuple[str, int, str]] = []

    async def person(host: str, port: int, rule: str) -> bool:
        questions.append((host, port, rule))
        return host == "yes.test"

    for host, status in (("yes.test", b"200"), ("no.test", b"403")):
        seen = refused(
            lambda port: rules(ask=("*",), resolve=("yes.test", "no.test")),
            connect_to(host),
            ask=person,
            # The tunnel's wait for a ClientHello (2 s by default) is not this test's point: the answer is.
            limits=ProxyLimits(max_bytes=64 << 20, first_bytes_s=0.1),
        )
        assert seen.answer.startswith(b"HTTP/1.1 " + status)
    assert questions == [("yes.test", 443, "ask: *"), ("no.test", 443, "ask: *")]


# --- the request is read one way ---------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET http://origin.test:{port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",  # Host naming another host
        b"GET http://origin.test:{port}/ HTTP/1.1\r\nHost: origin.test:{port}\r\nHost: evil.test\r\n\r\n",
        b"GET http://origin.test:{port}/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST http://origin.test:{port}/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"GET http://origin.test:{port}/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"GET http://origin.test:{port}/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
        b"GET http://user@origin.test:{port}/ HTTP/1.1\r\n\r\n",
        b"GET https://origin.test:{port}/ HTTP/1.1\r\n\r\n",
        b"GET /relative HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n",
        b"CONNECT origin.test HTTP/1.1\r\n\r\n",
        b"CONNECT a@origin.test:{port} HTTP/1.1\r\n\r\n",
    ],
)
def test_a_request_read_two_ways_is_refused_with_400_and_nothing_is_dialled(request_bytes: bytes) -> None:
    seen = refused(
        lambda port: rules(allow=(f"origin.test:{port}", "evil.test"), resolve=("origin.test", "evil.test")),
        lambda port: request_bytes.replace(b"{port}", str(port).encode()),
    )
    assert seen.answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 501"))
    assert seen.dialled == []


def test_a_pipelined_second_request_never_reaches_anyone() -> None:
    def two(port: int) -> bytes:
        first = f"GET http://origin.test:{port}/one HTTP/1.1\r\n\r\n"
        return (first + "GET http://evil.test/two HTTP/1.1\r\n\r\n").encode()

    seen = refused(
        lambda port: rules(allow=(f"origin.test:{port}", "evil.test"), resolve=("origin.test", "evil.test")), two
    )
    assert seen.answer.startswith(b"HTTP/1.1 200 OK")
    assert seen.answer.count(b"HTTP/1.1") == 1
    assert len(seen.dialled) == 1


def test_a_chunked_body_is_copied_to_its_end_and_no_further() -> None:
    origin = Origin()

    def body(port: int) -> bytes:
        return (
            f"POST http://origin.test:{port}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\nhello\r\n0\r\n\r\nGET http://evil.test/ HTTP/1.1\r\n\r\n"
        ).encode()

    seen = refused(lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",)), body, origin=origin)
    assert seen.answer.startswith(b"HTTP/1.1 200")
    assert b"evil.test" not in b"".join(origin.received)


def test_a_head_over_the_cap_gets_431() -> None:
    seen = refused(
        lambda port: rules(allow=("*",)),
        lambda port: b"GET http://a.test/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    )
    assert seen.answer.startswith(b"HTTP/1.1 431")
    assert seen.records[0].reason is RefusedFor.HEAD_TOO_LARGE


# --- CONNECT and the TLS server name ------------------------------------------------------------


@pytest.mark.parametrize(
    ("server_name", "passes"), [("origin.test", True), ("ORIGIN.test", True), ("evil.test", False)]
)
def test_a_tunnel_opens_only_when_the_client_hello_names_the_connect_host(server_name: str, passes: bool) -> None:
    origin = Origin(raw=True)
    hello = client_hello(server_name)

    def request(port: int) -> bytes:
        return f"CONNECT origin.test:{port} HTTP/1.1\r\n\r\n".encode() + hello

    seen = refused(lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",)), request, origin=origin)
    answer = seen.answer
    assert answer.startswith(b"HTTP/1.1 200 Connection established\r\n\r\n")
    [record] = seen.records
    if passes:
        assert origin.received == [hello] and answer.endswith(b"raw:" + hello[:16])
        assert record.decision is Outcome.ALLOWED
    else:
        assert origin.received == [] and seen.dialled == []
        assert (record.decision, record.reason) == (Outcome.REFUSED, RefusedFor.SNI_MISMATCH)


def test_a_tunnel_whose_client_waits_is_dialled_and_its_late_client_hello_still_checked() -> None:
    origin = Origin(raw=True)
    seen: dict[str, object] = {}
    limits = ProxyLimits(max_bytes=1 << 20, first_bytes_s=0.2)

    async def main() -> None:
        egress = lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",))  # noqa: E731
        async with origin_and_proxy(egress, origin, limits) as (o, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"CONNECT origin.test:{o.port} HTTP/1.1\r\n\r\n".encode())
            with anyio.fail_after(WAIT_S):
                await reader.readuntil(b"\r\n\r\n")
                while not proxy.dialled:
                    await anyio.sleep(0.01)
                writer.write(client_hello("evil.test"))
                seen["after"] = await reader.read(-1)
            writer.close()
            seen["records"] = await proxy.ended(1)

    anyio.run(main)
    assert seen["after"] == b"" and b"".join(origin.received) == b""
    assert seen["records"][0].reason is RefusedFor.SNI_MISMATCH  # type: ignore[index]


# --- bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("splice", [True, False], ids=["spliced", "copied"])
def test_the_byte_cap_ends_a_download_and_is_recorded(splice: bool) -> None:
    origin = Origin(body=b"x" * (4 * 1024 * 1024))
    seen = refused(
        lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",)),
        lambda port: f"GET http://origin.test:{port}/ HTTP/1.1\r\n\r\n".encode(),
        origin=origin,
        limits=ProxyLimits(max_bytes=1024 * 1024),
        splice=splice,
    )
    assert len(seen.answer) <= 1024 * 1024
    [record] = seen.records
    assert (record.reason, record.bytes_down <= 1024 * 1024) == (RefusedFor.BYTE_CAP, True)
    if splice:  # a splice of at most the bytes left: the cap is reached exactly, and every counted byte was sent
        assert record.bytes_down == len(seen.answer) == 1024 * 1024


def test_connections_past_the_caps_get_503_and_one_record_for_all() -> None:
    seen: dict[str, object] = {}
    limits = ProxyLimits(max_bytes=1 << 20, max_open=4, max_connections=20, idle_s=5)

    async def main() -> None:
        async with origin_and_proxy(lambda port: rules(allow=("*",)), limits=limits) as (_, proxy):
            held = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(4)]  # open, silent
            answers = [await exchange(proxy.port, b"") for _ in range(30)]
            seen["answers"] = answers
            for _, writer in held:
                writer.close()
        seen["records"] = list(proxy.records)

    anyio.run(main)
    answers = seen["answers"]
    assert isinstance(answers, list)
    assert all(a.startswith(b"HTTP/1.1 503") and b"too many connections" in a for a in answers)
    summary = [r for r in seen["records"] if r.reason is RefusedFor.CONNECTION_CAP]  # type: ignore[attr-defined]
    assert len(summary) == 1 and summary[0].count == 30


def test_an_idle_tunnel_is_closed() -> None:
    origin = Origin(raw=True)
    seen: dict[str, object] = {}
    limits = ProxyLimits(max_bytes=1 << 20, idle_s=0.5, first_bytes_s=0.1)

    async def main() -> None:
        egress = lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",))  # noqa: E731
        async with origin_and_proxy(egress, origin, limits) as (o, proxy):
            answer = await exchange(proxy.port, f"CONNECT origin.test:{o.port} HTTP/1.1\r\n\r\n".encode())
            seen["answer"] = answer
            seen["records"] = await proxy.ended(1)

    anyio.run(main)
    assert seen["records"][0].reason is RefusedFor.IDLE  # type: ignore[index]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_response_ends_at_its_own_framing_whatever_the_origin_sends_after_or_keeps_open(chunked: bool) -> None:
    origin = Origin(lingers=True, chunked=chunked)
    seen = refused(
        lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",)),
        lambda port: f"GET http://origin.test:{port}/ HTTP/1.1\r\n\r\n".encode(),
        origin=origin,
        limits=ProxyLimits(max_bytes=1 << 20, idle_s=WAIT_S * 2),  # the idle bound is not what ends it
    )
    assert seen.answer.endswith(b"0\r\n\r\n" if chunked else b"hello from the origin")
    assert b"smuggle" not in seen.answer
    assert seen.records[0].decision is Outcome.ALLOWED and seen.records[0].reason is None


@pytest.mark.parametrize("splice", [True, False], ids=["spliced", "copied"])
def test_a_client_slower_than_the_origin_gets_every_byte_of_the_response(splice: bool) -> None:
    body = bytes(range(256)) * (8 * 4096)  # 8 MiB
    origin = Origin(body=body)
    got: list[bytes] = []

    async def main() -> None:
        egress = lambda port: rules(allow=(f"origin.test:{port}",), resolve=("origin.test",))  # noqa: E731
        limits = ProxyLimits(max_bytes=64 << 20)
        async with origin_and_proxy(egress, origin, limits, splice=splice) as (o, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"GET http://origin.test:{o.port}/ HTTP/1.1\r\n\r\n".encode())
            await writer.drain()
            with anyio.fail_after(WAIT_S):
                while not proxy.dialled:
                    await anyio.sleep(0.01)
                await anyio.sleep(1)  # the origin is done long before the client reads: the rest waits in the proxy
                got.append(await reader.read(-1))
            writer.close()

    anyio.run(main)
    head, _, received = got[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert received == body


# --- bodies relayed by splice (decision 97) ------------------------------------------------------


@dataclass
class Echo:
    """A tunnel's far end that sends back every byte it gets, until the client's end; then it closes."""

    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 20):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def echo_and_proxy(limits: ProxyLimits, *, splice: bool = True) -> AsyncIterator[tuple[Echo, Proxy]]:
    echo = Echo()
    server = await asyncio.start_server(echo.handle, "127.0.0.1", 0)
    echo.port = server.sockets[0].getsockname()[1]
    async with (
        server,
        origin_and_proxy(
            lambda _: rules(allow=(f"echo.test:{echo.port}",), resolve=("echo.test",)), limits=limits, splice=splice
        ) as (
            _,
            proxy,
        ),
    ):
        yield echo, proxy


ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def relay_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("proxy-relay") and t.is_alive()]


@pytest.mark.parametrize("size", [5, 3 * 1024 * 1024 + 7])
def test_a_tunnel_is_spliced_both_ways_every_byte_counted_and_the_clients_end_passed_on(size: int) -> None:
    payload = bytes(range(251)) * (size // 251) + b"x" * (size % 251)
    seen: dict[str, object] = {}

    async def main() -> None:
        async with echo_and_proxy(ProxyLimits(max_bytes=64 << 20)) as (echo, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"CONNECT echo.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
            writer.write(payload)  # not TLS: passed on once read as such
            await writer.drain()
            writer.write_eof()  # the echo's end follows the client's, through the relay
            with anyio.fail_after(WAIT_S):
                seen["answer"] = await reader.read(-1)
            writer.close()
            seen["records"] = await proxy.ended(1)

    anyio.run(main)
    assert seen["answer"] == ESTABLISHED + payload
    records = seen["records"]
    assert isinstance(records, list)
    [record] = records
    assert isinstance(record, NetConnect)
    assert (record.decision, record.reason) == (Outcome.ALLOWED, None)
    assert (record.bytes_up, record.bytes_down) == (size, len(ESTABLISHED) + size)


@pytest.mark.parametrize("splice", [True, False], ids=["spliced", "copied"])
def test_a_tunnel_that_goes_idle_is_closed_and_recorded_as_allowed_and_idle(splice: bool) -> None:
    seen: dict[str, object] = {}

    async def main() -> None:
        async with echo_and_proxy(ProxyLimits(max_bytes=1 << 20, idle_s=0.5), splice=splice) as (echo, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"CONNECT echo.test:{echo.port} HTTP/1.1\r\n\r\nping".encode())
            await writer.drain()
            with anyio.fail_after(WAIT_S):
                seen["answer"] = await reader.read(-1)  # the proxy closes it: the client never does
            writer.close()
            seen["records"] = await proxy.ended(1)

    anyio.run(main)
    assert seen["answer"] == ESTABLISHED + b"ping"
    records = seen["records"]
    assert isinstance(records, list)
    [record] = records
    assert isinstance(record, NetConnect)
    assert (record.reason, record.bytes_up, record.bytes_down) == (RefusedFor.IDLE, 4, len(ESTABLISHED) + 4)
    assert record.decision is Outcome.ALLOWED and record.address is not None  # let through; idle ended it


def test_the_byte_cap_ends_a_spliced_upload_exactly_at_the_cap() -> None:
    seen: dict[str, object] = {}
    cap = 1024 * 1024

    async def main() -> None:
        async with echo_and_proxy(ProxyLimits(max_bytes=cap)) as (echo, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"CONNECT echo.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
            with contextlib.suppress(OSError):
                writer.write(b"u" * (3 * cap))
                await writer.drain()
            with anyio.fail_after(WAIT_S), contextlib.suppress(OSError):
                while await reader.read(1 << 20):
                    pass
            writer.close()
            seen["records"] = await proxy.ended(1)

    anyio.run(main)
    records = seen["records"]
    assert isinstance(records, list)
    [record] = records
    assert isinstance(record, NetConnect)
    assert record.reason is RefusedFor.BYTE_CAP
    assert record.bytes_up == cap  # every byte up to the cap, none past it
    assert record.bytes_down <= cap


def test_a_run_that_ends_mid_relay_leaves_no_thread_and_records_the_bytes_so_far() -> None:
    seen: dict[str, object] = {}

    async def main() -> None:
        before = relay_threads()
        async with echo_and_proxy(ProxyLimits(max_bytes=64 << 20, idle_s=WAIT_S * 2)) as (echo, proxy):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(f"CONNECT echo.test:{echo.port} HTTP/1.1\r\n\r\nhello".encode())
            await writer.drain()
            with anyio.fail_after(WAIT_S):
                assert await reader.readexactly(len(ESTABLISHED) + 5) == ESTABLISHED + b"hello"
            started = time.monotonic()
        # the proxy was cancelled with the tunnel open and its relay thread waiting in poll
        seen["took"] = time.monotonic() - started
        seen["records"] = list(proxy.records)
        with anyio.fail_after(WAIT_S):
            seen["closed"] = await reader.read(-1) == b""
        writer.close()
        with anyio.fail_after(WAIT_S):
            while any(t.ident not in {b.ident for b in before} for t in relay_threads()):
                await anyio.sleep(0.01)

    anyio.run(main)
    took = seen["took"]
    assert isinstance(took, float) and took < 5  # woken, not left to the idle bound (60 s)
    assert seen["closed"] is True
    records = seen["records"]
    assert isinstance(records, list)
    [record] = records
    assert isinstance(record, NetConnect)
    assert (record.decision, record.bytes_up, record.bytes_down) == (Outcome.ALLOWED, 5, len(ESTABLISHED) + 5)


@pytest.mark.parametrize("splice", [True, False], ids=["spliced", "copied"])
def test_a_dialled_connection_is_open_in_the_log_with_its_bytes_so_far_until_its_record_comes(splice: bool) -> None:
    """Decision 102: once dialled, a connection is in `ConnectionLog.open` with its bytes so far (a splice relay's
    counted while it moves them), and leaves it when its record comes, the record carrying its number; a host
    refused before dialling is never open."""
    half = 200_000
    release = asyncio.Event()
    seen: dict[str, object] = {}

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * half) + b"x" * half)
        await writer.drain()
        await release.wait()
        writer.write(b"y" * half)
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(origin, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        log = ConnectionLog()
        egress = rules(allow=(f"origin.test:{port}",), deny=("denied.test",), resolve=("origin.test", "denied.test"))
        limits = ProxyLimits(max_bytes=1 << 24)
        async with server, anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(serve_proxy, listener, egress, limits, log.add, splice=splice, opened=log.opened)
            )
            proxy_port = listener.getsockname()[1]
            refused = await exchange(proxy_port, f"GET http://denied.test:{port}/ HTTP/1.1\r\n\r\n".encode())
            seen["refused"] = refused.split(b"\r\n", 1)[0]
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
            writer.write(f"GET http://origin.test:{port}/ HTTP/1.1\r\n\r\n".encode())
            got = b""
            with anyio.fail_after(WAIT_S):
                while got.count(b"x") < half:
                    got += await reader.read(65536)
                while not log.open or next(iter(log.open.values())).so_far()[1] < half:  # the relay's count catches up
                    await anyio.sleep(0.01)
            [(number, conn)] = log.open.items()
            seen["open"] = (
                number,
                conn.host,
                conn.port == port,
                conn.method,
                conn.so_far()[1] >= half,
                len(log.records),
            )
            release.set()
            with anyio.fail_after(WAIT_S):
                while not reader.at_eof():
                    got += await reader.read(65536)
                while len(log.records) < 2:
                    await anyio.sleep(0.01)
            writer.close()
            seen["after"] = (dict(log.open), [(r.host, r.number, r.bytes_down > 2 * half) for r in log.records])
            group.cancel_scope.cancel()

    anyio.run(main)
    assert seen["refused"] == b"HTTP/1.1 403 Forbidden"
    # number 1: the first dialled (the refused one never was); one record so far, the refused one's
    assert seen["open"] == (1, "origin.test", True, "GET", True, 1)
    assert seen["after"] == ({}, [("denied.test", None, False), ("origin.test", 1, True)])
