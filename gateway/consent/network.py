"""A host that an `ask` rule names, put to a person while the run waits (docs/consent.md, "Hosts a run asks for"; decision 90).

The egress proxy (gateway/proxy/) calls a run's `HostQuestions` for each connection to such a host; the
connection waits for the answer. The question goes through the consent stage like a call's: a stored
decision for (user, workspace, `network:<host>`, the host and port) answers at once, then this session's
allow, then a person on the call's channel (the client's dialog, or the approver and the console). Allow
always is kept for `consent.expiry_days.high` (a host is the open world); deny once or no answer is a 403.
Within one run a host and port is asked about once: later connections get the same answer. An upstream
server's proxy asks through `CallsInFlight`: the person of the call in flight, if exactly one is (decision 97).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio

from gateway.canonical import args_hash, canonical_json
from gateway.consent.stage import ConsentChannel, ConsentRequest, ConsentStage, RoundTrip
from gateway.errors import ConsentDeniedError
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.proxy import Asker, NobodyToAsk

HOST_TOOL_PREFIX = "network:"
_STORED_NAME_MAX = 128


def host_tool_name(host: str) -> str:
    """What a grant for `host` is stored under: `network:<host>`, or its sha256 when that would not fit."""
    name = HOST_TOOL_PREFIX + host
    if len(name) <= _STORED_NAME_MAX:
        return name
    return HOST_TOOL_PREFIX + "sha256:" + hashlib.sha256(host.encode()).hexdigest()


def host_fingerprint(host: str) -> str:
    """A grant for a host holds for that host alone, whatever tool's run asked."""
    return hashlib.sha256(canonical_json({"network_host": host}).encode()).hexdigest()


@dataclass(slots=True)
class HostQuestions:
    """One run's questions about hosts: the proxy's `ask` (host, port, rule) -> allowed."""

    stage: ConsentStage
    channel: ConsentChannel
    run_id: str
    user: str
    workspace: str
    server_id: str
    tool_name: str
    key: str
    """The policy key whose rule asks (`sandbox.network`)."""
    new_id: Callable[[], str]
    progress: CallProgress = NO_PROGRESS
    _answers: dict[tuple[str, int], bool] = field(default_factory=dict)
    _locks: dict[tuple[str, int], anyio.Lock] = field(default_factory=dict)

    async def __call__(self, host: str, port: int, rule: str) -> bool:
        where = (host, port)
        lock = self._locks.setdefault(where, anyio.Lock())
        async with lock:  # connections to one host wait for one answer
            if where not in self._answers:
                self._answers[where] = await self._ask(host, port, rule)
            return self._answers[where]

    async def _ask(self, host: str, port: int, rule: str) -> bool:
        if isinstance(self.channel, RoundTrip):
            return False  # the call cannot be answered by a retry while its run waits: refused, as no answer
        arguments = {"host": host, "port": port}
        request = ConsentRequest(
            run_id=self.run_id,
            user=self.user,
            workspace=self.workspace,
            server_id=self.server_id,
            tool_name=host_tool_name(host),
            args_hash=args_hash(arguments),
            arguments=arguments,
            risk="high",
            fingerprint=host_fingerprint(host),
            preview=(
                f"{self.tool_name} (run {self.run_id}) wants to connect to {host}:{port}\n"
                f"the rule '{rule}' in {self.key} asks a person"
            ),
            question_id=self.new_id(),
        )
        try:
            await self.stage.require(request, self.channel, self.progress)
        except ConsentDeniedError:
            return False
        return True


@dataclass(slots=True)
class _InFlight:
    ask: Asker
    ended: anyio.Event = field(default_factory=anyio.Event)


@dataclass(slots=True)
class CallsInFlight:
    """An upstream server's proxy's `ask` (decision 97): its server outlives every call, so a host an `ask` rule
    names is put to the person of the one call in flight, through that call's `HostQuestions` (its channel, its
    grants per user, workspace and host), while that call lasts. Outside any call (the server's own background
    traffic), or with several calls in flight (the connection cannot be told apart), nobody is asked: refused."""

    _calls: list[_InFlight] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def during(self, ask: Asker | None) -> AsyncIterator[None]:
        """The call's asker in flight while the block runs; a question still open when it ends is refused."""
        if ask is None:
            yield
            return
        call = _InFlight(ask)
        self._calls.append(call)
        try:
            yield
        finally:
            self._calls.remove(call)
            call.ended.set()

    async def __call__(self, host: str, port: int, rule: str) -> bool:
        if not self._calls:
            raise NobodyToAsk("no call is in flight (the server's own traffic): no person to ask")
        if len(self._calls) > 1:
            raise NobodyToAsk(
                "several calls are in flight, and the connection cannot be told to be one's: no person to ask"
            )
        call = self._calls[0]
        answers: list[bool] = []
        async with anyio.create_task_group() as group:

            async def put() -> None:
                answers.append(await call.ask(host, port, rule))
                group.cancel_scope.cancel()

            async def until_the_call_ends() -> None:
                await call.ended.wait()
                group.cancel_scope.cancel()

            group.start_soon(put)
            group.start_soon(until_the_call_ends)
        if not answers:
            raise NobodyToAsk("the call whose person was asked ended before an answer")
        return answers[0]
