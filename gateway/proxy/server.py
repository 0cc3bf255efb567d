"""The egress proxy a run or an upstream server reaches the network through (docs/security-model.md, "Network by domain"; decision 90).

`serve_proxy` serves one listening socket (the run's own 127.0.0.1:3128, handed over by the sandbox) until
cancelled. Each connection carries one request: an absolute-form `http://` request (forwarded to the
origin in origin form, hop-by-hop headers dropped, `Connection: close` both ways) or `CONNECT host:port`
(a tunnel, opened only after the TLS ClientHello's server name, if one is sent, is found to be the
CONNECT host). Every host goes through `rules.egress.decide` and, once resolved (in a worker thread,
never on the loop), `refusal_for_address`; the proxy connects to the very address it checked. A
refusal is a 403 whose body names the host, the rule (or that none names it) and the key to change;
the run goes on. Everything is bounded per run: bytes each way, connections open and in total, the
head's size, idle time. Each connection ends as one `NetConnect` handed to `record` (NET_CONNECT).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from gateway.proxy.http import (
    MAX_HEAD,
    UNTIL_CLOSE,
    BadRequest,
    Head,
    Target,
    body_framing,
    connect_target,
    forwarded_request,
    forwarded_response,
    parse_head,
    refusal,
    request_target,
    response_framing,
)
from gateway.proxy.sni import MAX_HELLO, HelloState, read_hello
from gateway.proxy.splice import Budget, Direction, Ended, Relay, can_splice
from gateway.rules.egress import (
    Address,
    EgressRules,
    HostDecision,
    Verdict,
    address_of,
    decide,
    read_host,
    refusal_for_address,
)

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
HIGH_WATER = 1024 * 1024
"""Bytes queued for a peer before the proxy waits for it to read."""
RELAY_WAKE_S = 10.0
"""How long a cancelled connection waits for its woken relay thread (it returns within one poll)."""
SPLICE_FROM = 64 * 1024
"""A body (or the rest of it) this long or longer is relayed by splice; a shorter one is copied, cheaper than
handing it to a thread."""
DECISIONS_KEPT = 1024
"""At most this many (host, port) verdicts of the rules are remembered per proxy; past it, each is decided again."""
UPSTREAM_BUFFER = 1024 * 1024
"""An origin's stream buffer: large reads for a download (a response head is still held to MAX_HEAD)."""


@dataclass(frozen=True, slots=True)
class ProxyLimits:
    """What one run (or one upstream server, for its whole life) may do through the proxy (docs/policy.md)."""

    max_bytes: int
    """Each way, over all its connections (`sandbox.max_network_bytes`)."""
    max_open: int = 32
    """Connections open at once; one more is answered 503 at once."""
    max_connections: int = 1024
    """Connections in all; past it every one is answered 503 and counted in one NET_CONNECT."""
    idle_s: float = 60.0
    """A connection on which nothing moved either way for this long is closed."""
    resolve_s: float = 10.0
    connect_s: float = 10.0
    first_bytes_s: float = 2.0
    """How long a tunnel waits for the client to speak first (a TLS ClientHello to check) before dialling anyway,
    for a protocol whose server speaks first; the first bytes are checked whenever they come."""


class Outcome(StrEnum):
    ALLOWED = "allowed"
    REFUSED = "refused"


class RefusedFor(StrEnum):
    """Why the proxy refused or ended a connection: NET_CONNECT's `reason` (docs/audit.md)."""

    DENIED_BY_RULE = "denied_by_rule"
    NO_RULE = "no_rule"
    NEEDS_A_PERSON = "needs_a_person"
    DENIED_BY_PERSON = "denied_by_person"
    ADDRESS_NOT_PUBLIC = "address_not_public"
    RESOLVE_FAILED = "resolve_failed"
    CONNECT_FAILED = "connect_failed"
    SNI_MISMATCH = "sni_mismatch"
    BAD_REQUEST = "bad_request"
    HEAD_TOO_LARGE = "head_too_large"
    BAD_RESPONSE = "bad_response"
    BYTE_CAP = "byte_cap"
    CONNECTION_CAP = "connection_cap"
    IDLE = "idle"
    RUN_ABANDONED = "run_abandoned"
    """Open when its gateway died: the sweep that closed the run recorded it, bytes as last shown (decision 102)."""


