"""Long-lived confined servers (sandbox/server.py, decision 83): real processes over real pipes, root and rootless, both backends."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from sandbox import probe_host
from sandbox.backends import pidns
from sandbox.backends.containment import owned_by
from sandbox.change_set import DEFAULT_PROTECTED
from sandbox.errors import SandboxStartError
from sandbox.layers import Layer
from sandbox.limits import BACKENDS, Backend
from sandbox.pinned import Pinned
from sandbox.server import ConfinedServer, ServerSpec, start_server
from tests.harness import REPO
from tests.sandbox.confined_child import DAEMONIZE, project, requires_root
from tests.sandbox.server_child import LINE_SERVER, PYTHON, Talk, server_limits

pytestmark = requires_root

CHILD = str(REPO / "tests" / "sandbox" / "server_child.py")
GONE_WITHIN_S = pidns.WATCHDOG_GRACE_S + 10.0  # the watchdog's grace, and a busy machine's margin


def skip_without(backend: Backend) -> None:
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.skip("bubblewrap does not run here")


@contextlib.asynccontextmanager
async def serving(
    folder: Path, ws: Pinned, backend: Backend, *, writable: bool = False, **over: Any
) -> AsyncIterator[tuple[ConfinedServer, Talk]]:
    limits = server_limits(folder / "scratch", backend, **over)
    spec = ServerSpec((PYTHON, "-I", "-c", LINE_SERVER), ws, writable, DEFAULT_PROTECTED, limits)
    async with start_server(spec, scratch=folder / "scratch") as server:
        yield server, Talk(server)


def alive(pids: list[int]) -> list[int]:
    living = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
    return living


def family(pid: int) -> list[int]:
    """`pid` and every process beneath it (a confined server's daemons stay beneath its PID namespace's pid 1)."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_answers_over_its_pipes_confined_and_lives_past_its_timeout(backend: Backend) -> None:
    skip_without(backend)
    with project({"README.md": "hello\n"}) as (folder, ws):

        async def main() -> None:
            async with serving(folder, ws, backend) as (server, talk):
                assert await talk.ask("answer = 6 * 7") == 42
                identity = await talk.ask("answer = [os.getuid(), os.getcwd(), open('README.md').read()]")
                assert identity[1:] == [str(ws.path), "hello\n"], "the workspace is its cwd, readable"
                assert identity[0] != 0, "never root"
                await anyio.sleep(2.5)  # past the limits' timeout_s (1 s) and the watchdog's grace: no deadline
                assert await talk.ask("answer = 'still here'") == "still here"
                assert server.returncode is None and server.ended_by() is None
                expected = {Layer.PID_NAMESPACE, Layer.NETWORK_NAMESPACE, Layer.SECCOMP, Layer.RLIMITS}
                assert expected <= set(server.layers)
                await server.stop()
                assert server.ended_by() == "stopped"
                await server.stop()  # idempotent
            assert server.ended_by() == "stopped"

        anyio.run(main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_writes_nowhere_reaches_no_network_and_no_hidden_state(backend: Backend) -> None:
    skip_without(backend)
    with project({"a.txt": "a\n"}) as (folder, ws), socket.create_server(("127.0.0.1", 0)) as listener:
        state = folder / "state"
        state.mkdir(mode=0o700)
        (state / "secret").write_text("s3cret")
        outside = folder / "outside.txt"
        port = listener.getsockname()[1]

        async def main() -> dict[str, Any]:
            async with serving(folder, ws, backend, hidden=(state,)) as (_, talk):
                code = f"""
import socket
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
answer = {{
    "workspace": attempt(lambda: open("a.txt", "w").write("x")),
    "new_in_workspace": attempt(lambda: open("new.txt", "w").write("x")),
    "outside": attempt(lambda: open({str(outside)!r}, "w").write("x")),
    "state": attempt(lambda: open({str(state / "secret")!r}).read()),
    "network": attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2)),
    "scratch": attempt(lambda: open(os.environ["TMPDIR"] + "/s.txt", "w").write("x")),
}}
"""
                answer: dict[str, Any] = await talk.ask(code)
                return answer

        seen = anyio.run(main)
        assert seen["scratch"] == "ok", seen
        assert all(seen[name] != "ok" for name in ("workspace", "new_in_workspace", "outside", "state", "network")), (
            seen
        )
        assert (ws.path / "a.txt").read_text() == "a\n" and not (ws.path / "new.txt").exists()
        assert not outside.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_kills_the_server_and_the_daemons_it_left(backend: Backend) -> None:
    skip_without(backend)
    with project({}) as (folder, ws):

        async def main() -> tuple[list[int], int]:
            async with serving(folder, ws, backend) as (server, talk):
                await talk.ask(f"exec({DAEMONIZE!r}.replace('print(', 'answer = ('))")
                started = family(server.pid)
                assert len(started) >= 3, "the supervisors, the server and its daemon"
                uid: int = psutil.Process(started[-1]).uids().real
            return started, uid

        started, uid = anyio.run(main)
        assert alive(started) == [], "nothing of the server outlives its context"
        assert owned_by(uid) == [] or uid == os.getuid(), "nothing of its uid is left"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_that_ends_by_itself_says_how(backend: Backend) -> None:
    skip_without(backend)
    with project({}) as (folder, ws):

        async def main() -> list[str | None]:
            seen: list[str | None] = []
            async with serving(folder, ws, backend) as (server, talk):
                await server.stdin.send(json.dumps("sys.stderr.write('dying words\\n'); os._exit(3)").encode() + b"\n")
                with anyio.fail_after(30):
                    await server.wait()
                seen.append(server.ended_by())
                with anyio.fail_after(10):
                    while "dying words" not in server.stderr_tail():
                        await anyio.sleep(0.01)
            async with serving(folder, ws, backend) as (server, talk):
                await server.stdin.send(json.dumps("os.kill(os.getpid(), 15)").encode() + b"\n")
                with anyio.fail_after(30):
                    await server.wait()
                seen.append(server.ended_by())
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await talk.ask("answer = 1")
            return seen

        assert anyio.run(main) == ["exit 3", "signal 15"] if backend == "native" else ["exit 3", "exit 143"]


def test_the_stderr_tail_is_bounded() -> None:
    with project({}) as (folder, ws):

        async def main() -> str:
            async with serving(folder, ws, "native") as (server, talk):
                await talk.ask("sys.stderr.write('x' * 100000 + 'END'); sys.stderr.flush(); answer = 1")
                with anyio.fail_after(10):
                    while not server.stderr_tail().endswith("END"):
                        await anyio.sleep(0.01)
                return server.stderr_tail()

        tail = anyio.run(main)
        assert tail.endswith("END") and len(tail) <= 4096


def test_a_server_that_cannot_start_raises_with_its_step() -> None:
    with project({}) as (folder, ws):

        async def main() -> None:
            limits = server_limits(folder / "scratch", "native")
            spec = ServerSpec(("/nonexistent/server",), ws, False, DEFAULT_PROTECTED, limits)
            async with start_server(spec, scratch=folder / "scratch"):
                pytest.fail("started")

        with pytest.raises(SandboxStartError) as caught:
            anyio.run(main)
        assert caught.value.reason == "spawn_failed"
        relative = ServerSpec(("python3",), ws, False, DEFAULT_PROTECTED, server_limits(folder / "scratch", "native"))
        with pytest.raises(SandboxStartError) as caught:
            anyio.run(lambda: _enter(relative, folder / "scratch"))
        assert caught.value.reason == "server_program_not_absolute"


async def _enter(spec: ServerSpec, scratch: Path) -> None:
    async with start_server(spec, scratch=scratch):
        pass
