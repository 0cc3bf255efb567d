"""An upstream's tool as the gateway offers it (docs/upstreams.md, decision 84): its ToolSpec, its forwarded call, its ToolRun.

`upstream_tool` makes `<upstream>__<tool>` of a pinned definition (the pin's, never the server's latest:
gateway/upstreams/pins.py): the server's inputSchema (validated by the gateway at stage 5), its hints
(`title` and the four booleans, nothing else), its description, the upstream's permission and time limit,
`origin` set, and the pinned digest in `_meta` so a consent grant holds for that definition only. Its
`execute` forwards the admitted call to the running server; `UpstreamRun` is what the pipeline records of
it: UPSTREAM_CALL in place of SANDBOX_EXEC (the result's sha256, never its content), the refusal for a
call past its time (-32007), an answer over the cap (-32006 `output_limit`) or a server gone (-32603
`upstream_unavailable`), and the result passed on as the server gave it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import anyio

from gateway.audit import EventType
from gateway.canonical import canonical_json
from gateway.consent.stage import DECLARATION_META_KEY
from gateway.egress_policy import Network, describe_network
from gateway.errors import (
    GatewayError,
    Reason,
    SandboxViolationError,
    ToolTimeoutError,
)
from gateway.programs import check_program_unchanged
from gateway.proxy import ConnectionLog
from gateway.runs import RunStatus
from gateway.tools.base import ExecutionRequest, Governance, Origin, ToolSpec, Trust, Written
from gateway.tools.changes import changes_detail
from gateway.tools.confined import shown
from gateway.tools.outcome import ToolOutcome
from gateway.upstream_policy import Upstream

if TYPE_CHECKING:
    import mcp_types as types

    from gateway.upstreams.connection import Connection, Forwarded

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
PROGRESS_CHARS = 200


@dataclass(frozen=True, slots=True)
class Pinned:
    """A tool's accepted definition, as the pins hold it."""

    tool: str
    definition: Mapping[str, Any]
    """name, description, inputSchema, annotations (None when the server gave none)."""
    sha256: str


PinCheck = Callable[[str, str], GatewayError | None]
"""Why (tool, pinned sha256) may not be called now (its definition changed since), else None."""


def hints_of(annotations: object) -> Mapping[str, Any]:
    """The server's annotations the gateway passes on and rates risk by: `title` (text) and the four hints
    (booleans); anything else is dropped."""
    if not isinstance(annotations, Mapping):
        return MappingProxyType({})
    kept: dict[str, Any] = {k: annotations[k] for k in HINTS if isinstance(annotations.get(k), bool)}
    if isinstance(annotations.get("title"), str):
        kept["title"] = annotations["title"]
    return MappingProxyType(kept)


def upstream_tool(upstream: Upstream, pinned: Pinned, connection: Connection, pin_check: PinCheck) -> ToolSpec:
    """The catalogue entry of one upstream tool, from its pinned definition."""
    definition = pinned.definition
    description = definition.get("description")
    description = description if isinstance(description, str) else ""
    annotations = hints_of(definition.get("annotations"))
    name = upstream.offered_name(pinned.tool)
    tool = UpstreamTool(upstream, pinned, connection, pin_check)
    program = upstream.program
    return ToolSpec(
        name=name,
        title=str(annotations.get("title") or pinned.tool),
        description=description,
        permission=upstream.permission,
        input_schema=MappingProxyType(dict(definition["inputSchema"])),
        annotations=annotations,
        meta=MappingProxyType({DECLARATION_META_KEY: pinned.sha256}),
        max_timeout_s=upstream.timeout_s,
        check_ready=tool.check_ready,
        programs=tuple(p.real for p in (program, program.interpreter) if p is not None),
        preview=tool.preview,
        execute=tool.execute,
        origin=Origin(upstream.name, pinned.tool, Trust(upstream.trust), description, pinned.sha256),
        execution_event=EventType.UPSTREAM_CALL,
    )