@dataclass(frozen=True, slots=True)
class NetConnect:
    """One connection through the proxy, as NET_CONNECT records it (never a header, a path or a body)."""

    host: str | None
    port: int | None
    method: str | None
    decision: Outcome
    rule: str | None
    reason: RefusedFor | None
    address: str | None
    bytes_up: int
    bytes_down: int
    duration_ms: int
    count: int = 1
    """More than 1 only for the connections refused past `max_connections`, recorded together."""
    number: int | None = None
    """The connection's number in its run's `ConnectionLog` while it was open (decision 102); not in the event."""

    def detail(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "method": self.method,
            "decision": str(self.decision),
            "rule": self.rule,
            "reason": None if self.reason is None else str(self.reason),
            "address": self.address,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration_ms": self.duration_ms,
            "count": self.count,
        }


@dataclass(slots=True)
class ConnectionLog:
    """One call's connections through the proxy: those that ended, for the pipeline to write as NET_CONNECT
    events (while the run is on, at most once a second: gateway/call_trail.py `flush_connections`; decision 98),
    and those dialled and still open, with their bytes so far, for its card (decision 102). A connection is in
    one or the other, never both: `add` takes it out of `open`. Used on the event loop's thread only."""

    records: list[NetConnect] = field(default_factory=list)
    open: dict[int, OpenConnection] = field(default_factory=dict)
    """The connections let through and dialled that have not ended, by number (at most the run's open cap)."""
    opened_total: int = 0
    _arrived: anyio.Event | None = None

    def add(self, record: NetConnect) -> None:
        if record.number is not None:
            self.open.pop(record.number, None)
        self.records.append(record)
        if self._arrived is not None:
            self._arrived.set()

    def opened(self, connection: OpenConnection) -> int:
        """`connection` dialled: open until its record comes; its number in this log."""
        self.opened_total += 1
        self.open[self.opened_total] = connection
        if self._arrived is not None:
            self._arrived.set()
        return self.opened_total

    def drain(self) -> tuple[NetConnect, ...]:
        """The records so far, taken: each is written once."""
        taken, self.records = tuple(self.records), []
        return taken

    def put_back(self, taken: tuple[NetConnect, ...]) -> None:
        """Records taken by `drain` that could not be written, first again: the call's end writes them."""
        self.records[:0] = taken

    async def arrived(self) -> None:
        """Return once a record is here (at once if one already is)."""
        while not self.records:
            if self._arrived is None or self._arrived.is_set():
                self._arrived = anyio.Event()  # shared by every waiter until a record comes
            await self._arrived.wait()

    async def busy(self) -> None:
        """Return once a record is here or a connection is open (at once if either already is)."""
        while not self.records and not self.open:
            if self._arrived is None or self._arrived.is_set():
                self._arrived = anyio.Event()
            await self._arrived.wait()


