"""The gateway's MCP server in process: `build_server(services)` over the SDK's memory streams.

`MemorySession` serves `build_server(open_services(...))` on a real database (the state folder
`GatewayHome` built) to the MCP SDK's own `ClientSession`, over the SDK's in-memory streams
(`mcp.shared.memory`), as the SDK's own tests do. Everything behind the transport is the real
thing: the pipeline, the stores, the audit chain, the consent stage. Only the stdio framing is
missing: the wire itself (framing, hostile bytes, stdout, signals, faults) stays with
`StdioSession` (tests/harness.py), and so does anything that runs the sandbox, since the host
here is `FAKE_HOST` (no probe). What `serve` runs beside the server (the sweeper of overdue runs
and orphaned questions, the signal and database-file watchers, the start-wait setting, its
stderr lines) is `serve`'s, not `build_server`'s, and is not run here.

It speaks the same dicts as `StdioSession` (`{"result": ...}` or `{"error": ...}`, `unsolicited`,
`responder`), so one assertion reads the same on both. The event loop runs in a thread of its
own (an anyio blocking portal, as Starlette's TestClient does), so tests stay synchronous.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any, ClassVar

import anyio
import mcp_types as types
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams
from pydantic import RootModel

from gateway.server import build_server
from gateway.services import Services, open_services
from gateway.settings import Settings
from tests.fakes import FAKE_HOST
from tests.harness import LEGACY, MODERN, GatewayHome

Message = dict[str, Any]


class AnyResult(RootModel[dict[str, Any]]):
    """A result as the server sent it (after the session checked it against the protocol's schema)."""


class RawRequest(types.Request[dict[str, Any] | None, str]):
    """Any method with any params, as a client may send it (e.g. `params.auth`, which the SDK's
    own request models drop). The session still stamps it (2026-07-28 `_meta`) and still checks
    the answer against the negotiated protocol version's schema."""

    params: dict[str, Any] | None = None
    name_param: ClassVar[str | None] = None


@dataclasses.dataclass
class MemorySession:
    """One client connected to `build_server(services)` in process; see the module's docstring."""

    services: Services
    session: ClientSession
    portal: BlockingPortal
    in_flight: dict[Any, Future[Message]] = dataclasses.field(default_factory=dict)
    """Requests `send` started, by id, until `wait_response` collects them."""
    unsolicited: list[Message] = dataclasses.field(default_factory=list)
    """What the server sent that is not a response: its requests (elicitation/create) and notifications."""
    responder: Callable[[Message], Message] | None = None
    """Answers the server's requests (elicitation/create): message -> result, or {"error": {...}}.
    Without one, a request is never answered (a person who never looks), as with `StdioSession`."""

    def request(self, method: str, params: Mapping[str, Any] | None = None, timeout: float = 60) -> Message:
        """Send one request and wait for its answer, as the JSON-RPC response's `result` or `error`."""
        return self.request_soon(method, params, timeout).result()

    def request_soon(
        self, method: str, params: Mapping[str, Any] | None = None, timeout: float = 60
    ) -> Future[Message]:
        """Send one request without waiting: several are then in flight; `.result()` is its answer."""
        progress = (params or {}).get("_meta", {}).get("progressToken") is not None
        request = RawRequest(method=method, params=dict(params) if params is not None else None)
        return self.portal.start_task_soon(self._send, request, timeout, progress)

    def send(self, message: Mapping[str, Any]) -> None:
        """A request sent without waiting, as `StdioSession.send` sends one; `wait_response(its id)` collects
        its answer. Only requests: what is not one (a notification, bytes) is the wire's business."""
        if "id" not in message or "method" not in message:
            raise ValueError("MemorySession.send takes requests; test notifications and raw bytes over stdio")
        self.in_flight[message["id"]] = self.request_soon(message["method"], message.get("params"))

    def wait_response(self, request_id: Any, timeout: float = 60) -> Message:
        return {"jsonrpc": "2.0", "id": request_id, **self.in_flight.pop(request_id).result(timeout)}

    def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, token: str | None = None, timeout: float = 60
    ) -> Message:
        params: Message = {"name": name, "arguments": dict(arguments or {})}
        if token is not None:
            params["auth"] = {"token": token}
        return self.request("tools/call", params, timeout)

    async def _send(self, request: RawRequest, timeout: float, progress: bool) -> Message:
        with anyio.fail_after(timeout):
            try:
                result = await self.session.send_request(
                    request, AnyResult, progress_callback=self._progress if progress else None
                )
            except MCPError as exc:
                return {"error": exc.error.model_dump(mode="json", exclude_none=True)}
        return {"result": result.root}

    async def _progress(self, progress: float, total: float | None, message: str | None) -> None:
        params = {"progress": progress, "total": total, "message": message}
        self.unsolicited.append(
            {"method": "notifications/progress", "params": {k: v for k, v in params.items() if v is not None}}
        )

    async def _elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        message = {"method": "elicitation/create", "params": params.model_dump(by_alias=True, mode="json")}
        self.unsolicited.append(message)
        if (responder := self.responder) is None:
            await anyio.sleep_forever()  # cancelled with the call, or when the session closes
            raise RuntimeError("anyio.sleep_forever returned")
        answer = responder(message)
        if "error" in answer:
            return types.ErrorData.model_validate(answer["error"])
        return types.ElicitResult.model_validate(answer)

    async def _notified(self, message: Any) -> None:
        if isinstance(message, Exception):  # what a transport failed to read: memory streams parse nothing
            raise message
        self.unsolicited.append(message.model_dump(by_alias=True, mode="json", exclude_none=True))


