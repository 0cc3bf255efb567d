"""What a tool is to the pipeline (docs/architecture.md, "Where a new tool plugs in"): a `ToolSpec` that carries its own behaviour.

A read tool has a `read`: a function of the runs the caller may see, run in process. A write
tool (`sandboxed`) has an `execute`: given one admitted call (`ExecutionRequest`), it runs in
the sandbox and returns a `ToolRun`. The pipeline never names a tool. For a write tool it
records how the run ended from the `ToolRun` (SANDBOX_EXEC), settles the budget with its
duration, hands it the user's totals for its evidence, and answers with its refusal or its
outcome (TOOL_FINISHED). A new tool is one more entry in gateway/tools/registry.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from gateway.audit import EventType
from gateway.errors import GatewayError
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.rbac import Permission
from gateway.tools.outcome import ToolOutcome

if TYPE_CHECKING:
    from mcp_types import ElicitRequestParams, ElicitResult, ErrorData

    from gateway.policy import SandboxPolicy
    from gateway.proxy import Asker, ConnectionLog
    from gateway.runs import RunStatus, RunStore
    from sandbox.change_set import ChangeSet
    from sandbox.confine import LayerReport
    from sandbox.pinned import Pinned


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """One admitted write call, as its tool receives it."""

    run_id: str
    root: Pinned
    """The workspace, pinned at policy load and found intact after consent."""
    allowed_paths: tuple[Pinned, ...]
    arguments: Mapping[str, Any]
    policy: SandboxPolicy
    timeout_s: int
    run_dir: Path
    """The run's artifacts folder, not yet created: the tool makes it."""
    environ: Mapping[str, str]
    host: LayerReport
    """What this host can enforce (`Services.host`, probed once by `open_services`)."""
    hidden: tuple[Path, ...] = ()
    """Folders the run must not even see (the gateway's state folder): sandbox.Limits.hidden."""
    progress: CallProgress = NO_PROGRESS
    """The caller's progress notifications (gateway/progress.py), while the run is on."""
    connections: ConnectionLog | None = None
    """Where the run's connections through the egress proxy are recorded (NET_CONNECT); None: not recorded."""
    ask_host: Asker | None = None
    """Puts a host an `ask` rule names to a person while the run waits (gateway/consent/network.py); None:
    such a host is refused (`needs_a_person`)."""
    relay: Relay | None = None
    """Asks the caller's client what an upstream server asks while the call is on (elicitation): None when the
    client cannot be asked in band. Only an upstream whose policy says `relay_elicitation: true` uses it."""


Relay: TypeAlias = "Callable[[ElicitRequestParams], Awaitable[ElicitResult | ErrorData]]"
"""Sends an upstream server's `elicitation/create` to the caller's client and returns its answer (gateway/server.py)."""


@dataclass(frozen=True, slots=True)
class Governance:
    """evidence.json's `governance`: the user's window totals including this run."""

    elapsed_ms_total: int
    attempts_total: int
    short_circuited: bool
    policy_timeout_s: int


@dataclass(frozen=True, slots=True)
class Written:
    """What a writing run (`workspace: write` or `review`) left for the pipeline: decision 80."""

    review: bool
    """A person decides whether it applies; False: it applies at once (`write`)."""
    changes: ChangeSet | None
    error: str | None
    """Why there is no change set (`RunResult.changes_error`): nothing of it applies."""


