"""One upstream's server and the MCP client session over its pipes (docs/upstreams.md, decision 84).

The server is started confined (sandbox/server.py) at first use, in the gateway's task group
(`UpstreamServers.running`), never in a call's: a call that ends does not end the server. A start is
bounded (`START_S`); whoever needs the server waits for it at most as long as it may. What the server
asks of the gateway is answered here: sampling refused, elicitation refused unless the policy relays it
(to the caller of a call in flight, labelled as the server's), roots the workspace alone. A server that
exits, or is stopped for a call past its time or an answer over its cap, is started again at the next
use; one that cannot start says why (`unavailable`). Its log messages (`notifications/message`) go to the
gateway's log as its own words, escaped and cut, never to a client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from gateway.consent.network import CallsInFlight
from gateway.declarations import WORKSPACE_PLACEHOLDER
from gateway.errors import GatewayError, InternalError, Reason
from gateway.logs import RATE_KEY
from gateway.policy import SandboxPolicy
from gateway.programs import check_program_unchanged
from gateway.proxy import Asker, ConnectionLog, ProxyLimits, proxy_starter
from gateway.start_failures import describe_start_failure, start_step
from gateway.tools.base import Relay
from gateway.tools.confined import MIB, sandbox_environment, shown
from gateway.upstream_policy import Upstream, UpstreamWorkspace, resolve_env
from gateway.upstreams.wire import ENVELOPE_BYTES, Wire, session_streams
from sandbox import Limits
from sandbox.confine import LayerReport
from sandbox.errors import SandboxStartError
from sandbox.leftovers import scratch_folder
from sandbox.pinned import Pinned
from sandbox.server import ConfinedServer, ServerSpec, Synced, start_server
from sandbox.task_groups import task_group

log = logging.getLogger("gateway.upstreams")

START_S = 30.0
"""At most this long from spawning the server to its first tools/list answered."""
LIST_S = 10.0
"""A tools/list of the server (after list_changed) gives up after this long."""
STDERR_CHARS = 600
LOG_CHARS = 500
"""How much of one of the server's log messages reaches the gateway's log."""
EXIT_GRACE_S = 2.0
"""A server that closed its stdout has this long to exit by itself (and say how) before it is stopped."""


@dataclass(frozen=True, slots=True)
class Place:
    """Where an upstream's server runs: the workspace it serves and the sandbox it is confined by."""

    workspace: str
    root: Pinned
    sandbox: SandboxPolicy
    environ: Mapping[str, str]
    host: LayerReport
    allowed_paths: tuple[Pinned, ...] = ()
    hidden: tuple[Path, ...] = ()


Listed = Callable[[Sequence[Mapping[str, Any]]], Awaitable[None]]
"""Told each listing of the server's tools (the pins see it: gateway/upstreams/servers.py)."""


@dataclass(frozen=True, slots=True)
class Forwarded:
    """How one forwarded call ended: the server's result, or why there is none."""

    duration_ms: int
    result: types.CallToolResult | None = None
    ended: str | None = None
    """None: the server answered. `timeout` (past the call's limit: the server stopped), `output_limit` (an
    answer over the cap: the server stopped), `unavailable` (the server ended: `cause` says how)."""
    cause: str | None = None
    error: str | None = None
    """The server answered the request with a JSON-RPC error, or with something that is no tools/call result."""
    synced: Synced | None = None
    """A `workspace: write` server's changes since the call began, brought into the workspace after it (sandbox/server.py)."""


def unavailable(upstream: str, cause: str, step: str | None = None) -> InternalError:
    """-32603 `upstream_unavailable`: the server cannot be used; `cause` names what failed and the fix, `step`
    (`data.step`, as `sandbox_start_failed`'s) the start's step that failed, when one did."""
    data = {} if step is None else {"step": step}
    return InternalError(Reason.UPSTREAM_UNAVAILABLE, f"upstream {upstream!r} is unavailable: {cause}", **data)


