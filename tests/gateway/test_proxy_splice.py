"""gateway/proxy/splice.py: bodies relayed by the kernel over real socket pairs, every bound kept (decision 97)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gateway.proxy.splice import Budget, Direction, Ended, Relay, can_splice

pytestmark = pytest.mark.skipif(not can_splice(), reason="needs os.splice (Linux)")
WAIT_S = 30


@contextmanager
def pairs() -> Iterator[tuple[socket.socket, socket.socket, socket.socket, socket.socket]]:
    """(sender, source) and (sink, receiver): the relay moves source -> sink; the ends the relay uses are
    non-blocking, as an asyncio transport leaves them."""
    sender, source = socket.socketpair()
    sink, receiver = socket.socketpair()
    for sock in (source, sink):
        sock.setblocking(False)
    with sender, source, sink, receiver:
        yield sender, source, sink, receiver


def received(sock: socket.socket) -> bytes:
    sock.settimeout(WAIT_S)
    out = b""
    while data := sock.recv(1 << 20):
        out += data
    return out


def received_at_least(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(WAIT_S)
    got = b""
    while len(got) < n:
        got += sock.recv(1 << 20)
    return got


def send(sock: socket.socket, data: bytes, *, then_end: bool = False) -> threading.Thread:
    """`data` sent from a thread (more than a socket pair's buffer holds), then the sender's end if asked."""

    def work() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(data)
            if then_end:
                sock.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def run_in_thread(relay: Relay) -> tuple[threading.Thread, list[Ended]]:
    ended: list[Ended] = []
    thread = threading.Thread(target=lambda: ended.append(relay.run()))
    thread.start()
    return thread, ended


def test_a_length_moves_that_many_bytes_and_not_one_past_them() -> None:
    with pairs() as (sender, source, sink, receiver):
        sending = send(sender, b"a" * 300_000 + b"NEXT REQUEST")
        relay = Relay(Budget(1 << 20), WAIT_S, Direction(source, sink, up=False, length=300_000))
        thread, ended = run_in_thread(relay)
        got = received_at_least(receiver, 300_000)
        thread.join(WAIT_S)
        sending.join(WAIT_S)
        relay.close()
        assert ended == [Ended.DONE] and got == b"a" * 300_000
        assert source.recv(100) == b"NEXT REQUEST"  # never read by the relay
        assert relay.main.moved == 300_000


def test_until_close_passes_the_senders_end_on() -> None:
    with pairs() as (sender, source, sink, receiver):
        sending = send(sender, b"b" * 2_000_000, then_end=True)
        relay = Relay(Budget(1 << 30), WAIT_S, Direction(source, sink, up=True, length=None))
        thread, ended = run_in_thread(relay)
        assert received(receiver) == b"b" * 2_000_000  # ends: the sink's sending side was shut
        thread.join(WAIT_S)
        sending.join(WAIT_S)
        relay.close()
        assert ended == [Ended.DONE]


def test_the_budget_stops_a_direction_at_exactly_the_bytes_left() -> None:
    budget = Budget(1_000_000)
    assert budget.add(1000, up=False)
    with pairs() as (sender, source, sink, receiver):
        sending = send(sender, b"c" * 1_500_000)
        relay = Relay(budget, WAIT_S, Direction(source, sink, up=False, length=None))
        thread, ended = run_in_thread(relay)
        got = received_at_least(receiver, 999_000)
        thread.join(WAIT_S)
        relay.close()
        assert ended == [Ended.BYTE_CAP]
        assert relay.main.moved == 999_000 and budget.down == 1_000_000
        source.close()  # the sender's rest is never read
        sending.join(WAIT_S)
        receiver.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            got += receiver.recv(1 << 20)
        assert len(got) == 999_000


def test_a_budget_shared_by_threads_never_passes_its_cap() -> None:
    budget = Budget(1_000_000)
    takers = [threading.Thread(target=lambda: [budget.take(977, up=True) for _ in range(2000)]) for _ in range(8)]
    for t in takers:
        t.start()
    for t in takers:
        t.join()
    assert budget.up == 1_000_000
    budget.give_back(1000, up=True)
    assert budget.take(5000, up=True) == 1000 and not budget.add(1, up=True)


def test_wake_ends_a_relay_waiting_in_poll_at_once_and_idle_ends_a_silent_one() -> None:
    with pairs() as (_, source, sink, _receiver):
        relay = Relay(Budget(1 << 20), WAIT_S * 10, Direction(source, sink, up=False, length=None))
        thread, ended = run_in_thread(relay)
        time.sleep(0.2)
        woken = time.monotonic()
        relay.wake()
        thread.join(WAIT_S)
        assert ended == [Ended.WOKEN] and time.monotonic() - woken < 5
        relay.close()
        idle = Relay(Budget(1 << 20), 0.3, Direction(source, sink, up=False, length=None))
        assert idle.run() is Ended.IDLE
        idle.close()


def test_a_side_that_ends_leaves_main_going_and_a_peer_that_resets_ends_the_relay() -> None:
    with pairs() as (sender, source, sink, receiver):
        side = Direction(sink, source, up=True, length=None)  # receiver -> sender, beside main
        relay = Relay(Budget(1 << 20), WAIT_S, Direction(source, sink, up=False, length=None), side)
        thread, ended = run_in_thread(relay)
        receiver.shutdown(socket.SHUT_WR)  # the side's end: passed on to the sender, main still going
        sender.settimeout(WAIT_S)
        assert sender.recv(10) == b""
        sender.sendall(b"still here")
        receiver.settimeout(WAIT_S)
        assert receiver.recv(100) == b"still here"
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        receiver.close()  # reset
        sending = send(sender, b"x" * 100_000)
        thread.join(WAIT_S)
        relay.close()
        sender.close()
        sending.join(WAIT_S)
        assert ended == [Ended.GONE]
