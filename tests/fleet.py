"""Many `mcp-gateway serve` processes on one database, driven as real stdio clients (decision 62).

`Fleet` starts N gateways on one state folder, policy and database (as a team's agent hosts
share them), fires a batch of `tools/call`s at all of them at once (one thread per gateway,
released together by a barrier) and gathers the answers. `Answer` is what one call got back;
`assert_trail` checks that the call left its events in the shared audit log, in the order the
pipeline writes them (gateway/pipeline.py).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.audit import AuditLog
from gateway.clock import SystemClock
from tests.harness import GatewayHome, StdioSession

START_S = 180.0
"""How long each gateway of a fleet may take to answer `initialize` (TEST_TIME_SCALE times it): 16 start
side by side, about 30 s on 2 quiet cores, 105-136 s seen on a host at load 20-25."""
CALL = "MCP_TOOL_CALL"
DECISION = "mcp.permission.decision"
BLOCKED = "POLICY_BLOCKED"
STARTED = "TOOL_STARTED"
EXEC = "SANDBOX_EXEC"
FINISHED = "TOOL_FINISHED"

RAN = (CALL, DECISION, STARTED, EXEC, FINISHED)
"""A write call that was allowed and ran in the sandbox."""
READ = (CALL, FINISHED)
"""A read tool that answered."""
REFUSED = (CALL, BLOCKED)
"""Refused at stages 2-7 (before consent): nothing was asked, nothing ran."""
DENIED = (CALL, DECISION, BLOCKED)
"""Refused at consent: one decision, nothing ran."""


@dataclass(frozen=True, slots=True)
class Call:
    """One `tools/call` for the gateway at index `gateway` of the fleet."""

    gateway: int
    tool: str
    arguments: Mapping[str, Any]
    token: str | None
    kind: str = ""
    """What the test sends it for (a label it sorts answers by)."""


@dataclass(frozen=True, slots=True)
class Sent:
    call: Call
    session: StdioSession
    request_id: int


@dataclass(frozen=True, slots=True)
class Answer:
    """A JSON-RPC response to a sent call: a result or an error, each carrying the call's run_id."""

    sent: Sent
    response: Mapping[str, Any]

    @property
    def call(self) -> Call:
        return self.sent.call

    @property
    def code(self) -> int | None:
        """The error code, None for a result."""
        error = self.response.get("error")
        return None if error is None else int(error["code"])

    @property
    def reason(self) -> str | None:
        error = self.response.get("error")
        return None if error is None else str(error["data"]["reason"])

    @property
    def data(self) -> Mapping[str, Any]:
        error = self.response.get("error")
        return {} if error is None else dict(error["data"])

    @property
    def run_id(self) -> str:
        if "error" in self.response:
            return str(self.response["error"]["data"]["run_id"])
        return str(self.response["result"]["_meta"]["mcp-write-gateway/run_id"])


@dataclass(slots=True)
class Fleet:
    """`size` serve processes on `home`'s state folder, policy and database; none declares elicitation,
    so a consent question waits in the database for `mcp-gateway approvals` (docs/consent.md)."""

    home: GatewayHome
    size: int
    sessions: list[StdioSession] = field(default_factory=list)

    def start(self) -> None:
        """Start the gateways; each answers `initialize` within START_S (TEST_TIME_SCALE times it) of the
        last one's start. Those started are in `sessions` at once, so `close` ends them when one fails."""
        # Every process is started before the first is waited on: they import the MCP SDK (most of a
        # gateway's start-up) side by side, 16 on 2 cores: the first may answer only after all started.
        for _ in range(self.size):
            self.sessions.append(StdioSession(self.home))
        for session in self.sessions:
            response = session.initialize(timeout=START_S)
            if "result" not in response:
                raise AssertionError(f"a gateway did not start: {response}\n{session.stderr_text()}")

    def close(self) -> None:
        """End every gateway: all stdins closed first, so they stop side by side."""
        for session in self.sessions:
            if session.process.stdin is not None and not session.process.stdin.closed:
                with contextlib.suppress(BrokenPipeError):  # a gateway the test killed
                    session.process.stdin.close()
        for session in self.sessions:
            session.close()