Resolver = Callable[[str, int], Awaitable[list[Address]]]
Dialer = Callable[[Address, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
Asker = Callable[[str, int, str], Awaitable[bool]]
"""A person decides on a host an `ask` rule names: (host, port, rule) -> allowed. Waits as long as it takes;
raises NobodyToAsk when no person can be asked about this connection."""


class NobodyToAsk(Exception):
    """No person can be asked about this connection (an upstream server's traffic outside any call): `why`, for
    the refusal to say."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


async def resolve_host(host: str, port: int) -> list[Address]:
    """The host's addresses from the system's resolver, asked in a worker thread (getaddrinfo blocks)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[Address] = []
    for info in infos:
        address = address_of(str(info[4][0]).split("%", 1)[0])
        if address is not None and address not in out:
            out.append(address)
    return out


async def dial(address: Address, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(str(address), port, limit=UPSTREAM_BUFFER)


class _Refused(Exception):
    def __init__(self, status: int, reason: RefusedFor, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class _Ended(Exception):
    """The connection ended for a bound (bytes, idle) after it was let through."""

    def __init__(self, reason: RefusedFor) -> None:
        super().__init__(str(reason))
        self.reason = reason


@dataclass(slots=True)
class _Totals:
    """One run's use of the proxy, over all its connections."""

    limits: ProxyLimits
    budget: Budget
    """Bytes each way, shared with the relay threads (gateway/proxy/splice.py)."""
    relays: ThreadPoolExecutor
    """Two threads per open connection at most (a request's body and its response's): reused, never queued."""
    open: int = 0
    accepted: int = 0
    over_cap: int = 0


class OpenConnection(Protocol):
    """What a card shows of a connection still open (decision 102): read on the event loop's thread."""

    host: str | None
    port: int | None
    method: str | None
    rule: str | None
    address: str | None
    started: float
    """When it was accepted (time.monotonic)."""

    def so_far(self) -> tuple[int, int]:
        """Its bytes up and down so far, those a relay thread is moving included."""
        ...


@dataclass(slots=True)
class _Connection:
    totals: _Totals
    idle_s: float
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    host: str | None = None
    port: int | None = None
    method: str | None = None
    rule: str | None = None
    address: str | None = None
    up: int = 0
    down: int = 0
    transports: list[asyncio.WriteTransport] = field(default_factory=list)
    idled: bool = False
    recorded: bool = False
    waiting: bool = False
    """A person is deciding on the host: the connection waits, however long (the run's time limit bounds it)."""
    number: int | None = None
    """Its number in the run's ConnectionLog once dialled (`_Proxy.opened`); None: nobody is told it is open."""
    relaying: list[Direction] = field(default_factory=list)
    """The directions a relay thread is moving now: their bytes are added to up and down when it returns."""
    timer: asyncio.TimerHandle | None = None
    """The idle watchdog's next look (`watch`)."""

    def so_far(self) -> tuple[int, int]:
        up, down = self.up, self.down
        for way in self.relaying:
            if way.up:
                up += way.moved
            else:
                down += way.moved
        return up, down

    def moved(self) -> None:
        self.last = time.monotonic()

    def count(self, n: int, *, up: bool) -> None:
        if not self.totals.budget.add(n, up=up):
            raise _Ended(RefusedFor.BYTE_CAP)
        if up:
            self.up += n
        else:
            self.down += n
        self.moved()

    async def read(self, reader: asyncio.StreamReader, n: int = CHUNK) -> bytes:
        """Up to `n` bytes; b"" at the end (or once the watchdog closed an idle connection: `watch`)."""
        return await reader.read(n)

    async def read_exactly(self, reader: asyncio.StreamReader, n: int) -> bytes:
        return await reader.readexactly(n)

    async def read_line(self, reader: asyncio.StreamReader, end: bytes = b"\r\n") -> bytes:
        return await reader.readuntil(end)

    async def write(self, writer: asyncio.StreamWriter, data: bytes, *, up: bool) -> None:
        """`data` sent on, counted; waits for the peer only past HIGH_WATER bytes queued (the watchdog bounds it)."""
        self.count(len(data), up=up)
        writer.write(data)
        if writer.transport.get_write_buffer_size() > HIGH_WATER:
            await writer.drain()
        self.moved()

    def watching(self, writer: asyncio.StreamWriter) -> asyncio.StreamWriter:
        """`writer`'s connection closed by `watch` when idle."""
        self.transports.append(writer.transport)
        return writer

    def watch(self) -> None:
        """Close every transport of the connection once nothing moved either way for idle_s (never while a person
        decides on its host: `waiting`). One loop timer per connection, re-armed when it fires, rather than one per
        read, and no task: a task's start and cancellation were two more loop iterations per connection."""
        left = self.idle_s - (time.monotonic() - self.last)
        if self.waiting:
            self.moved()
        elif left <= 0:
            self.idled = True
            self.timer = None
            for transport in self.transports:
                _abort(transport)
            return
        self.timer = asyncio.get_running_loop().call_later(max(left, 0.05), self.watch)

    def unwatch(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def record(self, outcome: Outcome, reason: RefusedFor | None) -> NetConnect:
        return NetConnect(
            host=self.host,
            port=self.port,
            method=self.method,
            decision=outcome,
            rule=self.rule,
            reason=reason,
            address=self.address,
            bytes_up=self.up,
            bytes_down=self.down,
            duration_ms=int((time.monotonic() - self.started) * 1000),
            number=self.number,
        )


@dataclass(frozen=True, slots=True)
class _Proxy:
    rules: EgressRules
    limits: ProxyLimits
    key: str
    """The policy key that holds these rules (`sandbox.network`, `upstreams.NAME.network`), for refusals to name."""
    record: Callable[[NetConnect], None]
    ask: Asker | None
    resolve: Resolver
    dial: Dialer
    totals: _Totals
    splice: bool
    opened: Callable[[OpenConnection], int] | None
    decisions: dict[tuple[str, int], HostDecision] = field(default_factory=dict)
    """`decide`'s answers for this proxy's rules, which never change (at most DECISIONS_KEPT): a run asks about its
    few hosts on every connection. Only the rules' verdict: a person's answer to `ask` is never kept here."""


async def serve_proxy(
    listener: socket.socket,
    rules: EgressRules,
    limits: ProxyLimits,
    record: Callable[[NetConnect], None],
    *,
    key: str = "sandbox.network",
    ask: Asker | None = None,
    resolve: Resolver = resolve_host,
    dial: Dialer = dial,
    splice: bool = True,
    opened: Callable[[OpenConnection], int] | None = None,
) -> None:
    """Serve `listener` until cancelled, then close it and every connection. `record` is called once per
    connection as it ends, on the loop's thread (it must not block); past `max_connections`, once for all.
    `opened` (ConnectionLog.opened), when given, is told of each connection once it is dialled, before its
    record, which then carries the number it returned. `splice=False` copies every body through the streams
    (the bench's and the tests' other path)."""
    relays = ThreadPoolExecutor(max_workers=2 * limits.max_open, thread_name_prefix="proxy-relay")
    proxy = _Proxy(
        rules,
        limits,
        key,
        record,
        ask,
        resolve,
        dial,
        _Totals(limits, Budget(limits.max_bytes), relays),
        splice and can_splice(),
        opened,
    )
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    try:
        async with anyio.create_task_group() as group:
            while True:
                client, _ = await loop.sock_accept(listener)
                totals = proxy.totals
                totals.accepted += 1
                if totals.accepted > limits.max_connections or totals.open >= limits.max_open:
                    _refuse_at_once(client, limits, totals)
                    continue
                totals.open += 1
                group.start_soon(_serve_one, proxy, client)
    finally:
        listener.close()
        relays.shutdown(wait=False)  # every relay was woken and waited for by its connection's task
        if proxy.totals.over_cap:
            record(
                NetConnect(
                    None, None, None, Outcome.REFUSED, None, RefusedFor.CONNECTION_CAP, None, 0, 0, 0,
                    count=proxy.totals.over_cap,
                )
            )  # fmt: skip


def proxy_starter(
    group: TaskGroup,
    rules: EgressRules,
    limits: ProxyLimits,
    record: Callable[[NetConnect], None],
    *,
    key: str,
    ask: Asker | None = None,
    opened: Callable[[OpenConnection], int] | None = None,
) -> Callable[[socket.socket], None]:
    """The sandbox's `on_proxy`: the run's listener served in `group` (cancel the group when the run or server ends)."""

    def start(listener: socket.socket) -> None:
        group.start_soon(
            functools.partial(serve_proxy, listener, rules, limits, record, key=key, ask=ask, opened=opened)
        )

    return start


def _refuse_at_once(client: socket.socket, limits: ProxyLimits, totals: _Totals) -> None:
    """A connection past a cap: a 503 if the socket takes it without waiting, then closed; counted, never served."""
    totals.over_cap += 1
    with contextlib.suppress(OSError), client:
        client.setblocking(False)
        client.send(
            refusal(
                503,
                f"mcp-gateway proxy: too many connections (at most {limits.max_open} open"
                f" and {limits.max_connections} per run)",
            )
        )


async def _serve_one(proxy: _Proxy, client: socket.socket) -> None:
    conn = _Connection(proxy.totals, proxy.limits.idle_s)
    outcome: Outcome | None = None
    reason: RefusedFor | None = None
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(sock=client, limit=MAX_HEAD)
        conn.watch()
        conn.watching(writer)
        try:
            outcome, reason = await _serve_request(proxy, conn, reader, writer)
            _record(proxy, conn, outcome, reason)  # before the close: the caller's end sees it (an upstream's call)
            await _finish(writer)
        except _Refused as exc:
            outcome, reason = Outcome.REFUSED, exc.reason
            with contextlib.suppress(OSError, _Ended):
                await conn.write(writer, refusal(exc.status, exc.message), up=False)
                _record(proxy, conn, outcome, reason)
                await _finish(writer)
        except _Ended as exc:
            outcome, reason = (Outcome.ALLOWED if conn.address else Outcome.REFUSED), exc.reason
    except (OSError, asyncio.IncompleteReadError):
        outcome = Outcome.ALLOWED if conn.address else Outcome.REFUSED
        reason = None if conn.address else RefusedFor.BAD_REQUEST
    except Exception:  # a flaw here ends this connection, never the proxy or the run's call
        log.exception("proxy: a connection to %s:%s failed unexpectedly", conn.host, conn.port)
        outcome, reason = Outcome.REFUSED, RefusedFor.BAD_REQUEST
    finally:
        proxy.totals.open -= 1
        conn.unwatch()
        if writer is not None:
            _abort(writer.transport)
        else:
            client.close()
        if outcome is None:  # the run ended (cancelled) while the connection was on
            outcome = Outcome.ALLOWED if conn.address else Outcome.REFUSED
        _record(proxy, conn, outcome, reason)


def _record(proxy: _Proxy, conn: _Connection, outcome: Outcome, reason: RefusedFor | None) -> None:
    """The connection's NetConnect, once, if it asked for anything or moved a byte."""
    if not conn.recorded and (conn.method is not None or conn.up or conn.down):
        conn.recorded = True
        if conn.idled and conn.address:
            outcome = Outcome.ALLOWED  # let through and dialled: the idle watchdog ended it, no rule refused it
        proxy.record(conn.record(outcome, RefusedFor.IDLE if conn.idled else reason))


def _abort(transport: asyncio.WriteTransport) -> None:
    """Close at once, dropping what is queued. Python 3.11's selector transport raises AttributeError when asked
    to abort after a graceful close completed (its loop is gone, its lost-connection count never raised): there
    is nothing left to drop then, and the proxy must not fail for it."""
    with contextlib.suppress(AttributeError):
        transport.abort()


async def _finish(writer: asyncio.StreamWriter) -> None:
    """Close the client's connection once what is queued for it has been sent: a client slower than the origin
    still gets every byte. Bounded by the idle watchdog, which aborts a client that stops reading."""
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def _serve_request(
    proxy: _Proxy, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> tuple[Outcome, RefusedFor | None]:
    head = await _read_head(conn, reader)
    if head is None:
        return Outcome.REFUSED, None
    conn.method = head.start[0].decode("ascii")
    try:
        target = connect_target(head) if conn.method == "CONNECT" else request_target(head)
    except BadRequest as exc:
        raise _Refused(exc.status, RefusedFor.BAD_REQUEST, f"mcp-gateway proxy: {exc.why}") from None
    conn.host, conn.port = target.host, target.port
    addresses = await _admit(proxy, conn, target)
    if conn.method == "CONNECT":
        await _tunnel(proxy, conn, reader, writer, target=target, addresses=addresses)
    else:
        await _forward(proxy, conn, reader, writer, head=head, target=target, addresses=addresses)
    return Outcome.ALLOWED, None


async def _read_head(conn: _Connection, reader: asyncio.StreamReader) -> Head | None:
    try:
        raw = await conn.read_line(reader, b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise _Refused(
            431, RefusedFor.HEAD_TOO_LARGE, f"mcp-gateway proxy: the request head is over {MAX_HEAD} bytes"
        ) from None
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise _Refused(400, RefusedFor.BAD_REQUEST, "mcp-gateway proxy: the request head ended early") from None
        return None
    conn.moved()
    try:
        return parse_head(raw)
    except BadRequest as exc:
        raise _Refused(exc.status, RefusedFor.BAD_REQUEST, f"mcp-gateway proxy: {exc.why}") from None


async def _admit(proxy: _Proxy, conn: _Connection, target: Target) -> list[Address]:
    """The addresses `target` may be reached at, or _Refused: the rules, a person for `ask`, then the addresses."""
    host, port, key = target.host, target.port, proxy.key
    decision = proxy.decisions.get((host, port))
    if decision is None:
        decision = decide(proxy.rules, host, port)
        if len(proxy.decisions) < DECISIONS_KEPT:
            proxy.decisions[host, port] = decision
    conn.rule = decision.rule
    where = f"{host}:{port}"
    if decision.verdict is Verdict.DENY:
        if decision.rule is not None:
            raise _Refused(
                403,
                RefusedFor.DENIED_BY_RULE,
                f"mcp-gateway proxy: {where} is refused by the rule '{decision.rule}' in {key} (policy.yaml);"
                f" deny wins over ask and allow: to reach it, remove that pattern from {key}.deny",
            )
        hint = f" ({decision.hint})" if decision.hint else ""
        raise _Refused(
            403,
            RefusedFor.NO_RULE,
            f"mcp-gateway proxy: {where} is refused: no rule in {key} names it{hint};"
            f" to let it through, add '{host}' to {key}.allow (policy.yaml)",
        )
    if decision.verdict is Verdict.ASK:
        nobody = f"mcp-gateway proxy: {where} needs a person's decision (the rule '{decision.rule}' in {key}), and"
        instead = f": refused; to let it through without asking, add '{host}' to {key}.allow (policy.yaml)"
        if proxy.ask is None:
            raise _Refused(403, RefusedFor.NEEDS_A_PERSON, f"{nobody} no person can be asked here{instead}")
        conn.waiting = True
        try:
            allowed = await proxy.ask(host, port, decision.rule or "")
        except NobodyToAsk as exc:
            raise _Refused(403, RefusedFor.NEEDS_A_PERSON, f"{nobody} {exc.why}{instead}") from None
        finally:
            conn.waiting = False
            conn.moved()
        if not allowed:
            raise _Refused(
                403,
                RefusedFor.DENIED_BY_PERSON,
                f"mcp-gateway proxy: {where} was refused by a person (the rule '{decision.rule}' in {key})",
            )
    return await _addresses(proxy, host, port)


async def _addresses(proxy: _Proxy, host: str, port: int) -> list[Address]:
    literal = address_of(host)
    if literal is not None:
        return [literal]  # an IP literal passes decide only where a rule names it
    if host in proxy.rules.resolve:
        return [proxy.rules.resolve[host]]
    key = proxy.key
    try:
        with anyio.fail_after(proxy.limits.resolve_s):
            addresses = await proxy.resolve(host, port)
    except (OSError, TimeoutError):
        addresses = []
    if not addresses:
        raise _Refused(
            502,
            RefusedFor.RESOLVE_FAILED,
            f"mcp-gateway proxy: {host} does not resolve; to point it at an address, add it to {key}.resolve",
        )
    for address in addresses:
        why = refusal_for_address(address)
        if why is not None:
            raise _Refused(
                403,
                RefusedFor.ADDRESS_NOT_PUBLIC,
                f"mcp-gateway proxy: {host} resolves to {address}, which is {why}: refused (a name may not lead to"
                f" such an address); if it is meant, map the name in {key}.resolve or name the address in {key}.allow",
            )
    return addresses


async def _dial(
    proxy: _Proxy, conn: _Connection, addresses: list[Address], port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    for address in addresses:
        try:
            async with asyncio.timeout(proxy.limits.connect_s):  # asyncio's own: 3.4 us of CPU against anyio's 6.4
                opened = await proxy.dial(address, port)
        except (OSError, TimeoutError):
            continue
        conn.address = str(address)
        conn.moved()
        conn.watching(opened[1])
        if proxy.opened is not None and conn.number is None:
            conn.number = proxy.opened(conn)
        return opened
    raise _Refused(502, RefusedFor.CONNECT_FAILED, f"mcp-gateway proxy: {conn.host}:{port} did not accept a connection")


async def _tunnel(
    proxy: _Proxy,
    conn: _Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    target: Target,
    addresses: list[Address],
) -> None:
    """CONNECT: 200, then the client's first bytes checked (a ClientHello names the CONNECT host or none),
    then the origin dialled and bytes copied both ways until either side ends."""
    await conn.write(writer, b"HTTP/1.1 200 Connection established\r\n\r\n", up=False)
    first = b""
    with contextlib.suppress(TimeoutError):
        first = await asyncio.wait_for(reader.read(CHUNK), proxy.limits.first_bytes_s)
    if not first and reader.at_eof():
        return
    if first:
        first = await _checked_start(conn, reader, first, target)
    up_reader, up_writer = await _dial(proxy, conn, addresses, target.port)
    try:
        if first:
            await conn.write(up_writer, first, up=True)
        if first and proxy.splice:
            await _relay_both(proxy, conn, (reader, writer), (up_reader, up_writer))
            return
        await _alongside(_copy(conn, up_reader, writer, up=False), _copy_up(conn, reader, up_writer, target, not first))
    finally:
        _abort(up_writer.transport)


async def _relay_both(
    proxy: _Proxy,
    conn: _Connection,
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    origin: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """A checked tunnel's bytes both ways by splice: the origin's close ends it, the client's is passed on."""
    down = await _way_out(conn, origin, client[1], up=False, length=None)
    if down is None:
        return
    up = await _way_out(conn, client, origin[1], up=True, length=None)
    await _relay(proxy, conn, down, up)


async def _way_out(
    conn: _Connection,
    source: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    sink: asyncio.StreamWriter,
    *,
    up: bool,
    length: int | None,
) -> Direction | None:
    """The stream `source` taken over for a relay to `sink`: its transport stops reading, what its reader
    holds is sent on first (never past `length`), `sink`'s queue is flushed; None when nothing is left to
    relay (the length reached, or the source's end already read and passed on)."""
    reader, writer = source
    transport = writer.transport
    if not isinstance(transport, asyncio.ReadTransport):
        raise TypeError("a stream's transport reads")  # asyncio's socket transports do both
    transport.pause_reading()
    held = _take_buffered(reader)
    if length is not None:
        held = held[:length]
    if held:
        await conn.write(sink, held, up=up)
    left = None if length is None else length - len(held)
    if left == 0:
        return None
    if reader.at_eof():
        if length is None:
            with contextlib.suppress(OSError):
                if sink.can_write_eof():
                    sink.write_eof()
        return None
    await _flushed(sink)
    return Direction(_dup(writer), _dup(sink), up=up, length=left)


def _take_buffered(reader: asyncio.StreamReader) -> bytes:
    """What `reader` holds, taken without waiting. asyncio has no public call for it (read() waits when the
    buffer is empty); its transport must already have stopped reading, so nothing is added meanwhile."""
    buffer: bytearray = reader._buffer  # type: ignore[attr-defined]
    held = bytes(buffer)
    buffer.clear()
    return held


async def _flushed(writer: asyncio.StreamWriter) -> None:
    """Every byte queued on `writer` sent, so that a splice to its socket comes after them."""
    writer.transport.set_write_buffer_limits(high=0)
    await writer.drain()
    if writer.transport.get_write_buffer_size():
        raise ConnectionResetError("the queue was not flushed")


def _dup(writer: asyncio.StreamWriter) -> socket.socket:
    """The stream's socket for a relay thread: a duplicate, so that closing the stream (the idle watchdog, the
    run's end) never frees a descriptor number the thread still uses."""
    return socket.socket(fileno=os.dup(writer.get_extra_info("socket").fileno()))


async def _relay(proxy: _Proxy, conn: _Connection, main: Direction, side: Direction | None = None) -> None:
    """`main` (and `side`) relayed by a worker thread; cancelled, the thread is woken and waited for (it polls
    non-blocking sockets, so it returns within one poll), never left behind."""
    relay = Relay(proxy.totals.budget, proxy.limits.idle_s, main, side, on_moved=conn.moved)
    future = proxy.totals.relays.submit(relay.run)
    ways = [way for way in (main, side) if way is not None]
    conn.relaying.extend(ways)
    try:
        ended = await asyncio.wrap_future(future)
    finally:
        if not future.done():
            future.cancel()
            relay.wake()
            _, stuck = concurrent.futures.wait((future,), timeout=RELAY_WAKE_S)
            if stuck:  # never seen: every call the thread makes is non-blocking
                log.error(
                    "proxy: a relay thread for %s:%s did not wake within %s s", conn.host, conn.port, RELAY_WAKE_S
                )
        for way in ways:
            conn.relaying.remove(way)
            if way.up:
                conn.up += way.moved
            else:
                conn.down += way.moved
        if future.done():  # else the descriptors stay with the thread rather than be reused under it
            relay.close()
            for sock in {id(s): s for way in (main, side) if way is not None for s in (way.source, way.sink)}.values():
                sock.close()
    if ended is Ended.BYTE_CAP:
        raise _Ended(RefusedFor.BYTE_CAP)
    if ended is Ended.IDLE:
        conn.idled = True
    elif ended is Ended.GONE:
        raise ConnectionResetError("a peer went away during the relay")


async def _alongside(main: Coroutine[Any, Any, None], side: Coroutine[Any, Any, None]) -> None:
    """`main` until it ends, `side` beside it: `side` ending well leaves `main` going; either failing fails both
    (its own exception raised, never a group); `side` is cancelled when `main` ends."""
    main_task, side_task = asyncio.ensure_future(main), asyncio.ensure_future(side)
    try:
        pending = {main_task, side_task}
        while main_task in pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
    finally:
        for task in (main_task, side_task):
            task.cancel()
        await asyncio.wait((main_task, side_task))
        for task in (main_task, side_task):
            if not task.cancelled():
                task.exception()  # retrieved: the one that counts was raised above


async def _checked_start(conn: _Connection, reader: asyncio.StreamReader, first: bytes, target: Target) -> bytes:
    """The tunnel's first bytes, read on until a ClientHello is whole, its server name checked."""
    data = first
    while True:
        hello = read_hello(data)
        if hello.state is HelloState.NOT_TLS:
            return data
        if hello.state is HelloState.MALFORMED:
            raise _Ended(RefusedFor.SNI_MISMATCH)
        if hello.state is HelloState.HELLO:
            if hello.server_name is not None and read_host(hello.server_name) != target.host:
                raise _Ended(RefusedFor.SNI_MISMATCH)
            return data
        if len(data) > MAX_HELLO + 8192:
            raise _Ended(RefusedFor.SNI_MISMATCH)
        more = await conn.read(reader)
        if not more:
            return data
        data += more


async def _copy_up(
    conn: _Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: Target,
    check_first: bool,
) -> None:
    if check_first:
        first = await conn.read(reader)
        if not first:
            with contextlib.suppress(OSError):
                writer.write_eof()
            return
        await conn.write(writer, await _checked_start(conn, reader, first, target), up=True)
    await _copy(conn, reader, writer, up=True)


async def _copy(conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool) -> None:
    while True:
        data = await conn.read(reader)
        if not data:
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()
            return
        await conn.write(writer, data, up=up)


async def _forward(
    proxy: _Proxy,
    conn: _Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    head: Head,
    target: Target,
    addresses: list[Address],
) -> None:
    """One http:// request: its head rewritten, its body copied by its own framing (never past it), the
    response's head rewritten, its body copied until the origin closes; then the client's connection closes."""
    try:
        framing = body_framing(head)
    except BadRequest as exc:
        raise _Refused(exc.status, RefusedFor.BAD_REQUEST, f"mcp-gateway proxy: {exc.why}") from None
    up_reader, up_writer = await _dial(proxy, conn, addresses, target.port)
    try:
        await conn.write(up_writer, forwarded_request(head, target), up=True)
        answer = _relay_response(proxy, conn, (up_reader, up_writer), writer, head.start[0])
        if framing == 0:  # no body to copy beside the answer: no second task (two loop iterations fewer)
            await answer
        else:
            await _alongside(answer, _copy_body(proxy, conn, (reader, writer), up_writer, framing))
    finally:
        _abort(up_writer.transport)


async def _copy_body(
    proxy: _Proxy,
    conn: _Connection,
    source: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    writer: asyncio.StreamWriter,
    framing: int | None,
    *,
    up: bool = True,
) -> None:
    """A body copied by its own framing (a length, or chunked parsed to its last chunk) and never past it; a
    long one (or one that ends at the sender's close) relayed by splice."""
    reader = source[0]
    bad = RefusedFor.BAD_REQUEST if up else RefusedFor.BAD_RESPONSE
    if proxy.splice and (framing == UNTIL_CLOSE or (framing is not None and framing >= SPLICE_FROM)):
        way = await _way_out(conn, source, writer, up=up, length=None if framing == UNTIL_CLOSE else framing)
        if way is not None:
            await _relay(proxy, conn, way)
        return
    if framing == UNTIL_CLOSE:
        await _copy(conn, reader, writer, up=up)
        return
    if framing is not None:
        left = framing
        while left:
            data = await conn.read(reader, min(CHUNK, left))
            if not data:
                return
            left -= len(data)
            await conn.write(writer, data, up=up)
        return
    while True:  # chunked: size line, data, CRLF; a zero size, then trailers up to a blank line
        line = await _bounded_line(conn, reader, bad)
        size_text = line[:-2].split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 15 or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            raise _Ended(bad)
        await conn.write(writer, line, up=up)
        size = int(size_text, 16)
        if size == 0:
            while True:
                trailer = await _bounded_line(conn, reader, bad)
                await conn.write(writer, trailer, up=up)
                if trailer == b"\r\n":
                    return
        while size:
            data = await conn.read(reader, min(CHUNK, size))
            if not data:
                return
            size -= len(data)
            await conn.write(writer, data, up=up)
        if await conn.read_exactly(reader, 2) != b"\r\n":
            raise _Ended(bad)
        await conn.write(writer, b"\r\n", up=up)


async def _bounded_line(conn: _Connection, reader: asyncio.StreamReader, bad: RefusedFor) -> bytes:
    try:
        line = await conn.read_line(reader)
    except asyncio.LimitOverrunError:
        raise _Ended(bad) from None
    if len(line) > 8192:
        raise _Ended(bad)
    return line


async def _relay_response(
    proxy: _Proxy,
    conn: _Connection,
    origin: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    writer: asyncio.StreamWriter,
    method: bytes,
) -> None:
    """The origin's response: interim 1xx heads passed on, then the final head rewritten and its body copied by
    its own framing; what the origin sends past it is never read."""
    reader = origin[0]
    while True:
        try:
            raw = await conn.read_line(reader, b"\r\n\r\n")
            if len(raw) > MAX_HEAD:
                raise BadRequest(502, "a response head over the cap")
            head = parse_head(raw, response=True)
            framing = response_framing(head, method)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, BadRequest):
            raise _Refused(
                502, RefusedFor.BAD_RESPONSE, "mcp-gateway proxy: the origin's answer is not an HTTP/1.x response"
            ) from None
        informational = head.start[1].startswith(b"1") and head.start[1] != b"101"
        if head.start[1] == b"101":
            raise _Refused(502, RefusedFor.BAD_RESPONSE, "mcp-gateway proxy: an upgrade is not passed on")
        out = forwarded_response(head)
        if informational:
            out = out[: -len(b"Connection: close\r\n\r\n")] + b"\r\n"
        await conn.write(writer, out, up=False)
        if not informational:
            break
    await _copy_body(proxy, conn, origin, writer, framing, up=False)
