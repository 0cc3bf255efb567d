"""The stage list, in process (decision 52): one order for a call and its dry run, and tools that plug in.

A real state folder and SQLite database (tests/harness.py), the real pipeline and stores; only
the person answering consent is a small object of this file, and the second write tool is a
test-only one that runs a real subprocess. No sandbox run happens here: the e2e suites do that.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.consent.stage import Decision, Dialog, NoAnswer
from gateway.db.threads import in_db_thread
from gateway.errors import GatewayError, Reason, ToolTimeoutError
from gateway.permission_prompt import AUTHENTICATE as ASKER_KNOWN
from gateway.permission_prompt import CHECK, CONSENT, RULES, first
from gateway.pipeline import (
    AUTHENTICATE,
    DECISIONS,
    EXECUTIONS,
    GATES,
    ROUTES,
    STAGES,
    CallRequest,
    Pipeline,
    Step,
    Wait,
    checks,
    route,
)
from gateway.policy import load_policy
from gateway.rbac import Permission
from gateway.runs import RunStatus
from gateway.services import Services, open_services
from gateway.tools.base import ExecutionRequest, Governance, ToolSpec, Written
from gateway.tools.outcome import ToolOutcome
from gateway.tools.registry import TOOL_NAMES, TOOLS
from gateway.tools.schemas import WORKSPACE, object_schema
from tests.fakes import FAKE_HOST
from tests.harness import GatewayHome

RUN = ("run_pytest", {"test_path": "tests"})


@dataclass(frozen=True, slots=True)
class EchoRun:
    """The test tool's ToolRun: a real `echo`, and whether it was told to act as if stopped."""

    said: str
    exit_code: int | None
    duration_ms: int
    stopped: bool
    run_dir: Path

    def sandbox_detail(self) -> Mapping[str, Any]:
        return {"exit_code": self.exit_code, "duration_ms": self.duration_ms, "stopped": self.stopped}

    def refusal(self) -> GatewayError | None:
        return ToolTimeoutError(Reason.TIMEOUT, "stopped at its limit") if self.stopped else None

    def status(self) -> RunStatus:
        return RunStatus.OK if self.exit_code == 0 else RunStatus.ERROR

    def written(self) -> Written | None:
        return None  # it changes no workspace

    def write_evidence(self, governance: Governance) -> None:
        (self.run_dir / "evidence.json").write_text(json.dumps({"governance": asdict(governance)}))

    def read_outcome(self) -> ToolOutcome:
        return ToolOutcome(self.said, {"said": self.said})

    @property
    def outcome_in_memory(self) -> bool:
        return False  # read on a worker thread, as a sandboxed run's files are

    def finished_detail(self, outcome: ToolOutcome) -> Mapping[str, Any]:
        return {"characters": len(outcome.text)}


async def run_echo(request: ExecutionRequest) -> EchoRun:
    request.run_dir.mkdir(parents=True, mode=0o700)
    started = time.monotonic()
    done = await anyio.run_process(["/bin/echo", str(request.arguments["text"])], check=False)
    duration_ms = int((time.monotonic() - started) * 1000)
    stop = bool(request.arguments.get("stop", False))
    return EchoRun(done.stdout.decode().strip(), done.returncode, duration_ms, stop, request.run_dir)


ECHO = ToolSpec(
    name="run_echo",
    title="Echo",
    description="A test-only write tool: echoes its text.",
    permission=Permission.ORCHESTRATION_RUN,
    input_schema=object_schema(
        {"text": {"type": "string", "maxLength": 100}, "stop": {"type": "boolean"}, "workspace": WORKSPACE}, ["text"]
    ),
    annotations={"title": "Echo", "destructiveHint": False},
    execute=run_echo,
)


class Allows:
    """The person behind the client, allowing once."""

    async def ask(self, message: str, choices: tuple[Decision, ...]) -> Decision | NoAnswer | None:
        return Decision.ALLOW_ONCE


def services_of(home: GatewayHome, *extra: ToolSpec) -> Services:
    """The gateway's own composition of `home`, with `extra` tools in its catalogue and allowlist."""
    tools = {**TOOLS, **{spec.name: spec for spec in extra}}
    policy = load_policy(home.policy_path, TOOL_NAMES | frozenset(tools))
    return dataclasses.replace(open_services(home.settings, policy=policy, host=FAKE_HOST), tools=tools)


def call(services: Services, token: str, tool: str, arguments: Mapping[str, Any]) -> tuple[str, ToolOutcome]:
    request = CallRequest(tool, arguments, token)
    return anyio.run(Pipeline(services).call, request, Dialog(Allows()))


