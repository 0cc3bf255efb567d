"""When a run or a question may be closed by someone other than its gateway (gateway/recovery.py, gateway/liveness.py)."""

from __future__ import annotations

import os

import pytest

from gateway.consent.store import PendingRequest
from gateway.liveness import ProcessIdentity, SessionRecord, StartTimeProbe, is_gone, start_time_of, this_process
from gateway.recovery import END_NOT_RECORDED, GATEWAY_LOST, Pace, is_orphaned, pace_from, run_end_reason
from gateway.runs import RunRecord

HERE = ProcessIdentity("host-a", "boot-1", "ns-1", 100, "5000")
PACE = Pace(10.0)  # lease 30 s, finish grace 40 s
NOW = 1000.0


def session(
    *, alive_until: float = NOW + 5, closed_at: float | None = None, identity: ProcessIdentity | None = None
) -> SessionRecord:
    return SessionRecord(
        "s1", identity or ProcessIdentity("host-b", "boot-2", "ns-2", 7, "42"), 0.0, alive_until, closed_at
    )


def pids(running: dict[int, str]) -> StartTimeProbe:
    return running.get


def run(deadline: float | None, session_id: str | None = "s1") -> RunRecord:
    return RunRecord("r1", "alice", "default", "run_pytest", 0.0, "running", None, deadline, session_id)


@pytest.mark.parametrize(
    ("deadline", "session_id", "owner", "expected"),
    [
        (NOW + 1, "s1", None, None),  # before its deadline a process of the run may be alive
        (NOW - 1, None, None, GATEWAY_LOST),  # recorded before sessions: the deadline alone, as before
        (NOW - 1, "s1", session(closed_at=NOW - 50), GATEWAY_LOST),
        (NOW - 1, "s1", session(alive_until=NOW), GATEWAY_LOST),  # its lease ran out
        (NOW - 1, "s1", session(), None),  # its live gateway may still write the end
        (NOW - 40, "s1", session(), None),  # up to the finish grace
        (NOW - 40.5, "s1", session(), END_NOT_RECORDED),
        (NOW - 40.5, "s1", None, END_NOT_RECORDED),  # a session nobody knows: the grace, then closed
        (None, None, None, None),  # no deadline recorded: never
    ],
)
def test_when_a_run_may_be_closed(
    deadline: float | None, session_id: str | None, owner: SessionRecord | None, expected: str | None
) -> None:
    assert run_end_reason(run(deadline, session_id), owner, NOW, PACE, here=HERE, probe=pids({})) == expected


def test_on_the_same_machine_a_dead_pid_is_gone_at_once_and_elsewhere_only_the_lease_counts() -> None:
    mine = ProcessIdentity("host-a", "boot-1", "ns-1", 7, "42")
    assert not is_gone(session(identity=mine), NOW, HERE, pids({7: "42"}))
    assert is_gone(session(identity=mine), NOW, HERE, pids({})), "no such pid"
    assert is_gone(session(identity=mine), NOW, HERE, pids({7: "43"})), "the pid was reused"
    other_namespace = ProcessIdentity("host-a", "boot-1", "ns-9", 7, "42")
    assert not is_gone(session(identity=other_namespace), NOW, HERE, pids({})), "its pids are not ours to read"
    unknown = ProcessIdentity("host-a", "", "", 7, "")
    assert not is_gone(session(identity=unknown), NOW, HERE, pids({}))


def test_a_question_is_orphaned_when_its_gateway_is_gone_or_unknown_and_long_expired() -> None:
    asked = PendingRequest(
        "q1", 0.0, NOW - 10, "s1", "alice", "default", "mcp-write-gateway", "run_pytest", "a" * 64, "{}", "high", True
    )
    assert not is_orphaned(asked, session(), NOW, PACE, here=HERE, probe=pids({}))
    assert is_orphaned(asked, session(alive_until=NOW - 1), NOW, PACE, here=HERE, probe=pids({}))
    assert not is_orphaned(asked, None, NOW, PACE, here=HERE, probe=pids({})), "within the grace after its expiry"
    assert is_orphaned(asked, None, NOW + 31, PACE, here=HERE, probe=pids({}))


def test_this_process_can_be_told_alive() -> None:
    here = this_process()
    assert here.pid == os.getpid() and start_time_of(here.pid) == here.pid_started != ""
    assert not is_gone(SessionRecord("s", here, 0.0, NOW + 5, None), NOW, here)


@pytest.mark.parametrize(("text", "period"), [("", 30.0), ("0.5", 0.5), ("0", 30.0), ("nan", 30.0), ("x", 30.0)])
def test_the_sweep_period_comes_from_the_environment(text: str, period: float) -> None:
    assert pace_from({"MCP_GATEWAY_SWEEP_S": text}).period_s == period


def test_a_run_whose_gateway_is_known_dead_here_is_closed_before_its_deadline() -> None:
    # Its processes died with their gateway (the parent-death signals); the lease
    # alone, or another machine's pid, proves no death: those wait for the deadline as before.
    mine = ProcessIdentity("host-a", "boot-1", "ns-1", 7, "42")
    early = run(NOW + 100)
    assert run_end_reason(early, session(identity=mine), NOW, PACE, here=HERE, probe=pids({})) == GATEWAY_LOST
    assert run_end_reason(early, session(identity=mine), NOW, PACE, here=HERE, probe=pids({7: "43"})) == GATEWAY_LOST
    assert run_end_reason(early, session(identity=mine), NOW, PACE, here=HERE, probe=pids({7: "42"})) is None
    expired = session(identity=mine, alive_until=NOW - 1)
    assert run_end_reason(early, expired, NOW, PACE, here=HERE, probe=pids({7: "42"})) is None, "alive, lease out"
    elsewhere = session(alive_until=NOW - 1)
    assert run_end_reason(early, elsewhere, NOW, PACE, here=HERE, probe=pids({})) is None
    assert run_end_reason(run(None), session(identity=mine), NOW, PACE, here=HERE, probe=pids({})) is None