def fire(sessions: Sequence[StdioSession], calls: Iterable[Call]) -> list[Sent]:
    """Send `calls`, each to its gateway, all at once: one thread per gateway, released by one barrier,
    sends its calls back to back without waiting for any answer."""
    by_gateway: dict[int, list[Call]] = defaultdict(list)
    for call in calls:
        by_gateway[call.gateway].append(call)
    sent: list[Sent] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(by_gateway))
    failures: list[BaseException] = []

    def send(index: int, batch: list[Call]) -> None:
        session = sessions[index]
        try:
            barrier.wait(timeout=30)
            for call in batch:
                request_id = session.send_call(call.tool, call.arguments, call.token)
                with lock:
                    sent.append(Sent(call, session, request_id))
        except Exception as exc:  # reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=send, args=item) for item in by_gateway.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if failures:
        raise AssertionError(f"sending failed: {failures!r}")
    return sent


def gather(
    sent: Sequence[Sent],
    timeout_s: float = 90,
    enough: Callable[[list[Answer]], bool] | None = None,
) -> list[Answer]:
    """The answers to `sent`: all of them, or (with `enough`) as soon as those in hand satisfy it.
    Raises AssertionError naming the calls still unanswered at `timeout_s`."""
    answers: dict[int, Answer] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        arrived = False
        for index, item in enumerate(sent):
            if index in answers:
                continue
            try:  # what this gateway has said so far; never waits on one while others have answered
                response = item.session.wait_response(item.request_id, timeout=0.001)
            except queue.Empty:
                continue
            answers[index] = Answer(item, response)
            arrived = True
        done = [answers[i] for i in sorted(answers)]
        if len(done) == len(sent) or (enough is not None and enough(done)):
            return done
        if time.monotonic() > deadline:
            missing = [item.call for i, item in enumerate(sent) if i not in answers]
            raise AssertionError(f"{len(missing)} calls unanswered after {timeout_s} s: {missing[:5]}")
        if not arrived:
            time.sleep(0.01)


def unanswered(sent: Sequence[Sent], answers: Iterable[Answer]) -> list[Sent]:
    """The calls of `sent` that `answers` does not answer (to gather them later)."""
    done = {id(a.sent) for a in answers}
    return [s for s in sent if id(s) not in done]


def answered_before_death(session: StdioSession, sent: Sequence[Sent], timeout_s: float = 30) -> list[Answer]:
    """What a killed gateway answered before it died: every response on its stdout up to its end."""
    responses: dict[Any, Mapping[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            message = session.read_message(timeout=max(0.1, deadline - time.monotonic()))
        except EOFError:
            break
        if "method" not in message:
            responses[message.get("id")] = message
    return [Answer(s, responses[s.request_id]) for s in sent if s.request_id in responses]


def events_by_run(home: GatewayHome) -> dict[str | None, list[dict[str, Any]]]:
    """The whole audit log, as `audit export` prints it, grouped by run_id in log order (one read)."""
    grouped: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for event in AuditLog(home.engine, SystemClock()).events():
        record = event.to_json()
        grouped[record["run_id"]].append(record)
    return grouped


def assert_trail(events: Mapping[str | None, list[dict[str, Any]]], answer: Answer, kinds: Sequence[str]) -> None:
    """The call's events are in the log: exactly `kinds` in order, MCP_TOOL_CALL first, and a terminal event
    that says what the answer says (its code; the refusal's reason; `ok` for a result)."""
    trail = events.get(answer.run_id, [])
    assert [e["event_type"] for e in trail] == list(kinds), (answer.call, answer.response, trail)
    entry, terminal = trail[0], trail[-1]
    assert entry["tool_name"] == answer.call.tool, (entry, answer.call)
    assert terminal["code"] == answer.code, (terminal, answer.response)
    if answer.code is None:
        assert terminal["event_type"] == FINISHED and terminal["detail"]["status"] == "ok", terminal
    elif terminal["event_type"] == BLOCKED:
        assert terminal["detail"]["blocked_reason"] == answer.reason, (terminal, answer.response)
    else:
        assert terminal["detail"]["reason"] == answer.reason, (terminal, answer.response)


def decisions_of(events: Mapping[str | None, list[dict[str, Any]]], run_id: str) -> list[dict[str, Any]]:
    """The `mcp.permission.decision` events of one call (one per question, if each is decided once)."""
    return [e for e in events.get(run_id, []) if e["event_type"] == DECISION]
