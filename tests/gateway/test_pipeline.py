"""The pipeline (docs/architecture.md): stage 7's decision, and whole calls in process, one per refusing stage.

The in-process calls use a real SQLite file and fakes for the clock, the ids and the host
(tests/fakes.py); the wire is the e2e suites' business.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from sqlalchemy import Engine, text

from gateway import pipeline as pipeline_module
from gateway.audit import AuditEvent
from gateway.auth import ensure_keys, issue_token
from gateway.budget import Usage
from gateway.consent.stage import (
    OUT_OF_BAND,
    Answer,
    ConsentChannel,
    Decision,
    InputRequired,
    Origin,
    RoundTrip,
    consent_profile,
)
from gateway.consent.store import Channel, Grant, GrantDecision
from gateway.db import make_engine, migrate
from gateway.db.threads import in_db_thread
from gateway.errors import GatewayError, SandboxViolationError
from gateway.pipeline import CallRequest, Pipeline, check_sandbox_ready, start_refusal, who_decided
from gateway.policy import parse_policy
from gateway.services import Services, open_services
from gateway.settings import Settings
from gateway.tools.outcome import ToolOutcome
from gateway.tools.registry import TOOL_NAMES
from sandbox.confine import LayerReport
from sandbox.errors import SandboxStartError
from sandbox.guarantees import Guarantee
from tests.fakes import FAKE_HOST, FakeClock, SequentialRunIds
from tests.harness import DEFAULT_POLICY, deep_merge, reachable_by_everyone


@pytest.mark.parametrize(
    ("enabled", "missing", "reason"),
    [
        (True, [], None),
        (False, [], "sandbox_disabled"),
        (False, [Guarantee.FILE_GRANTS], "sandbox_disabled"),
        (True, [Guarantee.FILE_GRANTS], "sandbox_layer_missing"),
        (True, [Guarantee.OWN_IDENTITY, Guarantee.SYSCALL_FILTER], "sandbox_layer_missing"),
    ],
)
def test_check_sandbox_ready(enabled: bool, missing: list[Guarantee], reason: str | None) -> None:
    if reason is None:
        check_sandbox_ready(enabled, missing)
        return
    with pytest.raises(SandboxViolationError) as caught:
        check_sandbox_ready(enabled, missing)
    assert caught.value.reason == reason
    assert caught.value.code == -32006
    for guarantee in missing if reason == "sandbox_layer_missing" else []:
        assert guarantee in caught.value.public_message()
    if reason == "sandbox_layer_missing":
        assert "mcp-gateway doctor" in caught.value.public_message()


def test_a_missing_guarantee_names_its_cause_and_fix() -> None:
    with pytest.raises(SandboxViolationError) as caught:
        check_sandbox_ready(True, [Guarantee.FILE_GRANTS], dataclasses.replace(FAKE_HOST, landlock=0))
    message = caught.value.public_message()
    assert "file_grants: the kernel has no Landlock; fix: boot a kernel with CONFIG_SECURITY_LANDLOCK" in message


# --- the pipeline in process: a real SQLite file, fakes for the clock, the ids and the host ---------------


@dataclass(frozen=True, slots=True)
class InProcess:
    """A gateway without a server: `Pipeline(services).call` and the audit rows it leaves."""

    services: Services
    clock: FakeClock

    def token(self, user: str = "alice", *, issued_at: float | None = None, jti: str = "jti-1") -> str:
        now = self.clock.now() if issued_at is None else issued_at
        return issue_token(self.services.keys, self.services.policy.auth, user, now=now, ttl_s=600, jti=jti)

    def call(
        self, tool: str, arguments: Mapping[str, Any], token: object, asker: ConsentChannel = OUT_OF_BAND
    ) -> tuple[str, ToolOutcome]:
        async def bounded() -> tuple[str, ToolOutcome]:
            with anyio.fail_after(5):
                return await Pipeline(self.services).call(CallRequest(tool, arguments, token), asker)

        return anyio.run(bounded)

    def refused(self, tool: str, arguments: Mapping[str, Any], token: object) -> GatewayError:
        with pytest.raises(GatewayError) as caught:
            self.call(tool, arguments, token)
        return caught.value

    def events(self) -> list[AuditEvent]:
        return list(self.services.audit.events())

    def usage(self, user: str = "alice") -> Usage:
        return self.services.budget.usage(user, self.services.policy.budget)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database file at the newest schema, migrated once: each test starts from a copy."""
    path = tmp_path_factory.mktemp("schema") / "gateway.db"
    engine = make_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()  # the last connection folds the WAL back into the file
    return path