def logged_line(upstream: str, level: object, data: object) -> str:
    """One log message of `upstream`'s server as the gateway's log line: one line, its words escaped and cut at
    LOG_CHARS (a newline in them is written `\\u000a`: no text of the server's can pass for a line of the gateway's)."""
    said = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    cut = " [cut]" if len(said) > LOG_CHARS else ""
    return (
        f"upstream {upstream} logs ({shown(str(level)[:16])}, its own words, unchecked): {shown(said[:LOG_CHARS])}{cut}"
    )


@dataclass(slots=True)
class _Live:
    session: ClientSession
    server: ConfinedServer
    wire: Wire
    ended: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)


@dataclass(slots=True)
class _Life:
    """One server's life, from its start to its end."""

    settled: anyio.Event = field(default_factory=anyio.Event)
    """The start is over: the server is listed and serving, or it failed (`failed`)."""
    over: anyio.Event = field(default_factory=anyio.Event)
    failed: bool = False
    began: float = 0.0
    """When its spawn began (time.monotonic): the start's duration is logged."""


class Connection:
    """One upstream's server for the gateway: started at first use, started again after it ended."""

    def __init__(self, upstream: Upstream, place: Place, listed: Listed) -> None:
        self.upstream = upstream
        self.place = place
        self._listed = listed
        self._group: anyio.abc.TaskGroup | None = None
        self._live: _Live | None = None
        self._life: _Life | None = None
        self._failure: str | None = None
        self._relays: list[Relay] = []
        self.failure_step: str | None = None
        """The step of the last start that failed (`env`, or the sandbox's), for `data.step`."""
        self._turns = anyio.Lock()
        self._relisted: anyio.Event | None = None
        """Set once the listing asked for by the server's latest tools/list_changed is done."""
        self.starts = 0
        """Servers started so far (tests and logs read it)."""
        self.connections = ConnectionLog()
        """The server's connections through the egress proxy as they end; each call takes those ended by its end."""
        self.asking = CallsInFlight()
        """Who the server's proxy asks about a host an `ask` rule names: the one call in flight's person."""

    def attach(self, group: anyio.abc.TaskGroup | None) -> None:
        """The task group the server lives in (None: the gateway is stopping; nothing more starts)."""
        self._group = group

    @property
    def failure(self) -> str | None:
        """Why the last server could not start, or how it ended (None: nothing went wrong yet)."""
        return self._failure

    @property
    def alive(self) -> bool:
        return self._live is not None and not self._live.ended.is_set()

    async def ensure(self, wait_s: float = START_S) -> None:
        """The server running and listed, started if need be, waiting at most `wait_s`; else raises -32603
        `upstream_unavailable` with the cause (a start that failed is tried again at the next use)."""
        with anyio.move_on_after(wait_s):
            while not self.alive:
                life = self._life or self._begin()
                await life.settled.wait()
                if self.alive:
                    return
                if life.failed:
                    raise unavailable(
                        self.upstream.name, self._failure or "its server could not start", self.failure_step
                    )
                await life.over.wait()  # it ended just after it started: start another
        if self.alive:
            return
        raise unavailable(self.upstream.name, self._failure or f"its server did not start within {wait_s:g} s")

    def _begin(self) -> _Life:
        if self._group is None:
            raise unavailable(self.upstream.name, "the gateway is not serving (servers start only while it does)")
        life = self._life = _Life()
        self._failure = self.failure_step = None
        self._group.start_soon(self._run_life, life)
        return life

    async def stop(self) -> None:
        """Stop the server (the next use starts another); returns once it is gone."""
        live = self._live
        if live is not None:
            live.stop.set()
            with anyio.move_on_after(START_S):
                await live.ended.wait()

    async def fresh(self, wait_s: float = LIST_S) -> None:
        """Return once a listing the server asked for (tools/list_changed) is done, waiting at most `wait_s`."""
        relisted = self._relisted
        if relisted is not None:
            with anyio.move_on_after(wait_s):
                await relisted.wait()

    def _list_changed(self) -> None:
        """tools/list_changed, as the wire reads it: calls and listings from now on wait for the listing it asks for."""
        relisted = self._relisted = anyio.Event()
        if self._group is not None:
            self._group.start_soon(self._relist_quietly, relisted)
        else:
            relisted.set()

    async def relist(self) -> None:
        live = self._live
        if live is None:
            return
        with anyio.move_on_after(LIST_S):
            await self._list(live.session)

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        timeout_s: float,
        on_progress: Callable[[str | None], None],
        relay: Relay | None = None,
        ask_host: Asker | None = None,
    ) -> Forwarded:
        """Forward one tools/call; the caller has checked everything and the server is running (`ensure`)."""
        live = self._live
        if live is None or live.ended.is_set():
            raise unavailable(self.upstream.name, "its server ended before the call could be sent")

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            on_progress(message)

        started = time.monotonic()
        if relay is not None:
            self._relays.append(relay)
        try:
            # A writing server's calls take turns: what one call changed is synced alone (sandbox/server.py `sync`).
            async with self._turns if self.writable else contextlib.nullcontext(), self.asking.during(ask_host):
                forwarded = await self._forward(live, tool, arguments, timeout_s, progress)
                if self.writable and forwarded.ended is None:
                    forwarded = await self._synced(live, forwarded)
        finally:
            if relay is not None:
                self._relays.remove(relay)
        return dataclasses.replace(forwarded, duration_ms=int((time.monotonic() - started) * 1000))

    @property
    def writable(self) -> bool:
        return self.upstream.workspace is UpstreamWorkspace.WRITE

    async def _forward(
        self, live: _Live, tool: str, arguments: Mapping[str, Any], timeout_s: float, progress: ProgressFnT
    ) -> Forwarded:
        try:
            with anyio.move_on_after(timeout_s) as deadline:
                # The session's own read timeout stays off: a server's error -32001 is not our timeout.
                result = await live.session.call_tool(tool, dict(arguments), progress_callback=progress)
                return Forwarded(0, result=result)
        except MCPError as exc:
            if live.wire.over_limit:
                await self.stop()
                return Forwarded(0, ended="output_limit")
            if live.ended.is_set() or exc.code == types.CONNECTION_CLOSED:
                with anyio.move_on_after(2.0):
                    await live.ended.wait()
                return Forwarded(0, ended="unavailable", cause=self._failure or "its server ended during the call")
            return Forwarded(0, error=f"the server answered error {exc.code}: {shown(exc.message[:500])}")
        except ValidationError:
            return Forwarded(0, error="the server's answer is not a tools/call result")
        # Past the call's limit: the SDK sent notifications/cancelled as the scope left the call; the
        # server is stopped too (its work may not heed the cancel) and started again at the next use.
        if deadline.cancelled_caught:
            await self.stop()
        return Forwarded(0, ended="timeout")

    async def _synced(self, live: _Live, forwarded: Forwarded) -> Forwarded:
        """The call's changes brought in (a copy that cannot be read: none applied, `changes_unreadable`)."""
        return dataclasses.replace(forwarded, synced=await live.server.sync())

    # --- the server's life ----------------------------------------------------------------------

    def _spec(self) -> ServerSpec:
        upstream, place = self.upstream, self.place
        argv = [str(upstream.program.path)]
        for word in upstream.command[1:]:
            argv.append(str(place.root.path) if word == "{" + WORKSPACE_PLACEHOLDER + "}" else word)
        return ServerSpec(
            argv=tuple(argv),
            workspace=place.root,
            writable=upstream.workspace is UpstreamWorkspace.WRITE,
            protected=place.sandbox.protected_paths,
            limits=self._limits({}),
        )

    def _limits(self, env: Mapping[str, str]) -> Limits:
        upstream, sandbox = self.upstream, self.place.sandbox
        return Limits(
            timeout_s=upstream.timeout_s,
            memory_limit_mb=upstream.memory_limit_mb,
            max_processes=upstream.max_processes,
            max_output_bytes=upstream.max_output_bytes,
            network=upstream.network,
            proxy=upstream.egress is not None,
            allowed_paths=self.place.allowed_paths,
            env=env,
            scratch_bytes=sandbox.scratch_limit_mb * MIB,
            backend=sandbox.backend,
            require=None if sandbox.require is None else frozenset(sandbox.require),
            hidden=self.place.hidden,
        )

    def _on_proxy(self, group: anyio.abc.TaskGroup) -> Callable[[socket.socket], None] | None:
        """With the upstream's `network` a mapping, its server's listener served by the egress proxy (decision 90)
        in `group`, for the server's life; its byte cap (`sandbox.max_network_bytes`) is per server's life."""
        egress = self.upstream.egress
        if egress is None:
            return None
        limits = ProxyLimits(max_bytes=self.place.sandbox.max_network_bytes)
        key = f"upstreams.{self.upstream.name}.network"
        return proxy_starter(
            group, egress, limits, self.connections.add, key=key, ask=self.asking if egress.ask else None
        )

    async def _run_life(self, life: _Life) -> None:
        """Start the server, list its tools, then keep it until it ends or is stopped."""
        live: _Live | None = None
        try:
            try:
                own = resolve_env(self.upstream, self.place.environ)
            except KeyError as exc:
                self.failure_step = "env"
                self._failure = (
                    f"step env: the gateway's environment has no {exc.args[0]}, which upstreams.{self.upstream.name}.env"
                    " names; fix: set it where the gateway starts, or take it out of the policy"
                )
                return
            try:  # the program pinned at load, or none: a file put in its place never runs (decision 77)
                check_program_unchanged(self.upstream.program, f"upstreams.{self.upstream.name}")
            except GatewayError as exc:
                self.failure_step = "program"
                self._failure = f"step program: {exc.detail}"
                log.error("upstream %s: its server is not started: %s", self.upstream.name, self._failure)  # noqa: TRY400  (the cause is in the message)
                return
            with scratch_folder(f"up-{self.upstream.name[:8]}") as scratch:
                env = {**sandbox_environment(self.place.sandbox, scratch, self.place.environ), **own}
                spec = self._spec()
                spec = ServerSpec(spec.argv, spec.workspace, spec.writable, spec.protected, self._limits(env))
                self.starts += 1
                life.began = time.monotonic()
                async with (
                    task_group() as proxies,
                    start_server(
                        spec, scratch=scratch, host=self.place.host, on_proxy=self._on_proxy(proxies)
                    ) as server,
                ):
                    live = await self._session_life(server, life)
                    proxies.cancel_scope.cancel()  # the server is over: its proxy ends with it
        except SandboxStartError as exc:
            self.failure_step = start_step(exc.reason)
            self._failure = describe_start_failure(exc.reason)
            log.error("upstream %s: its server could not start: %s", self.upstream.name, self._failure)  # noqa: TRY400  (the cause is in the message)
        except Exception as exc:
            log.exception("upstream %s: its server failed", self.upstream.name)
            self._failure = self._failure or f"its server failed ({type(exc).__name__})"
        finally:
            if live is not None:
                live.ended.set()
            self._live = None
            self._life = None
            life.failed = not life.settled.is_set()
            life.settled.set()
            life.over.set()

    async def _session_life(self, server: ConfinedServer, life: _Life) -> _Live | None:
        wire = Wire(self.upstream.name, self.upstream.max_output_bytes + ENVELOPE_BYTES)
        wire.on_list_changed = self._list_changed
        async with session_streams(wire, server.stdin, server.stdout) as (read, write):
            session = ClientSession(
                read,
                write,
                sampling_callback=self._sampling,
                elicitation_callback=self._elicitation,
                list_roots_callback=self._roots,
                logging_callback=self._logged,
            )
            async with session, task_group() as group:
                live = _Live(session, server, wire)
                try:
                    with anyio.fail_after(START_S):
                        await session.initialize()
                        await self._list(session)
                except TimeoutError:
                    self._failure = f"its server did not answer initialize and tools/list within {START_S:g} s"
                    return live
                except MCPError:
                    self._failure = self._ended_cause(server, wire) or "its server refused initialize or tools/list"
                    return live
                self._live = live
                life.settled.set()
                took_ms = (time.monotonic() - life.began) * 1000
                log.info(
                    "upstream %s: server started and listed in %.0f ms (pid %d)",
                    self.upstream.name,
                    took_ms,
                    server.pid,
                )
                group.start_soon(self._watch_exit, server, live)
                group.start_soon(self._watch_wire, server, live)
                await live.stop.wait()
                group.cancel_scope.cancel()
                if not live.ended.is_set():
                    self._failure = self._ended_cause(server, wire)
                return live
        return None

    async def _watch_exit(self, server: ConfinedServer, live: _Live) -> None:
        await server.wait()
        self._failure = self._ended_cause(server, live.wire)
        log.warning("upstream %s: its server ended: %s", self.upstream.name, self._failure)
        live.ended.set()
        live.stop.set()

    async def _watch_wire(self, server: ConfinedServer, live: _Live) -> None:
        """Nothing more can be read of the server (its stdout closed, or a message over the cap): it is stopped,
        whether or not a call is waiting (the next use starts another)."""
        await live.wire.ended.wait()
        if not live.wire.over_limit:
            with anyio.move_on_after(EXIT_GRACE_S):
                await server.wait()  # its stdout closed as it exits: let it say how it ended (`_watch_exit`)
            if live.ended.is_set():
                return
        self._failure = (
            self._ended_cause(server, live.wire)
            if live.wire.over_limit
            else "its server closed its stdout and was stopped; fix: run its command by hand to see why"
        )
        live.stop.set()

    def _ended_cause(self, server: ConfinedServer, wire: Wire) -> str:
        if wire.over_limit:
            return f"its server wrote a message over {wire.line_cap} bytes and was stopped"
        how = server.ended_by() or "stopped"
        tail = shown(server.stderr_tail()[-STDERR_CHARS:].strip())
        said = f"; its stderr ends: {tail}" if tail else ""
        return (
            f"its server ended ({how}){said}; fix: run its command by hand to see why, or check"
            f" upstreams.{self.upstream.name} (command, env, memory_limit_mb, max_processes); the next call starts it again"
        )

    async def _list(self, session: ClientSession) -> None:
        tools: list[Mapping[str, Any]] = []
        cursor: str | None = None
        for _page in range(100):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listed = await session.list_tools(params=params)
            tools += [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in listed.tools]
            cursor = listed.next_cursor
            if not cursor:
                break
        await self._listed(tools)

    # --- what the server asks of the gateway ----------------------------------------------------

    async def _sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.ErrorData:
        log.info("upstream %s: asked for sampling; refused", self.upstream.name)
        return types.ErrorData(code=types.INVALID_REQUEST, message="sampling is refused by the gateway")

    async def _elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        if not self.upstream.relay_elicitation or not self._relays:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message="elicitation is refused by the gateway (upstreams.NAME.relay_elicitation is off)",
            )
        relay = self._relays[-1]  # the latest call in flight: its caller is asked, told who asks
        label = f"[upstream {self.upstream.name} asks, in its own words, unchecked] "
        return await relay(params.model_copy(update={"message": label + params.message}))

    async def _logged(self, params: types.LoggingMessageNotificationParams) -> None:
        """The server's log message, in the gateway's log at INFO whatever level the server gives it (its level is
        its own claim), escaped and cut: the server's words, never a line of the gateway's, and never a client's.
        Each server's messages are one kind of record to the log's rate limit (gateway/logs.py): the first shown,
        then at most one a minute, with the count of those not shown."""
        name = self.upstream.name
        log.info("%s", logged_line(name, params.level, params.data), extra={RATE_KEY: ("upstream logs", name)})

    async def _roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        root = types.Root(uri=self.place.root.path.as_uri(), name=self.place.workspace)  # type: ignore[arg-type]
        return types.ListRootsResult(roots=[root])

    async def _relist_quietly(self, relisted: anyio.Event) -> None:
        try:
            with contextlib.suppress(MCPError, ValidationError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                await self.relist()
        finally:
            relisted.set()
