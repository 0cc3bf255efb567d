"""Progress notifications (gateway/progress.py) and the suite's count read from pytest's lines
(gateway/tools/suite_progress.py): real pytest output, a real clock, real anyio tasks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from gateway.errors import ConsentDeniedError, Reason, StorageUnavailableError
from gateway.progress import Notifier, progress_token
from gateway.tools.suite_progress import COUNT_STYLE, SuiteProgress
from sandbox.errors import SandboxStartError


def fed(*chunks: bytes) -> tuple[SuiteProgress, list[int]]:
    seen: list[int] = []
    suite = SuiteProgress(lambda: seen.append(suite.done))
    for chunk in chunks:
        suite.feed(chunk)
    return suite, seen


def test_the_count_follows_the_letters_and_the_line_ends() -> None:
    suite, seen = fed(b".", b"..F", b"s", b"    [ 5/12]\n", b"..", b"xE.....   [12/12]\n", b"=== 1 failed ===\n")
    assert (suite.done, suite.total) == (12, 12)
    assert seen == [1, 4, 5, 7, 12]  # a nudge for each chunk that moved the count (the line end did not)
    assert suite.describe() == "Running the tests in the sandbox: 12 of 12 done"


def test_before_the_first_line_end_the_total_is_unknown() -> None:
    suite, _ = fed(b"....")
    assert (suite.done, suite.total) == (4, None)
    assert suite.describe() == "Running the tests in the sandbox: 4 done"
    assert fed()[0].describe() == "Running the tests in the sandbox: starting"


def test_a_count_whose_newline_is_still_to_come_counts_already() -> None:
    suite, _ = fed(b"...   [3/3]")
    assert (suite.done, suite.total) == (3, 3)


@pytest.mark.parametrize(
    "chunks",
    [
        (b"..   [2/4]\n", b"E   [9/9]\n"),  # a failure's text that looks like a count, another total
        (b"..   [2/4]\n", b"[7/4]\n"),  # more done than collected
        (b"..   [3/4]\n", b"[1/4]\n"),  # backwards
        (b"x" * 5000,),  # a line no terminal wraps at: the reading stops
    ],
    ids=["other-total", "over-total", "backwards", "endless-line"],
)
def test_what_the_run_prints_cannot_push_the_count_past_the_truth(chunks: tuple[bytes, ...]) -> None:
    suite, _ = fed(*chunks)
    assert suite.total in (None, 4)
    assert suite.done <= (suite.total or 0)


def test_the_count_of_a_real_pytest_run(tmp_path: Path) -> None:
    (tmp_path / "test_many.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(150))\ndef test_n(i):\n    assert i != 7\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *COUNT_STYLE, str(tmp_path)],
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    suite, seen = fed(*(done.stdout[i : i + 7] for i in range(0, len(done.stdout), 7)))
    assert (suite.done, suite.total) == (150, 150), done.stdout
    assert seen == sorted(set(seen)) and len(seen) > 10


def test_the_token_is_a_string_or_an_integer() -> None:
    assert progress_token({"_meta": {"progressToken": "p-1"}}) == "p-1"
    assert progress_token({"_meta": {"progressToken": 7}}) == 7
    for params in (None, {}, {"_meta": None}, {"_meta": {"progressToken": True}}, {"_meta": {"progressToken": 1.5}}):
        assert progress_token(params) is None


def test_notifications_grow_come_at_once_on_a_move_and_stop_with_the_phase() -> None:
    sent: list[tuple[float, str]] = []
    count = [0]

    async def send(progress: float, message: str) -> None:
        sent.append((progress, message))

    async def main() -> None:
        notifier = Notifier(send, heartbeat_s=0.2, min_gap_s=0.05)
        async with notifier.waiting(lambda: f"at {count[0]}"):
            await anyio.sleep(0.5)  # heartbeats only
            count[0] = 1
            notifier.moved()
            await anyio.sleep(0.1)
        await anyio.sleep(0.3)  # after the phase: nothing more

    anyio.run(main)
    progress = [p for p, _ in sent]
    assert progress == sorted(set(progress)), "progress must grow with every notification"
    messages = [m for _, m in sent]
    assert messages[0] == "at 0" and messages[-1] == "at 1"
    assert 3 <= messages.count("at 0") <= 5  # at once, then every 0.2 s for 0.5 s
    assert progress[-1] < 0.75  # the moved one was sent within min_gap, and none after the phase


def test_a_client_gone_ends_the_notifications_not_the_call() -> None:
    attempts = []

    async def send(progress: float, message: str) -> None:
        attempts.append(progress)
        raise anyio.BrokenResourceError

    async def main() -> str:
        async with Notifier(send, heartbeat_s=0.05, min_gap_s=0.0).waiting(lambda: "x"):
            await anyio.sleep(0.3)
        return "the call went on"

    assert anyio.run(main) == "the call went on"
    assert len(attempts) == 1


@pytest.mark.parametrize(
    "refusal",
    [
        ConsentDeniedError(Reason.CONSENT_DENIED, "a person denied this call"),
        ConsentDeniedError(Reason.CONSENT_TIMEOUT, "no person answered"),
        StorageUnavailableError(Reason.DATABASE_UNAVAILABLE, "the database failed"),
        SandboxStartError("spawn_failed"),
    ],
    ids=lambda e: getattr(e, "reason", type(e).__name__),
)
def test_what_ends_a_wait_leaves_it_as_itself(refusal: Exception) -> None:
    """A person's "no" (or a run that could not start) during a wait with progress on: the refusal
    itself comes out, never an ExceptionGroup that the server would answer as -32603."""
    sent: list[str] = []

    async def send(progress: float, message: str) -> None:
        sent.append(message)

    async def main() -> None:
        with anyio.fail_after(10):
            async with Notifier(send, heartbeat_s=0.05, min_gap_s=0.0).waiting(lambda: "waiting"):
                await anyio.sleep(0.1)  # the notifier is beating when the refusal comes
                raise refusal

    with pytest.raises(type(refusal)) as raised:
        anyio.run(main)
    assert raised.value is refusal
    assert sent and sent[0] == "waiting"


def test_a_describer_that_fails_ends_the_notifications_not_the_call(caplog: pytest.LogCaptureFixture) -> None:
    calls = [0]

    async def send(progress: float, message: str) -> None:
        calls[0] += 1

    def describe() -> str:
        raise ValueError("a bug in the describer")

    async def main() -> str:
        with anyio.fail_after(10):
            async with Notifier(send, heartbeat_s=0.02, min_gap_s=0.0).waiting(describe):
                await anyio.sleep(0.2)
        return "the call went on"

    assert anyio.run(main) == "the call went on"
    assert calls[0] == 0
    stopped = [r for r in caplog.records if "progress notifications stopped" in r.getMessage()]
    assert len(stopped) == 1, "logged once, not on every beat"


def test_a_send_that_fails_in_any_way_ends_the_notifications_not_the_call() -> None:
    attempts = []

    async def send(progress: float, message: str) -> None:
        attempts.append(progress)
        raise RuntimeError("the session's stream broke in a way nobody foresaw")

    async def main() -> str:
        with anyio.fail_after(10):
            async with Notifier(send, heartbeat_s=0.02, min_gap_s=0.0).waiting(lambda: "x"):
                await anyio.sleep(0.2)
        return "the call went on"

    assert anyio.run(main) == "the call went on"
    assert len(attempts) == 1