@pytest.fixture
def in_process(tmp_path: Path, migrated: Path) -> Iterator[Callable[..., InProcess]]:
    engines: list[Engine] = []

    # Outside pytest's 0700 temp folder, open to everyone: the preflight stage checks the run's uid reaches them.
    outside = Path(tempfile.mkdtemp(prefix="mcp-gw-test-"))

    def make(overrides: Mapping[str, Any] | None = None, host: LayerReport = FAKE_HOST) -> InProcess:
        workspace, other = outside / "workspace", outside / "other"
        for folder in (workspace / "tests", other):
            folder.mkdir(parents=True, exist_ok=True)
        reachable_by_everyone(workspace)
        reachable_by_everyone(other)
        document = deep_merge(DEFAULT_POLICY, {"workspaces": {"default": str(workspace), "other": str(other)}})
        document = deep_merge(document, overrides or {})
        policy = parse_policy(yaml.safe_dump(document), tmp_path / "policy.yaml", TOOL_NAMES)
        home = tmp_path / "state"
        home.mkdir(mode=0o700, exist_ok=True)
        ensure_keys(home, policy.auth.algorithms)
        shutil.copyfile(migrated, home / "gateway.db")
        settings = Settings(home, f"sqlite:///{home / 'gateway.db'}", tmp_path / "policy.yaml")
        engine = make_engine(settings.db_url)
        engines.append(engine)
        clock = FakeClock()
        services = open_services(
            settings, policy=policy, clock=clock, new_id=SequentialRunIds(), engine=engine, host=host
        )
        services.users.add("alice", "USER", ("default",))
        services.users.add("vic", "VIEWER", ("default",))
        return InProcess(services, clock)

    yield make
    for engine in engines:
        engine.dispose()
    shutil.rmtree(outside, ignore_errors=True)


ALL_PASS = {"test_path": "tests"}
"""run_pytest arguments every stage before consent lets through."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call refused at one stage, and the events it leaves."""

    tool: str
    arguments: Mapping[str, Any]
    token: str
    """none, garbage, expired, revoked, or a user's name."""
    code: int
    reason: str
    events: tuple[str, ...] = ("MCP_TOOL_CALL", "POLICY_BLOCKED")
    overrides: Mapping[str, Any] = field(default_factory=dict)
    host: LayerReport = FAKE_HOST
    spent: Mapping[str, int] = field(default_factory=dict)
    """Budget charges already taken (run_id -> worst-case ms) before the call."""
    counted: bool = False
    """Refused after stage 6: the attempt counts (its reservation settled to nothing spent)."""


REFUSALS: dict[str, Refusal] = {
    "no token": Refusal("list_artifacts", {}, "none", -32001, "token_missing"),
    "garbage token": Refusal("list_artifacts", {}, "garbage", -32001, "token_malformed"),
    "expired token": Refusal("list_artifacts", {}, "expired", -32001, "token_expired"),
    "revoked token": Refusal("list_artifacts", {}, "revoked", -32001, "token_revoked"),
    "role without the permission": Refusal("run_pytest", ALL_PASS, "vic", -32003, "missing_permission"),
    "path outside the workspace": Refusal(
        "run_pytest", {"test_path": "../other"}, "alice", -32004, "path_outside_workspace"
    ),
    "workspace not yours": Refusal(
        "run_pytest", {"test_path": "tests", "workspace": "other"}, "alice", -32004, "workspace_not_allowed"
    ),
    "invalid arguments": Refusal("run_pytest", {"test_path": "tests", "bogus": 1}, "alice", -32602, "invalid_arguments"),
    "attempts exhausted": Refusal(
        "run_pytest", ALL_PASS, "alice", -32005, "attempts_exhausted",
        overrides={"budget": {"attempts_total": 1}}, spent={"earlier": 1000},
    ),
    "elapsed time exhausted": Refusal(
        "run_pytest", ALL_PASS, "alice", -32005, "elapsed_exhausted",
        overrides={"budget": {"elapsed_ms_total": 1000}}, spent={"earlier": 1000},
    ),
    "sandbox disabled": Refusal(
        "run_pytest", ALL_PASS, "alice", -32006, "sandbox_disabled",
        overrides={"sandbox": {"enabled": False}}, counted=True,
    ),
    "sandbox layer missing": Refusal(
        "run_pytest", ALL_PASS, "alice", -32006, "sandbox_layer_missing",
        host=dataclasses.replace(FAKE_HOST, landlock=0), counted=True,
    ),
    "consent mode deny": Refusal(
        "run_pytest", ALL_PASS, "alice", -32008, "consent_mode_deny",
        events=("MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"),
        overrides={"consent": {"mode": "deny"}}, counted=True,
    ),
}  # fmt: skip