class ToolRun(Protocol):
    """A finished sandboxed run. How it ended comes from the sandbox (trusted); its answer is read
    from files the run wrote (untrusted), and only after the pipeline has recorded how it ended."""

    @property
    def duration_ms(self) -> int:
        """What the budget is charged."""
        ...

    @property
    def exit_code(self) -> int | None:
        """The run record's exit code (None: it had none, e.g. killed by a signal)."""
        ...

    @property
    def stopped(self) -> bool:
        """Whether the sandbox stopped it (a limit), rather than it ending by itself."""
        ...

    def sandbox_detail(self) -> Mapping[str, Any]:
        """SANDBOX_EXEC's detail: how the run ended, from the sandbox alone."""
        ...

    def refusal(self) -> GatewayError | None:
        """The error the call answers with when the run was stopped for a limit, else None."""
        ...

    def status(self) -> RunStatus:
        """The status of the run record and of TOOL_FINISHED when there is no refusal: `ok` or `error`."""
        ...

    def written(self) -> Written | None:
        """A writing run's change set, for the pipeline to apply or put to a person; None: the run read only."""
        ...

    def write_evidence(self, governance: Governance) -> None:
        """Write the run's evidence file (the gateway writes it, never the run)."""
        ...

    def read_outcome(self) -> ToolOutcome:
        """The answer, from the run's files; never raises on their content. Runs on a worker thread, unless
        `outcome_in_memory`."""
        ...

    @property
    def outcome_in_memory(self) -> bool:
        """Whether `read_outcome` only shapes an answer already in memory and checked against its cap (an
        upstream's), so it runs on the event loop's thread without a worker thread's hop (decision 87)."""
        ...

    def finished_detail(self, outcome: ToolOutcome) -> Mapping[str, Any]:
        """What TOOL_FINISHED records besides its status (counts, never content)."""
        ...


class Trust(StrEnum):
    """How far the gateway trusts the server a tool comes from: it moves a read-only tool's risk tier
    (docs/consent.md, "Risk tiers and expiry"). The gateway's own tools are trusted."""

    TRUSTED = "trusted"
    UNTRUSTED = "untrusted"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a tool comes from when the gateway did not write it: an upstream MCP server, put behind the
    pipeline by policy.yaml's `upstreams`. The tool is offered as `<upstream>__<tool>`."""

    upstream: str
    """The upstream's name in policy.yaml."""
    tool: str
    """The tool's own name on its server."""
    trust: Trust
    """The upstream's `trust`, as the policy says it."""
    description: str
    """The tool's description in the server's own words, unchecked: prompts show it marked as such."""
    definition_sha256: str
    """The digest of the tool's pinned definition (name, description, inputSchema, annotations): the
    consent fingerprint covers it, so a grant holds for the definition it was given for."""


class Execute(Protocol):
    async def __call__(self, request: ExecutionRequest, /) -> ToolRun: ...


class Read(Protocol):
    def __call__(
        self, runs: RunStore, arguments: Mapping[str, Any], visible: tuple[str, ...] | None, /
    ) -> ToolOutcome: ...


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    permission: Permission
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any]
    path_arguments: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The tool's `_meta` in tools/list (a declared risk tier: consent.RISK_META_KEY)."""
    max_timeout_s: int | None = None
    """A write tool's own time limit, at most sandbox.timeout_s (a declared tool's); None: the sandbox's."""
    check_ready: Callable[[], None] | None = None
    """Raises a GatewayError when what the tool was pinned to at policy load changed (a declared tool's
    program): called at stage 4, again after consent, and by the tool right before it runs."""
    programs: tuple[Path, ...] = ()
    """Files the run executes besides the interpreter (a declared tool's program and its `#!` interpreter, as
    they resolved at load): the preflight stage checks that the run's uid can read and execute them."""
    preview: Callable[[Mapping[str, Any], Path], str] | None = None
    """What `policy explain` says the run would be (a declared tool's argv), from the arguments and the workspace."""
    read: Read | None = None
    """A read tool's behaviour."""
    execute: Execute | None = None
    """A write tool's behaviour: it runs in the sandbox, needs consent and is charged to the budget."""
    origin: Origin | None = None
    """The upstream MCP server the tool comes from; None: the gateway's own tool (built-in or declared)."""
    execution_event: EventType = EventType.SANDBOX_EXEC
    """The event that records how a write tool's execution ended, with `ToolRun.sandbox_detail()` as its detail:
    SANDBOX_EXEC for a run in the sandbox, UPSTREAM_CALL for a call forwarded to an upstream server (decision 84)."""

    @property
    def sandboxed(self) -> bool:
        """A write tool."""
        return self.execute is not None