@dataclass(frozen=True, slots=True)
class UpstreamTool:
    upstream: Upstream
    pinned: Pinned
    connection: Connection
    pin_check: PinCheck

    def check_ready(self) -> None:
        """Stage 4, again after consent, and right before the call: the definition still the one pinned (else
        -32004 `tool_definition_changed`), the server's program still the one pinned at load."""
        refusal = self.pin_check(self.pinned.tool, self.pinned.sha256)
        if refusal is not None:
            raise refusal
        check_program_unchanged(self.upstream.program, f"upstreams.{self.upstream.name}")

    def preview(self, arguments: Mapping[str, Any], root: Path) -> str:
        return (
            f"would forward the call to upstream {self.upstream.name}'s server (tool {self.pinned.tool},"
            f" workspace: {self.upstream.workspace}, network: {self._network()})"
        )

    def _network(self) -> str:
        if self.upstream.egress is None:
            return str(self.upstream.network).lower()
        return describe_network(Network(rules=self.upstream.egress))

    async def execute(self, request: ExecutionRequest) -> UpstreamRun:
        connection = self.connection
        await connection.ensure()  # a server that cannot start: -32603, nothing was sent
        await connection.fresh()  # a change the server announced is seen by the pins first
        self.check_ready()  # a restarted server listed its tools again: the pins saw them
        said: list[str] = []

        def moved(message: str | None) -> None:
            if message:
                said.append(shown(message[:PROGRESS_CHARS]))
            request.progress.moved()

        def describe() -> str:
            last = f": {said[-1]}" if said else ""
            return f"Calling {self.upstream.offered_name(self.pinned.tool)} on upstream {self.upstream.name}{last}"

        forwarded: list[Forwarded] = []
        raised: list[Exception] = []
        async with request.progress.waiting(describe), anyio.create_task_group() as group:
            if request.connections is not None:  # the server's connections as they end: this call's record, live
                group.start_soon(_passed_on, connection.connections, request.connections)
            try:
                forwarded.append(
                    await connection.call(
                        self.pinned.tool,
                        request.arguments,
                        timeout_s=request.timeout_s,
                        on_progress=moved,
                        relay=request.relay,
                        ask_host=request.ask_host,
                    )
                )
            except Exception as exc:  # raised after the group, as itself: never wrapped in a group
                raised.append(exc)
            finally:
                group.cancel_scope.cancel()
                if request.connections is not None:  # those that ended by now, to the last
                    _pass_on(connection.connections, request.connections)
        if raised:
            raise raised[0]
        return UpstreamRun.of(self.upstream, self.pinned.tool, request, forwarded[0])


def _pass_on(server: ConnectionLog, call: ConnectionLog) -> None:
    for record in server.drain():
        call.add(record)


async def _passed_on(server: ConnectionLog, call: ConnectionLog) -> None:
    """Until cancelled: each connection of the server that ends while the call is in flight goes to the call's log
    at once (the call's trail writes it while the call is on: decision 98). The server's proxy cannot tell which
    call made a connection: one that ends while the call is in flight is the call's (decision 97)."""
    while True:
        await server.arrived()
        _pass_on(server, call)