def kinds(home: GatewayHome, run_id: str) -> list[str]:
    return [e["event_type"] for e in home.events_of(run_id)]


@pytest.fixture
def echo_home(make_gateway: Any) -> GatewayHome:
    home: GatewayHome = make_gateway({"tools": {"allowlist": [*TOOL_NAMES, "run_echo"]}})
    home.add_user("alice")
    return home


def test_a_second_write_tool_needs_no_pipeline_change(echo_home: GatewayHome) -> None:
    services = services_of(echo_home, ECHO)
    run_id, outcome = call(services, echo_home.token("alice"), "run_echo", {"text": "hello"})
    assert outcome.text == "hello"
    events = echo_home.events_of(run_id)
    assert [e["event_type"] for e in events] == [
        "MCP_TOOL_CALL",
        "mcp.permission.decision",
        "TOOL_STARTED",
        "SANDBOX_EXEC",
        "TOOL_FINISHED",
    ]
    assert events[3]["detail"]["exit_code"] == 0
    assert events[4]["detail"] == {"status": "ok", "characters": 5}
    evidence = json.loads((echo_home.home / "artifacts" / run_id / "evidence.json").read_text())
    assert evidence["governance"]["attempts_total"] == 1  # the pipeline's totals, the tool's file
    record = services.runs.fetch(run_id)
    assert record is not None and record.status == "ok" and record.tool_name == "run_echo"
    assert echo_home.chain_ok()


def test_a_second_write_tools_refusal_is_answered_and_audited_as_any_runs(echo_home: GatewayHome) -> None:
    services = services_of(echo_home, ECHO)
    with pytest.raises(ToolTimeoutError) as refused:
        call(services, echo_home.token("alice"), "run_echo", {"text": "late", "stop": True})
    run_id = refused.value.data["run_id"]
    assert refused.value.stage == "execute"
    finished = echo_home.events_of(run_id)[-1]
    assert (finished["event_type"], finished["code"], finished["detail"]["reason"]) == (
        "TOOL_FINISHED",
        -32007,
        "timeout",
    )
    record = services.runs.fetch(run_id)
    assert record is not None and record.status == "timeout"


# --- explain and a call agree, stage for stage ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    case: str
    overrides: Mapping[str, Any]
    user: str
    tool: str
    arguments: Mapping[str, Any]
    stage: str
    code: int
    reason: str


REFUSALS = [
    Refusal("unknown user", {}, "ghost", *RUN, "authenticate", -32001, "user_unknown"),
    Refusal("disabled user", {}, "dora", *RUN, "authenticate", -32001, "user_disabled"),
    Refusal("unknown tool", {}, "alice", "run_shell", {}, "authorize", -32602, "unknown_tool"),
    Refusal("missing permission", {}, "vic", *RUN, "authorize", -32003, "missing_permission"),
    Refusal(
        "path outside", {}, "alice", "run_pytest", {"test_path": "../x"}, "policy", -32004, "path_outside_workspace"
    ),
    Refusal("not their workspace", {}, "alice", "list_artifacts", {"workspace": "other"}, "policy", -32004, ""),
    Refusal("invalid arguments", {}, "alice", "run_pytest", {"test_path": "tests", "x": 1}, "validate", -32602, ""),
    Refusal("no attempts", {"budget": {"attempts_total": 0}}, "alice", *RUN, "budget", -32005, "attempts_exhausted"),
    Refusal("sandbox off", {"sandbox": {"enabled": False}}, "alice", *RUN, "sandbox", -32006, "sandbox_disabled"),
    Refusal("consent deny", {"consent": {"mode": "deny"}}, "alice", *RUN, "consent", -32008, "consent_mode_deny"),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r.case for r in REFUSALS])
def test_explain_and_a_call_refuse_at_the_same_stage(make_gateway: Any, refusal: Refusal) -> None:
    home: GatewayHome = make_gateway(dict(refusal.overrides))
    for name, role in (("alice", "USER"), ("vic", "VIEWER"), ("dora", "USER")):
        home.add_user(name, role)
    home.users.disable("dora")
    services = services_of(home)

    dry = Pipeline(services).explain(refusal.user, refusal.tool, refusal.arguments)
    with pytest.raises(GatewayError) as wet:
        call(services, home.token(refusal.user), refusal.tool, refusal.arguments)

    last = dry[-1]
    assert (last.stage, last.code) == (wet.value.stage, wet.value.code) == (refusal.stage, refusal.code), dry
    assert last.reason == wet.value.reason
    if refusal.reason:
        assert wet.value.reason == refusal.reason
    passed = [report.stage for report in dry[:-1]]
    assert passed == [s.name for s in STAGES][: len(passed)], "the dry run walks the stages in order"
    assert all(report.code is None for report in dry[:-1])
    decided = ["mcp.permission.decision"] if refusal.stage == "consent" else []
    assert kinds(home, wet.value.data["run_id"]) == ["MCP_TOOL_CALL", *decided, "POLICY_BLOCKED"]


