"""The process runner: time limit, output cap, whole-group kill on timeout and on cancellation."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Limits, RunResult, run_unsafe_unconfined
from sandbox.errors import SandboxStartError
from sandbox.runner import KilledBy
from tests.deadlines import scaled


def limits(**overrides: Any) -> Limits:
    base = Limits(
        timeout_s=20, memory_limit_mb=512, max_processes=16, max_output_bytes=1_000_000, env={"PATH": "/usr/bin:/bin"}
    )
    return dataclasses.replace(base, **overrides)


def run(tmp_path: Path, code: str, **overrides: Any) -> RunResult:
    return anyio.run(
        run_unsafe_unconfined,
        [sys.executable, "-c", code],
        tmp_path,
        limits(**overrides),
        tmp_path / "out.txt",
        tmp_path / "err.txt",
    )


def test_exit_code_output_and_exact_environment(tmp_path: Path) -> None:
    result = run(
        tmp_path, "import os, sys; print(' '.join(sorted(os.environ))); sys.exit(3)", env={"PATH": "/bin", "ONLY": "1"}
    )
    assert result.exit_code == 3
    assert result.killed_by is None
    names = set((tmp_path / "out.txt").read_text().split())
    # Python itself may add LC_CTYPE (PEP 538 locale coercion); nothing of the parent leaks in.
    assert {"PATH", "ONLY"} <= names <= {"PATH", "ONLY", "LC_CTYPE"}
    assert result.peak_memory_kb > 0


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import os, subprocess, sys, time, signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    result = run(tmp_path, code, timeout_s=1.5)
    assert result.killed_by is KilledBy.TIMEOUT
    assert result.signal == 9
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the grandchild in the group was killed too"


def test_output_over_the_cap_is_stopped_and_truncated(tmp_path: Path) -> None:
    result = run(tmp_path, "import sys\nwhile True: sys.stdout.write('x' * 65536)", max_output_bytes=200_000)
    assert result.killed_by is KilledBy.OUTPUT
    assert result.truncated
    assert (tmp_path / "out.txt").stat().st_size == 200_000


def test_cancellation_kills_the_run(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def cancel_soon() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(
                    run_unsafe_unconfined,
                    [
                        sys.executable,
                        "-c",
                        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
                    ],
                    tmp_path,
                    limits(),
                    tmp_path / "out.txt",
                    tmp_path / "err.txt",
                )
            )
            with anyio.fail_after(scaled(30)):  # cancelled once the run is under way: its pid is written
                while not (pid_file.exists() and pid_file.read_text()):
                    await anyio.sleep(0.01)
            group.cancel_scope.cancel()

    anyio.run(cancel_soon)
    assert not _alive(int(pid_file.read_text()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_command_that_cannot_start_raises(tmp_path: Path) -> None:
    with pytest.raises(SandboxStartError):
        anyio.run(run_unsafe_unconfined, ["/no/such/interpreter"], tmp_path, limits(), tmp_path / "o", tmp_path / "e")
