"""A live run's connections written beside it (gateway/call_trail.py `flush_connections`; decision 98): at most one
write per period, none while nothing ends, each connection once, the card moved with them, on both engines."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import anyio
from sqlalchemy import Engine, select

from gateway import db
from gateway.audit import AuditLog, EventDraft, EventType
from gateway.auth import Principal
from gateway.call_trail import CallTrail, Recorder, flush_connections, forget_open
from gateway.calls import (
    CallStore,
    Card,
    CardStatus,
    Opened,
    OpenRow,
    delete_stale_open_rows,
    replace_open_connections,
)
from gateway.clock import SystemClock
from gateway.proxy import ConnectionLog, NetConnect, Outcome

PERIOD_S = 0.5
OPEN_PERIOD_S = 0.2
"""The period of the open-connection test: each of its checks is that a row shows, is not rewritten while nothing
moves, or goes; a busy machine only delays a write, so none depends on how short the period is. The test of ended
connections keeps PERIOD_S: it checks that nothing is written within a quarter of a period of a write, a margin a
busy machine's delays eat into when the period is short."""


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
            group.start_soon(flush_connections, trail, engine, PERIOD_S)
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


@dataclass
class Held:
    """A connection the proxy holds open, as the log sees it (gateway/proxy/server.py `OpenConnection`)."""

    host: str | None
    port: int | None = 443
    method: str | None = "CONNECT"
    rule: str | None = "allow: example"
    address: str | None = "192.0.2.1"
    started: float = field(default_factory=time.monotonic)
    up: int = 0
    down: int = 0

    def so_far(self) -> tuple[int, int]:
        return self.up, self.down


def open_rows(engine: Engine) -> list[tuple[str, int, int]]:
    o = db.open_connections
    with engine.connect() as connection:
        return [
            tuple(row) for row in connection.execute(select(o.c.host, o.c.bytes_down, o.c.number).order_by(o.c.number))
        ]


def test_open_connections_show_once_open_a_period_updated_when_bytes_move_and_leave_with_their_event(
    engine: Engine,
) -> None:
    """Decision 102: a connection that ends within the period never gets a row; one held open gets one after the
    period, rewritten only when its bytes move (no audit event, no card move), and its row is deleted in the
    transaction of its NET_CONNECT; the run's end (`forget_open`) deletes what is left."""
    audit = AuditLog(engine, SystemClock())
    entry = EventDraft(EventType.MCP_TOOL_CALL, run_id="run-3", tool_name="fetch", args_hash="0" * 64)
    trail = CallTrail(Recorder(audit, SystemClock(), "srv", None), entry, {"url": "https://a.test/"})
    trail.principal = Principal("alice", "USER", ("default",), None, "jti")
    trail.workspace = "default"
    trail.log(CardStatus.RUNNING)
    trail.connections = log = ConnectionLog()
    store = CallStore(engine)
    seen: dict[str, object] = {}

    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(flush_connections, trail, engine, OPEN_PERIOD_S)
            short = log.opened(Held("short.test"))
            await anyio.sleep(OPEN_PERIOD_S / 5)
            log.add(dataclasses.replace(record("short.test"), number=short))  # ended within the period
            with anyio.fail_after(10):
                while not net_hosts(audit, "run-3"):
                    await anyio.sleep(0.01)
            seen["short"] = open_rows(engine)
            held = Held("held.test", down=100)
            log.opened(held)
            with anyio.fail_after(10):
                while not open_rows(engine):
                    await anyio.sleep(0.01)
            seen["held"] = open_rows(engine)
            written_at = _updated_at(engine)
            card = store.fetch("run-3")
            seen["card"] = card
            events_then = len(list(audit.events(run_id="run-3")))
            await anyio.sleep(OPEN_PERIOD_S * 2.5)  # nothing moved: nothing written
            seen["idle"] = (open_rows(engine), _updated_at(engine) == written_at)
            held.down = 5000
            with anyio.fail_after(10):
                while open_rows(engine)[0][1] != 5000:
                    await anyio.sleep(0.01)
            seen["moved"] = len(list(audit.events(run_id="run-3"))) - events_then  # no event for a row
            log.add(dataclasses.replace(record("held.test"), number=2, bytes_down=6000))
            with anyio.fail_after(10):
                while open_rows(engine):
                    await anyio.sleep(0.01)
            seen["ended"] = net_hosts(audit, "run-3")
            group.cancel_scope.cancel()

    anyio.run(main)
    assert seen["short"] == []
    assert seen["held"] == [("held.test", 100, 2)]
    card = seen["card"]
    assert isinstance(card, Card) and card.status == CardStatus.RUNNING
    assert [(c["host"], c["open"], c["bytes_down"]) for c in card.connections] == [
        ("short.test", False, 20), ("held.test", True, 100),
    ]  # fmt: skip
    assert seen["idle"] == ([("held.test", 100, 2)], True)  # the row not rewritten
    assert seen["moved"] == 0
    assert seen["ended"] == ["short.test", "held.test"]
    ended = store.fetch("run-3")
    assert ended is not None and [(c["host"], c["open"]) for c in ended.connections] == [
        ("short.test", False), ("held.test", False),
    ]  # fmt: skip
    forget = forget_open(trail)
    assert trail.open_shown and forget is not None
    with engine.begin() as connection:
        forget(connection)
    assert not trail.open_shown and forget_open(trail) is None
    assert audit.verify().ok


def _updated_at(engine: Engine) -> list[float]:
    o = db.open_connections
    with engine.connect() as connection:
        return [float(v) for v in connection.execute(select(o.c.updated_at)).scalars()]


def test_the_sweep_deletes_open_rows_of_cards_no_longer_running_and_keeps_the_running_ones(engine: Engine) -> None:
    """A call that failed before its run's end could delete its rows leaves them under a card that is not running:
    never shown (`CallStore`), and deleted by the sweep (`delete_stale_open_rows`); a running card's stay."""
    audit = AuditLog(engine, SystemClock())
    now = time.time()
    for run, status in (("live", CardStatus.RUNNING), ("failed", CardStatus.ERROR)):
        entry = EventDraft(EventType.MCP_TOOL_CALL, run_id=run, user="alice", workspace="default", tool_name="t")
        audit.append(entry, along=[Opened(run, "alice", "default", "srv", "t", {}, status, now)])
        row = OpenRow(1, f"{run}.test", 443, "CONNECT", "192.0.2.1", "allow: *", 1, 2, now)
        with engine.begin() as connection:
            replace_open_connections(connection, run, run, [row], now)
    failed = CallStore(engine).fetch("failed")
    assert failed is not None and failed.connections == ()  # not running: not shown as open
    assert delete_stale_open_rows(engine) == 1
    assert delete_stale_open_rows(engine) == 0
    assert [host for host, _, _ in open_rows(engine)] == ["live.test"]