def result_document(result: types.CallToolResult) -> dict[str, Any]:
    """What is passed on of a result, as JSON: content, structuredContent, isError (its hash is of this)."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {key: dumped[key] for key in ("content", "structuredContent", "isError") if key in dumped}


@dataclass(frozen=True, slots=True)
class UpstreamRun:
    """One forwarded call, ended: a ToolRun (gateway/tools/base.py) whose account is UPSTREAM_CALL's."""

    upstream: Upstream
    tool: str
    run_id: str
    run_dir: Path
    timeout_s: int
    forwarded: Forwarded
    document: dict[str, Any] | None
    """The result as passed on (`result_document`), None without one: made once per call (decision 87)."""
    canonical: bytes
    """The document's canonical JSON (empty without one): its size is checked, its sha256 recorded."""

    @classmethod
    def of(cls, upstream: Upstream, tool: str, request: ExecutionRequest, forwarded: Forwarded) -> UpstreamRun:
        result = forwarded.result
        document = None if result is None else result_document(result)
        canonical = b"" if document is None else canonical_json(document).encode()
        return cls(upstream, tool, request.run_id, request.run_dir, request.timeout_s, forwarded, document, canonical)

    @property
    def duration_ms(self) -> int:
        return self.forwarded.duration_ms

    @property
    def exit_code(self) -> int | None:
        return None

    @property
    def stopped(self) -> bool:
        return self.forwarded.ended is not None

    @property
    def outcome_in_memory(self) -> bool:
        return True  # the server's answer, held and its size checked (`refusal`) before it is read

    def _is_error(self) -> bool:
        result = self.forwarded.result
        return result is None or bool(result.is_error)

    def sandbox_detail(self) -> Mapping[str, Any]:
        """UPSTREAM_CALL's detail: how the call went, never what it said."""
        return {
            "upstream": self.upstream.name,
            "tool": self.tool,
            "duration_ms": self.forwarded.duration_ms,
            "is_error": self._is_error(),
            "result_sha256": None if self.document is None else hashlib.sha256(self.canonical).hexdigest(),
            "result_bytes": len(self.canonical),
            "ended": self.ended(),
            **self._changes(),
        }

    def _changes(self) -> dict[str, Any]:
        """A writing server's changes (`workspace: write`), as WORKSPACE_CHANGES records a run's (hashes, never content)."""
        synced = self.forwarded.synced
        if synced is None:
            return {}
        applied = synced.applied
        return {"changes": dict(changes_detail(synced.changes, applied.applied, "policy", applied.reason))}

    def ended(self) -> str | None:
        """How the call ended, as UPSTREAM_CALL says and the refusal follows (one reading of both): None (the
        server's result, passed on), `error` (its JSON-RPC error, passed on as an error result), or the
        refusal's cause: `timeout`, `unavailable`, `output_limit` (a line over the wire's cap, or a whole
        answer over `max_output_bytes`)."""
        if self.forwarded.ended is not None:
            return self.forwarded.ended
        if len(self.canonical) > self.upstream.max_output_bytes:
            return "output_limit"
        return "error" if self.forwarded.error else None

    def refusal(self) -> GatewayError | None:
        ended, name = self.ended(), self.upstream.name
        if ended == "timeout":
            return ToolTimeoutError(
                Reason.TIMEOUT,
                f"upstream {name}'s call went past {self.timeout_s} s (upstreams.{name}.timeout_s): it was cancelled"
                " and the server stopped; the next call starts it again",
            )
        if ended == "output_limit":
            return SandboxViolationError(
                Reason.OUTPUT_LIMIT,
                f"upstream {name}'s answer is over {self.upstream.max_output_bytes} bytes"
                f" (upstreams.{name}.max_output_bytes); nothing of it is passed on",
            )
        if ended == "unavailable":
            from gateway.upstreams.connection import unavailable  # noqa: PLC0415  (the MCP SDK's client loads only where a policy has upstreams)

            return unavailable(name, self.forwarded.cause or "its server ended during the call")
        return None

    def status(self) -> RunStatus:
        return RunStatus.ERROR if self._is_error() else RunStatus.OK

    def written(self) -> Written | None:
        return None

    def write_evidence(self, governance: Governance) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        evidence = {"governance": asdict(governance), "upstream": dict(self.sandbox_detail())}
        (self.run_dir / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True) + "\n", "utf-8")

    def read_outcome(self) -> ToolOutcome:
        if self.forwarded.error is not None:  # the server answered with an error, not a result: passed on as one
            return ToolOutcome(self.forwarded.error, is_error=True)
        document = self.document or {}
        content = tuple(document.get("content", ()))
        texts = [str(block.get("text", "")) for block in content if block.get("type") == "text"]
        structured = document.get("structuredContent")
        return ToolOutcome(
            "\n".join(texts),
            structured if isinstance(structured, Mapping) else None,
            is_error=bool(document.get("isError", False)),
            content=content,
        )

    def finished_detail(self, outcome: ToolOutcome) -> Mapping[str, Any]:
        return {"is_error": outcome.is_error, "duration_ms": self.forwarded.duration_ms}
