"""gateway/consent/network.py `CallsInFlight`: an upstream server's proxy asks the person of the one call in flight
(decision 97), and nobody otherwise."""

from __future__ import annotations

import anyio
import pytest

from gateway.consent.network import CallsInFlight
from gateway.proxy import NobodyToAsk


def test_outside_any_call_nobody_is_asked() -> None:
    async def main() -> None:
        with pytest.raises(NobodyToAsk, match="no call is in flight"):
            await CallsInFlight()("a.test", 443, "ask: *")

    anyio.run(main)


def test_the_one_call_in_flight_answers_and_only_while_it_lasts() -> None:
    asked: list[tuple[str, int, str]] = []

    async def yes(host: str, port: int, rule: str) -> bool:
        asked.append((host, port, rule))
        return True

    async def main() -> None:
        calls = CallsInFlight()
        async with calls.during(yes):
            assert await calls("a.test", 443, "ask: *") is True
        with pytest.raises(NobodyToAsk):
            await calls("a.test", 443, "ask: *")
        async with calls.during(None):  # a call that cannot ask: as if none were in flight
            with pytest.raises(NobodyToAsk):
                await calls("a.test", 443, "ask: *")

    anyio.run(main)
    assert asked == [("a.test", 443, "ask: *")]


def test_several_calls_in_flight_ask_nobody() -> None:
    async def yes(host: str, port: int, rule: str) -> bool:
        return True

    async def main() -> None:
        calls = CallsInFlight()
        async with calls.during(yes), calls.during(yes):
            with pytest.raises(NobodyToAsk, match="several calls"):
                await calls("a.test", 443, "ask: *")

    anyio.run(main)


def test_a_question_still_open_when_its_call_ends_is_refused_not_left_waiting() -> None:
    waiting = anyio.Event()

    async def never(host: str, port: int, rule: str) -> bool:
        waiting.set()
        await anyio.sleep_forever()
        return True  # pragma: no cover

    async def main() -> None:
        calls = CallsInFlight()
        outcome: list[str] = []

        async def connection() -> None:
            try:
                await calls("a.test", 443, "ask: *")
            except NobodyToAsk as exc:
                outcome.append(exc.why)

        async with anyio.create_task_group() as group, calls.during(never):
            group.start_soon(connection)
            with anyio.fail_after(10):
                await waiting.wait()
        assert outcome == ["the call whose person was asked ended before an answer"]

    anyio.run(main)