def _token(gateway: InProcess, kind: str) -> object:
    if kind == "none":
        return None
    if kind == "garbage":
        return "not-a-jwt"
    if kind == "expired":
        return gateway.token(issued_at=gateway.clock.now() - 3600)
    if kind == "revoked":
        gateway.services.tokens.revoke("jti-revoked", gateway.clock.now())
        return gateway.token(jti="jti-revoked")
    return gateway.token(kind)


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_each_refusing_stage_leaves_its_terminal_event(in_process: Callable[..., InProcess], case: Refusal) -> None:
    gateway = in_process(case.overrides, case.host)
    for run_id, worst_case_ms in case.spent.items():
        gateway.services.budget.reserve("alice", run_id, gateway.services.policy.budget, worst_case_ms)
    before = gateway.usage()

    error = gateway.refused(case.tool, case.arguments, _token(gateway, case.token))

    assert (error.code, error.reason) == (case.code, case.reason)
    events = gateway.events()
    assert tuple(e.event_type for e in events) == case.events
    assert {e.run_id for e in events} == {error.data["run_id"]}
    terminal = events[-1]
    assert terminal.code == case.code
    assert terminal.detail == {"blocked_reason": case.reason}
    assert terminal.tool_name == case.tool
    authenticated = case.token not in ("none", "garbage", "expired", "revoked")
    assert terminal.user == (case.token if authenticated else None)
    # Nothing ran: no time is charged, and the attempt counts only once stage 6 took it.
    assert gateway.usage() == Usage(before.attempts + case.counted, before.elapsed_ms)
    if case.code == -32008:
        decision = events[1].detail
        assert (decision["decision"], decision["origin"], decision["reason"]) == (
            "DENY_ONCE",
            "policy",
            "consent_mode_deny",
        )


ADMISSION_REFUSALS = [
    "no token", "garbage token", "expired token", "revoked token", "role without the permission",
    "path outside the workspace", "invalid arguments",
]  # fmt: skip
"""Refused before any stage that waits on the event loop: admission is all of their call."""