def test_a_call_that_would_run_is_explained_through_every_stage_it_passes(make_gateway: Any) -> None:
    home: GatewayHome = make_gateway()
    home.add_user("alice")
    reports = Pipeline(services_of(home)).explain("alice", *RUN)
    assert [r.stage for r in reports] == [
        "authenticate",
        "authorize",
        "policy",
        "validate",
        "preflight",
        "budget",
        "sandbox",
        "consent",
    ]
    assert all(r.code is None for r in reports)
    reads = Pipeline(services_of(home)).explain("alice", "list_artifacts", {})
    assert [r.stage for r in reads] == ["authenticate", "authorize", "policy", "validate", "execute"]


def test_the_hops_are_built_once_from_the_stages_a_read_and_a_write_tool_go_through() -> None:
    writes, reads = ROUTES[True], ROUTES[False]
    assert [s.name for s in writes.steps] == ["preflight", "budget", "sandbox"], "one hop with admission"
    assert [s.name for s in writes.waits] == ["consent"]
    assert isinstance(writes.execute, Wait), "a write tool's run is waited on"
    assert (reads.steps, reads.waits) == ((), ())
    assert isinstance(reads.execute, Step), "a read tool's execution runs in admission's hop"
    assert [s.name for s in STAGES] == [
        *("authenticate", "authorize", "policy", "validate"),
        *(s.name for s in (*GATES, *EXECUTIONS)),
    ]
    # A step after a stage that waits would cost a hop of its own: the routes refuse to be built so.
    consent, sandbox = GATES[3], GATES[2]
    with pytest.raises(ValueError, match="thread hop of its own"):
        route((consent, sandbox), EXECUTIONS, sandboxed=True)
    with pytest.raises(ValueError, match="exactly one execution"):
        route(GATES, (), sandboxed=False)


def test_stages_in_the_wrong_order_do_not_type_check() -> None:
    """The order is checked by mypy (strict, with warn_unused_ignores, in `make lint`): each ignore
    below is needed, or lint fails. At run time nothing stops the wrong order: the types do."""
    late = DECISIONS.then_all(checks(AUTHENTICATE))  # type: ignore[arg-type]  # authentication after admission
    assert [check.name for check in late.checks][-1] == "authenticate"
    unchecked = first(ASKER_KNOWN).then(RULES)  # type: ignore[arg-type]  # rules before the check
    assert [step.name for step in unchecked.steps] == ["authenticate", "rules"]
    right = first(ASKER_KNOWN).then(CHECK).then(RULES).last(CONSENT)
    assert right.names == ("authenticate", "check", "rules", "consent")


def test_a_refused_call_and_a_read_tools_call_each_take_one_hop_to_a_database_thread(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stages that do not wait run together on one database thread, with the refusal's events
    (decision 63): each hop wakes a thread twice, which a fleet on shared CPUs pays for."""
    home: GatewayHome = make_gateway({"sandbox": {"enabled": False}})
    home.add_user("alice")
    home.add_user("vic", "VIEWER")
    services = services_of(home)
    hops: list[str] = []

    async def counted(work: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(work, "__name__", repr(work)))
        return await in_db_thread(work, *args, **kwargs)

    monkeypatch.setattr("gateway.pipeline.in_db_thread", counted)
    with pytest.raises(GatewayError) as refused:
        call(services, home.token("vic"), *RUN)
    assert refused.value.code == -32003
    assert hops == ["_admitted"], "authentication, the refusal and its events: one hop"
    assert kinds(home, refused.value.data["run_id"]) == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]

    hops.clear()
    run_id, outcome = call(services, home.token("alice"), "list_artifacts", {})
    assert not outcome.is_error
    assert hops == ["_admitted"], "authentication, the decisions, the entry, the read and its end: one hop"
    assert kinds(home, run_id) == ["MCP_TOOL_CALL", "TOOL_FINISHED"]

    hops.clear()
    with pytest.raises(GatewayError) as no_sandbox:
        call(services, home.token("alice"), *RUN)
    assert no_sandbox.value.code == -32006
    assert hops == ["_admitted"], "a write tool's admission, its reservation and the sandbox's refusal: one hop"
    assert kinds(home, no_sandbox.value.data["run_id"]) == ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
