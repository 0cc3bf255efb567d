"""A live run's connections written beside it (gateway/call_trail.py `flush_connections`; decision 98): at most one
write per period, none while nothing ends, each connection once, the card moved with them, on both engines."""

from __future__ import annotations

import time

import anyio
from sqlalchemy import Engine

from gateway.audit import AuditLog, EventDraft, EventType
from gateway.auth import Principal
from gateway.call_trail import CallTrail, Recorder, flush_connections
from gateway.calls import CallStore, CardStatus
from gateway.clock import SystemClock
from gateway.proxy import ConnectionLog, NetConnect, Outcome

PERIOD_S = 0.5


def record(host: str) -> NetConnect:
    return NetConnect(host, 443, "CONNECT", Outcome.ALLOWED, f"allow: {host}", None, "192.0.2.1", 10, 20, 5)


def net_hosts(audit: AuditLog, run_id: str) -> list[str]:
    return [e.detail["host"] for e in audit.events(run_id=run_id) if e.event_type == EventType.NET_CONNECT]


def test_ended_connections_are_written_at_most_once_a_period_with_the_cards_move(engine: Engine) -> None:
    audit = AuditLog(engine, SystemClock())
    entry = EventDraft(EventType.MCP_TOOL_CALL, run_id="run-1", tool_name="fetch", args_hash="0" * 64)
    trail = CallTrail(Recorder(audit, SystemClock(), "srv", None), entry, {"url": "https://a.test/"})
    trail.principal = Principal("alice", "USER", ("default",), None, "jti")
    trail.workspace = "default"
    trail.log(CardStatus.RUNNING)  # the entry and the card, as TOOL_STARTED leaves them
    trail.connections = log = ConnectionLog()
    store = CallStore(engine)
    seen: list[tuple[list[str], int]] = []

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(flush_connections, trail, PERIOD_S)
            await anyio.sleep(0.2)  # nothing ended: nothing written
            seen.append((net_hosts(audit, "run-1"), 0))
            log.add(record("a.test"))
            log.add(record("b.test"))
            with anyio.fail_after(10):
                while not net_hosts(audit, "run-1"):
                    await anyio.sleep(0.01)
            first = time.monotonic()
            log.add(record("c.test"))  # ended within the period: waits for its end
            await anyio.sleep(PERIOD_S / 4)
            seen.append((net_hosts(audit, "run-1"), 0))
            with anyio.fail_after(10):
                while len(net_hosts(audit, "run-1")) < 3:
                    await anyio.sleep(0.01)
            seen.append((net_hosts(audit, "run-1"), int((time.monotonic() - first) * 1000)))
            group.cancel_scope.cancel()

    anyio.run(main)
    assert seen[0][0] == [] and seen[1][0] == ["a.test", "b.test"]  # two ended together: one write
    assert seen[2][0] == ["a.test", "b.test", "c.test"] and seen[2][1] >= PERIOD_S * 1000 * 0.9
    assert log.drain() == ()  # each written once: nothing left for the run's end
    card = store.fetch("run-1")
    events = list(audit.events(run_id="run-1"))
    assert card is not None and card.status == CardStatus.RUNNING and card.last_event_id == events[-1].id
    assert [c["host"] for c in card.connections] == ["a.test", "b.test", "c.test"] and card.connections_total == 3
    assert audit.verify().ok


def test_a_card_shows_no_connection_newer_than_its_own_last_event(engine: Engine) -> None:
    """A card read between a NET_CONNECT's commit and the card's move (the console's stream reads the row, then the
    connections) shows only what its cursor covers: the newer connection waits for the card's next move."""
    audit = AuditLog(engine, SystemClock())
    entry = EventDraft(EventType.MCP_TOOL_CALL, run_id="run-2", tool_name="fetch", args_hash="0" * 64)
    trail = CallTrail(Recorder(audit, SystemClock(), "srv", None), entry, {"url": "https://a.test/"})
    trail.principal = Principal("alice", "USER", ("default",), None, "jti")
    trail.workspace = "default"
    trail.log(CardStatus.RUNNING)
    trail.log(CardStatus.RUNNING, *trail.net_connects((record("a.test"),)))  # written with the card's move
    audit.append(*trail.net_connects((record("b.test"),)))  # committed, the card not moved yet
    card = CallStore(engine).fetch("run-2")
    assert card is not None
    assert [c["host"] for c in card.connections] == ["a.test"] and card.connections_total == 1
    trail.log(CardStatus.RUNNING, *trail.net_connects((record("c.test"),)))  # the card's next move brings it
    moved = CallStore(engine).fetch("run-2")
    assert moved is not None and [c["host"] for c in moved.connections] == ["a.test", "b.test", "c.test"]