@pytest.mark.parametrize("case", [REFUSALS[name] for name in ADMISSION_REFUSALS], ids=ADMISSION_REFUSALS)
def test_a_call_refused_at_admission_takes_one_database_hop(
    in_process: Callable[..., InProcess], case: Refusal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its checks and its refusal's trail share one hop to a database thread (decisions 63, 100): the real
    # hop, counted on the way.
    gateway = in_process(case.overrides, case.host)
    hops: list[str] = []
    real = in_db_thread

    async def counted(work: Callable[..., Any], *args: Any) -> Any:
        hops.append(getattr(work, "__name__", repr(work)))
        return await real(work, *args)

    monkeypatch.setattr(pipeline_module, "in_db_thread", counted)
    error = gateway.refused(case.tool, case.arguments, _token(gateway, case.token))

    assert (error.code, error.reason) == (case.code, case.reason)
    assert hops == ["_admitted"]
    assert tuple(e.event_type for e in gateway.events()) == case.events


def test_an_input_required_round_releases_its_reservation(in_process: Callable[..., InProcess]) -> None:
    gateway = in_process()

    with pytest.raises(InputRequired) as caught:
        gateway.call("run_pytest", ALL_PASS, gateway.token(), RoundTrip())

    assert caught.value.state
    assert gateway.usage() == Usage(0, 0)
    events = gateway.events()
    assert [(e.event_type, e.code) for e in events] == [("MCP_TOOL_CALL", None), ("POLICY_BLOCKED", None)]
    assert events[-1].detail == {"status": "input_required"}
    assert events[-1].user == "alice"


def test_an_audit_failure_runs_nothing(in_process: Callable[..., InProcess]) -> None:
    gateway = in_process()
    with gateway.services.engine.begin() as connection:
        connection.execute(
            text("CREATE TRIGGER fault BEFORE INSERT ON audit_events BEGIN SELECT RAISE(ABORT, 'refused'); END")
        )

    error = gateway.refused("run_pytest", ALL_PASS, gateway.token())

    assert (error.code, error.reason) == (-32603, "audit_unavailable")
    assert gateway.events() == []
    assert gateway.usage() == Usage(0, 0)  # no reservation: the entry event comes first
    with gateway.services.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0


def test_a_read_tool_leaves_its_call_and_its_end(in_process: Callable[..., InProcess]) -> None:
    gateway = in_process()

    run_id, outcome = gateway.call("list_artifacts", {}, gateway.token())

    assert not outcome.is_error
    events = gateway.events()
    assert [(e.event_type, e.code) for e in events] == [("MCP_TOOL_CALL", None), ("TOOL_FINISHED", None)]
    assert {e.run_id for e in events} == {run_id}
    assert all(e.user == "alice" and e.tool_name == "list_artifacts" for e in events)
    assert events[-1].detail == {"status": "ok"}
    assert gateway.usage() == Usage(0, 0)  # reads are not charged


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (Answer(Decision.ALLOW_ONCE, Origin.USER_PROMPT, Channel.ELICITATION), "elicitation:alice"),
        (Answer(Decision.ALLOW_ONCE, Origin.USER_PROMPT, Channel.APPROVER, "approvals:bob"), "approver:approvals:bob"),
        (Answer(Decision.DENY_ONCE, Origin.TIMEOUT, Channel.APPROVER), "approver:timeout"),
        (Answer(Decision.DENY_ONCE, Origin.POLICY, Channel.POLICY), "policy:policy"),
        (
            Answer(Decision.DENY_ONCE, Origin.NO_ANSWER, Channel.ELICITATION, no_answer="client_gone"),
            "elicitation:no_answer",
        ),
    ],
)
def test_who_decided_a_change_review(answer: Answer, said: str) -> None:
    assert who_decided(answer, "alice") == said


@pytest.mark.parametrize(
    ("slug", "reason"),
    [
        ("workspace_view_unavailable", "workspace_view_unavailable"),
        ("workspace_too_large_for_view", "workspace_too_large_for_view"),
        ("workspace_copy_failed", "workspace_copy_failed"),
        ("cgroup_failed", "sandbox_start_failed"),
        ("seccomp_filter_failed", "sandbox_start_failed"),
    ],
)
def test_a_writing_runs_copy_that_cannot_be_made_is_its_own_reason(slug: str, reason: str) -> None:
    refused = start_refusal("r1", SandboxStartError(slug))
    assert (refused.code, refused.reason) == (-32006, reason)
    assert "fix" in refused.public_message()


def test_a_runs_record_is_committed_with_its_tool_started_or_not_at_all(in_process: Callable[..., InProcess]) -> None:
    """Decision 93: the run's record goes in TOOL_STARTED's transaction. TOOL_STARTED refused by the database:
    no `running` record is left for a sweep to close, nothing ran, and the reservation is settled to nothing."""
    gateway = in_process()
    spec = gateway.services.tools["run_pytest"]
    grant = Grant(
        id=0, user="alice", workspace="default", server_id=gateway.services.server_id, tool_name="run_pytest",
        args_hash=None, decision=GrantDecision.ALLOW, fingerprint=consent_profile(spec)[2],
        granted_at=gateway.clock.now(), expires_at=None, granted_by="approvals:ada", channel=Channel.APPROVER,
    )  # fmt: skip
    gateway.services.consent_store.insert_grant(grant)
    with gateway.services.engine.begin() as connection:
        connection.execute(
            text(
                "CREATE TRIGGER lose_started BEFORE INSERT ON audit_events "
                "WHEN NEW.event_type = 'TOOL_STARTED' BEGIN SELECT RAISE(ABORT, 'disk failure'); END"
            )
        )

    error = gateway.refused("run_pytest", ALL_PASS, gateway.token())

    assert (error.code, error.reason) == (-32603, "audit_unavailable")
    events = gateway.events()
    assert [e.event_type for e in events] == ["MCP_TOOL_CALL", "mcp.permission.decision"]
    assert events[1].detail["decision"] == "ALLOW_ALWAYS"
    with gateway.services.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0
    assert not gateway.services.runs.folder(error.data["run_id"]).exists()  # nothing ran
    assert gateway.usage() == Usage(1, 0)  # the attempt counts; no time was spent
