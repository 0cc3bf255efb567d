"""Task groups whose failures come out as themselves (sandbox/task_groups.py), with real anyio tasks,
and each task group of the sandbox with a real child process."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from sandbox.capture import OutputCapture
from sandbox.errors import SandboxStartError
from sandbox.limits import Limits
from sandbox.runner import _spawn, _supervise
from sandbox.task_groups import task_group


class Refusal(Exception):
    """Stands for a GatewayError: the sandbox may not import the gateway."""


async def _fail_soon(exc: Exception) -> None:
    await anyio.sleep(0.01)
    raise exc


def test_the_bodys_exception_comes_out_as_itself_and_the_children_are_cancelled() -> None:
    cancelled: list[bool] = []

    async def child() -> None:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    async def main() -> None:
        async with task_group() as group:
            group.start_soon(child)
            await anyio.sleep(0.01)
            raise Refusal("no")

    with pytest.raises(Refusal, match="no") as raised:
        anyio.run(main)
    assert type(raised.value) is Refusal  # not an ExceptionGroup (anyio's own group would be)
    assert cancelled == [True]


def test_a_lone_childs_exception_comes_out_as_itself_and_ends_the_body() -> None:
    async def main() -> None:
        async with task_group() as group:
            group.start_soon(_fail_soon, SandboxStartError("spawn_failed"))
            await anyio.sleep(30)

    with pytest.raises(SandboxStartError) as raised:
        anyio.run(main)
    assert raised.value.reason == "spawn_failed"


def test_a_failure_inside_nested_groups_comes_out_as_itself() -> None:
    async def inner() -> None:
        async with task_group() as group:
            group.start_soon(_fail_soon, Refusal("deep"))
            await anyio.sleep(30)

    async def main() -> None:
        async with task_group() as group:
            group.start_soon(inner)
            await anyio.sleep(30)

    with pytest.raises(Refusal, match="deep"):
        anyio.run(main)


def test_the_bodys_exception_wins_over_a_childs() -> None:
    async def main() -> None:
        async with task_group() as group:
            group.start_soon(_fail_soon, ValueError("child"))
            raise Refusal("body")

    with pytest.raises(Refusal, match="body"):
        anyio.run(main)


def test_several_children_failing_together_stay_a_group() -> None:
    async def fail_now(exc: Exception) -> None:
        raise exc

    async def main() -> None:
        async with task_group() as group:
            group.start_soon(fail_now, ValueError("one"))
            group.start_soon(fail_now, KeyError("two"))
            await anyio.sleep(30)

    with pytest.raises(ExceptionGroup) as raised:
        anyio.run(main)
    assert {type(e) for e in raised.value.exceptions} == {ValueError, KeyError}


def test_cancellation_passes_through_as_anyios() -> None:
    async def main() -> str:
        with anyio.move_on_after(0.05):
            async with task_group() as group:
                group.start_soon(anyio.sleep, 30)
                await anyio.sleep(30)
        return "went on"

    assert anyio.run(main) == "went on"


def test_a_cause_and_a_traceback_are_kept() -> None:
    async def main() -> None:
        async with task_group() as group:
            group.start_soon(anyio.sleep, 30)
            try:
                raise OSError("disk")
            except OSError as exc:
                raise Refusal("translated") from exc

    with pytest.raises(Refusal) as raised:
        anyio.run(main)
    assert isinstance(raised.value.__cause__, OSError)
    assert raised.value.__traceback__ is not None


# --- every task group of the sandbox: a failure inside a run's supervision comes out as itself --


def _supervised(tmp_path: Path, on_stdout: Callable[[bytes], None] | None, leftovers: Callable[[], list[int]]) -> None:
    """A real child supervised as `run_unsafe_unconfined` does, with the given hooks. It prints and
    ends at once, leaving a grandchild that holds its pipes: the readers are still on when the
    body goes on (with no task left in a group, anyio passes the body's exception unwrapped)."""
    limits = Limits(timeout_s=20, memory_limit_mb=256, max_processes=16, max_output_bytes=1 << 16, env={})
    code = "import subprocess; subprocess.Popen(['sleep', '5']); print('x', flush=True)"

    async def main() -> None:
        with anyio.fail_after(30), OutputCapture(tmp_path / "out", tmp_path / "err", 1 << 16, on_stdout) as capture:
            started = time.monotonic()
            process = _spawn([sys.executable, "-c", code], tmp_path, limits, capture.child_fds, preexec=None)
            await _supervise(process, limits, capture, started=started, leftovers=leftovers)

    anyio.run(main)


def test_a_failing_output_reader_comes_out_of_the_run_as_itself(tmp_path: Path) -> None:
    """capture.pump_all's group inside _supervise's: two groups deep, still the reader's own exception."""

    def on_stdout(data: bytes) -> None:
        raise Refusal("the reader failed")

    with pytest.raises(Refusal, match="the reader failed"):
        _supervised(tmp_path, on_stdout, list)


def test_a_failing_output_reader_comes_out_of_the_pumps_as_itself(tmp_path: Path) -> None:
    def on_stdout(data: bytes) -> None:
        raise Refusal("the reader failed")

    async def main() -> None:
        with anyio.fail_after(30), OutputCapture(tmp_path / "out", tmp_path / "err", 1 << 16, on_stdout) as capture:
            os.write(capture.child_fds[0], b"x")
            await capture.pump_all()

    with pytest.raises(Refusal, match="the reader failed"):
        anyio.run(main)


def test_a_start_error_in_the_supervisions_body_comes_out_as_itself(tmp_path: Path) -> None:
    calls = [0]

    def leftovers() -> list[int]:  # fails once: the kill on the way out (which calls it again) goes on
        calls[0] += 1
        if calls[0] == 1:
            raise SandboxStartError("cgroup_failed")
        return []

    with pytest.raises(SandboxStartError) as raised:
        _supervised(tmp_path, None, leftovers)
    assert raised.value.reason == "cgroup_failed"