@asynccontextmanager
async def serve_in_memory(
    services: Services, portal: BlockingPortal, *, elicitation: bool, version: str
) -> AsyncIterator[MemorySession]:
    """`build_server(services)` and a `ClientSession` on one pair of memory streams, the server's
    task cancelled on the way out whatever happened (a test never leaves it running)."""
    server = build_server(services)
    holder: list[MemorySession] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        return await holder[0]._elicit(params)

    async def notified(message: Any) -> None:
        await holder[0]._notified(message)

    async with (
        create_client_server_memory_streams() as (client_streams, server_streams),
        anyio.create_task_group() as group,
    ):
        (server_read, server_write), (client_read, client_write) = server_streams, client_streams
        group.start_soon(partial(server.run, server_read, server_write, server.create_initialization_options()))
        client = ClientSession(
            client_read,
            client_write,
            elicitation_callback=elicit if elicitation else None,
            message_handler=notified,
            client_info=types.Implementation(name="tests", version="1"),
        )
        try:
            async with client:
                holder.append(MemorySession(services, client, portal))
                with anyio.fail_after(30):
                    if version == LEGACY:
                        await client.initialize()
                    else:
                        await client.discover()  # server/discover, as a 2026-07-28 client starts
                if client.protocol_version != version:
                    raise RuntimeError(f"the session speaks {client.protocol_version}, not {version}")
                yield holder[0]
        finally:
            group.cancel_scope.cancel()


def services_for(
    gateway: GatewayHome, *, db_url: str | None = None, environ: Mapping[str, str] | None = None
) -> Services:
    """What `mcp-gateway serve` builds for this state folder (its own engine), on a host with every
    layer (`FAKE_HOST`: no probe, no sandbox run here); `environ` is the server's environment
    (MCP_GATEWAY_TOKEN for `auth.env_token`), empty unless given."""
    settings = Settings(gateway.home, db_url or gateway.url, gateway.policy_path)
    services = open_services(settings, host=FAKE_HOST)
    return dataclasses.replace(services, environ=dict(environ or {}))


@contextmanager
def memory_session(
    gateway: GatewayHome,
    *,
    elicitation: bool = False,
    version: str = LEGACY,
    db_url: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Iterator[MemorySession]:
    """A client of `build_server` in process for `gateway`'s state folder; `elicitation` declares
    form elicitation (answered by the session's `responder`), `version` is LEGACY (initialize)
    or MODERN (2026-07-28: `server/discover`, then the envelope in every request's `_meta`)."""
    with memory_session_of(
        services_for(gateway, db_url=db_url, environ=environ), elicitation=elicitation, version=version
    ) as session:
        yield session


@contextmanager
def memory_session_of(
    services: Services, *, elicitation: bool = False, version: str = LEGACY
) -> Iterator[MemorySession]:
    """`memory_session` for services a test built itself (e.g. with a tool of its own); their engine is
    disposed of at the end."""
    if version not in (LEGACY, MODERN):
        raise ValueError(f"no such protocol era in these tests: {version}")
    try:
        with start_blocking_portal() as portal:
            context = serve_in_memory(services, portal, elicitation=elicitation, version=version)
            with portal.wrap_async_context_manager(context) as session:
                yield session
    finally:
        services.engine.dispose()
