"""The gateway's upstream servers and the tools they offer (docs/upstreams.md, decision 84).

`UpstreamServers` holds one `Connection` per upstream of the policy (its server serves the policy's
first workspace: decision 84), runs them in a task group of their own while `serve` is up (`running`:
every server stopped when it ends), and keeps, from each listing the pins have seen, which tools are
offered (PINNED, as `<upstream>__<tool>` ToolSpecs of their pinned definitions) and which are withheld
(CHANGED). `Catalogue` is the tool catalogue a gateway with upstreams hands the pipeline: the gateway's
own tools and those offered now; `refusal` says why an upstream's tool that is not offered cannot be
called (its definition changed, its server unavailable).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import anyio

from gateway.db.threads import in_db_thread
from gateway.errors import GatewayError, PolicyBlockedError, Reason
from gateway.policy import Policy
from gateway.tools.base import ToolSpec
from gateway.upstream_policy import SEPARATOR, Upstream, served_workspace
from gateway.upstreams.offered import Pinned, upstream_tool
from gateway.upstreams.pins import ListingRefusedError, PinState, ToolPin
from sandbox.confine import LayerReport
from sandbox.task_groups import task_group

if TYPE_CHECKING:
    from gateway.upstreams.connection import Connection

log = logging.getLogger("gateway.upstreams")

LIST_WAIT_S = 15.0
"""A tools/list waits at most this long for the servers it starts; those not up by then are left out of it."""


Observe = Callable[[str, Sequence[Mapping[str, Any]]], Mapping[str, ToolPin]]
"""`PinStore.observe` (gateway/upstreams/pins.py): the pins of the tools a server listed."""


def definition_changed(upstream: str, tool: str, why: str | None = None) -> PolicyBlockedError:
    if why is not None:
        return PolicyBlockedError(
            Reason.TOOL_DEFINITION_CHANGED,
            f"upstream {upstream!r} lists {tool!r} with a definition the gateway cannot pin ({why}): it is withheld",
        )
    return PolicyBlockedError(
        Reason.TOOL_DEFINITION_CHANGED,
        f"upstream {upstream!r} changed the definition of {tool!r} since it was pinned: it is withheld until an"
        f" ADMIN accepts the new one (`mcp-gateway upstream accept {upstream} {tool}` shows the difference)",
    )


class UpstreamServers:
    def __init__(
        self,
        policy: Policy,
        observe: Observe,
        *,
        environ: Mapping[str, str],
        host: LayerReport,
        hidden: tuple[Path, ...],
    ) -> None:
        self._policy = policy
        self._observe = observe
        self._offered: dict[str, Mapping[str, ToolSpec]] = {}
        """upstream -> offered name -> spec: the PINNED tools of its server's latest listing."""
        self._changed: dict[str, Mapping[str, str | None]] = {}
        """upstream -> its withheld tools (own names): None when the listed definition differs from the pinned
        one (CHANGED), else why it cannot be pinned (REFUSED)."""
        self._listing_refused: dict[str, str] = {}
        """upstream -> why its server's latest listing was refused whole (nothing of it offered)."""
        self._connections: dict[str, Connection] = {}
        self._no_place: dict[str, str] = {}
        workspace = served_workspace(policy.workspaces)
        root = None if workspace is None else policy.pins.get(policy.workspaces[workspace])
        allowed = tuple(p for p in (policy.pins.get(path) for path in policy.sandbox.allowed_paths) if p is not None)
        for name, upstream in policy.upstreams.items():
            if not policy.sandbox.enabled:  # a server is someone else's code: it runs confined or not at all
                self._no_place[name] = (
                    "the sandbox is off (sandbox.enabled: false), and an upstream's server runs only confined;"
                    " fix: set sandbox.enabled: true, then restart the gateway"
                )
                continue
            if workspace is None or root is None or not root.is_dir:
                self._no_place[name] = (
                    "the policy has no workspace folder for its server (workspaces: the first one, pinned at load);"
                    " fix: create the folder, then restart the gateway"
                )
                continue
            from gateway.upstreams.connection import Connection, Place  # noqa: PLC0415  (the MCP SDK's client loads only where a policy has upstreams)

            place = Place(workspace, root, policy.sandbox, environ, host, allowed, hidden)
            self._connections[name] = Connection(upstream, place, self._listener(upstream))

    # --- lifetime --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While the block runs, servers start at first use; when it ends, every one is stopped."""
        async with task_group() as group:
            for connection in self._connections.values():
                connection.attach(group)
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    for connection in self._connections.values():
                        connection.attach(None)
                    async with task_group() as stopping:
                        for connection in self._connections.values():
                            stopping.start_soon(connection.stop)
                group.cancel_scope.cancel()

    def connection(self, upstream: str) -> Connection | None:
        return self._connections.get(upstream)

    # --- what a call and a listing need first ----------------------------------------------------

    def upstream_of(self, name: str) -> Upstream | None:
        """The upstream whose offered tool `name` would be (its tool listed in the upstream's `tools`), else None."""
        prefix, separator, tool = name.partition(SEPARATOR)
        upstream = self._policy.upstreams.get(prefix) if separator else None
        return upstream if upstream is not None and tool in upstream.tools else None

    async def prepare(self, name: str) -> None:
        """Before a call of `name`: its upstream's server started and listed (at most START_S); a failure is
        kept for `refusal`, never raised here (the call is refused after authentication)."""
        upstream = self.upstream_of(name)
        connection = None if upstream is None else self._connections.get(upstream.name)
        if connection is not None:
            from gateway.upstreams.connection import START_S  # noqa: PLC0415  (the MCP SDK's client loads only where a policy has upstreams)

            with contextlib.suppress(GatewayError):
                await connection.ensure(START_S)
                await connection.fresh()

    async def prepare_listing(self, names: Sequence[str], wait_s: float = LIST_WAIT_S) -> None:
        """Before a tools/list: the servers of the upstreams whose tools `names` (the allowlist) holds, started
        together, waiting at most `wait_s`; a server not up by then is left out of this listing (and logged)."""
        wanted = {u.name for u in map(self.upstream_of, names) if u is not None}
        connections = [c for name, c in self._connections.items() if name in wanted]
        if not connections:
            return

        async def start(connection: Connection) -> None:
            try:
                await connection.ensure(wait_s)
            except GatewayError as exc:
                log.warning("tools/list: %s", exc.public_message())
                return
            await connection.fresh()

        async with task_group() as group:
            for connection in connections:
                group.start_soon(start, connection)

    def refusal(self, name: str) -> GatewayError | None:
        """Why the upstream tool `name`, not offered now, cannot be called (None: it is no upstream's tool)."""
        upstream = self.upstream_of(name)
        if upstream is None:
            return None
        from gateway.upstreams.connection import unavailable  # noqa: PLC0415  (the MCP SDK's client loads only where a policy has upstreams)

        tool = name.partition(SEPARATOR)[2]
        withheld = self._changed.get(upstream.name, {})
        if tool in withheld:
            return definition_changed(upstream.name, tool, withheld[tool])
        if upstream.name in self._listing_refused:
            return unavailable(upstream.name, f"its tools/list was refused: {self._listing_refused[upstream.name]}")
        if upstream.name in self._no_place:
            return unavailable(upstream.name, self._no_place[upstream.name])
        connection = self._connections[upstream.name]
        if not connection.alive:
            return unavailable(
                upstream.name, connection.failure or "its server is not running", connection.failure_step
            )
        return None

    # --- what the servers list --------------------------------------------------------------------

    def offered(self) -> Iterator[ToolSpec]:
        for specs in list(self._offered.values()):
            yield from specs.values()

    def spec(self, name: str) -> ToolSpec | None:
        upstream = self.upstream_of(name)
        return None if upstream is None else self._offered.get(upstream.name, {}).get(name)

    def _listener(self, upstream: Upstream) -> Callable[[Sequence[Mapping[str, Any]]], Any]:
        async def listed(tools: Sequence[Mapping[str, Any]]) -> None:
            await self._listed(upstream, tools)

        return listed

    async def _listed(self, upstream: Upstream, tools: Sequence[Mapping[str, Any]]) -> None:
        """A listing of `upstream`'s server: the tools the policy offers, seen by the pins; PINNED ones offered."""
        listed = [t for t in tools if t.get("name") in upstream.tools]
        names = {str(t["name"]) for t in listed}
        try:
            pins = await in_db_thread(self._observe, upstream.name, listed)
        except ListingRefusedError as exc:
            log.warning("upstream %s: its tools/list is refused, nothing of it offered: %s", upstream.name, exc)
            self._listing_refused[upstream.name] = str(exc)
            self._offered[upstream.name] = MappingProxyType({})
            return
        self._listing_refused.pop(upstream.name, None)
        connection = self._connections[upstream.name]
        specs: dict[str, ToolSpec] = {}
        withheld: dict[str, str | None] = {}
        for tool, pin in pins.items():
            if tool not in names:
                continue  # pinned once, not listed now: not offered
            if pin.state is not PinState.PINNED or pin.pinned is None or pin.pinned_sha256 is None:
                withheld[tool] = pin.reason if pin.state is PinState.REFUSED else None
                continue
            if not _is_object_schema(pin.pinned.get("inputSchema")):
                log.warning("upstream %s: a tool has no usable inputSchema; not offered", upstream.name)
                continue
            pinned = Pinned(tool, pin.pinned, pin.pinned_sha256)
            spec = upstream_tool(upstream, pinned, connection, self._pin_check(upstream))
            specs[spec.name] = spec
        self._offered[upstream.name] = MappingProxyType(specs)
        self._changed[upstream.name] = MappingProxyType(withheld)
        if withheld:
            log.warning("upstream %s: %d tool(s) withheld (mcp-gateway upstream list)", upstream.name, len(withheld))

    def _pin_check(self, upstream: Upstream) -> Callable[[str, str], GatewayError | None]:
        def check(tool: str, sha256: str) -> GatewayError | None:
            from gateway.upstreams.connection import unavailable  # noqa: PLC0415  (the MCP SDK's client loads only where a policy has upstreams)

            withheld = self._changed.get(upstream.name, {})
            if tool in withheld:
                return definition_changed(upstream.name, tool, withheld[tool])
            current = self._offered.get(upstream.name, {}).get(upstream.offered_name(tool))
            if current is None:
                return unavailable(upstream.name, f"its server no longer lists {tool!r}")
            if current.origin is None or current.origin.definition_sha256 != sha256:
                return definition_changed(upstream.name, tool)  # accepted anew since this call was admitted
            return None

        return check


def _is_object_schema(schema: object) -> bool:
    """A JSON Schema the gateway can validate arguments with: an object schema that is itself valid."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return False
    from jsonschema import Draft202012Validator, SchemaError  # noqa: PLC0415  (loaded at a listing, not at start)

    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError:
        return False
    return True


class Catalogue(Mapping[str, ToolSpec]):
    """The tools of a gateway with upstreams: its own (`base`), then the upstream tools offered now."""

    def __init__(self, base: Mapping[str, ToolSpec], servers: UpstreamServers) -> None:
        self._base = base
        self.servers = servers

    def __getitem__(self, name: str) -> ToolSpec:
        spec = self._base.get(name) or self.servers.spec(name)
        if spec is None:
            raise KeyError(name)
        return spec

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        yield from (spec.name for spec in self.servers.offered())

    def __len__(self) -> int:
        return len(self._base) + sum(1 for _ in self.servers.offered())

    def refusal(self, name: str) -> GatewayError | None:
        return self.servers.refusal(name)


def not_offered(tools: Mapping[str, ToolSpec], name: str) -> GatewayError | None:
    """Why `name` is not in the catalogue when an upstream would offer it (pipeline stage 3), else None."""
    return tools.refusal(name) if isinstance(tools, Catalogue) else None
