"""One proxied run (Limits.proxy) with a tiny HTTP responder on the listener `on_proxy` gets; its outcome as JSON.

The root tests call `run_proxied` in process; the rootless ones start this script under `setpriv` as an
ordinary uid (a rootless gateway, as rootless_child.py), so the probe, the plan and the runner take the
rootless path. The responder answers every request with 200 and `PROXIED`, and records each request's
first line and what the gateway saw of the run's namespace (/proc/<pid>/net of the spawned process,
read as root or as the run's own uid) and whether any process of the run holds the listener.
Usage: python proxy_child.py CODE WORKSPACE SCRATCH BACKEND [server]
(`server`: CODE is asked of a proxied line server, tests/sandbox/server_child.py, instead of run.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import psutil

from sandbox import Limits, probe_host, run_sandboxed
from sandbox.change_set import DEFAULT_PROTECTED
from sandbox.limits import Backend
from sandbox.pinned import pin
from sandbox.server import ServerSpec, start_server
from tests.sandbox.server_child import LINE_SERVER, PYTHON, Talk, server_limits

PROXIED = "proxied-by-the-test"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(PROXIED), PROXIED.encode())
READ_S = 20
_runs = itertools.count()


@dataclass
class Seen:
    """What the test's side saw: each request's first line, the namespace at the hand-over, who held the listener."""

    requests: list[str] = field(default_factory=list)
    handed: int = 0
    listener: dict[str, Any] = field(default_factory=dict)
    namespace: dict[str, str] = field(default_factory=dict)
    holders: list[int] = field(default_factory=list)


def proxy_limits(scratch: Path, backend: Backend, **over: Any) -> Limits:
    return Limits(
        timeout_s=over.pop("timeout_s", 30),
        memory_limit_mb=256,
        max_processes=16,
        max_output_bytes=200_000,
        env={"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch)} | over.pop("env", {}),
        scratch_bytes=8 << 20,
        backend=backend,
        proxy=over.pop("proxy", True),
        **over,
    )


def run_processes() -> list[int]:
    """The processes beneath this one in a network namespace other than this one's: the spawned supervisor and
    the run's. Not the suite's own (its PostgreSQL, the helper that forks gateways), which live in the host's;
    a run left in the host's namespace is then not found, and the checks on its namespace fail."""
    host = os.stat("/proc/self/ns/net").st_ino
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(OSError, psutil.Error):
            if os.stat(f"/proc/{child.pid}/ns/net").st_ino != host:
                found.append(child.pid)
    return found


def net_view(pid: int) -> dict[str, str]:
    """The network namespace of `pid` as /proc/<pid>/net shows it: its interfaces, TCP sockets and routes."""
    view = {}
    for name in ("dev", "tcp", "tcp6", "route", "udp"):
        with contextlib.suppress(OSError):
            view[name] = Path(f"/proc/{pid}/net/{name}").read_text()
    return view


def holders_of(listener: socket.socket) -> list[int]:
    """The processes of the run (beneath this one) holding an fd of the listener's socket."""
    inode = os.fstat(listener.fileno()).st_ino
    target = f"socket:[{inode}]"
    found = []
    for pid in [child.pid for child in psutil.Process().children(recursive=True)]:  # whatever namespace
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        found.append(pid)
    return found


async def respond(sock: socket.socket, seen: Seen) -> None:
    """Answer every connection on the run's listener with RESPONSE, recording each request's first line."""
    listener = await anyio.abc.SocketListener.from_socket(sock)

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            with anyio.move_on_after(READ_S):
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    try:
                        data += await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
            seen.requests.append(data.split(b"\r\n", 1)[0].decode("latin-1"))
            seen.holders = holders_of(sock)
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.send(RESPONSE)

    async with listener:
        await listener.serve(answer)


async def run_proxied(
    code: str, workspace: Path, scratch: Path, backend: Backend, *, serve: bool = True, **over: Any
) -> tuple[dict[str, Any], Seen]:
    """Run `code` (python -I -c) proxied; `serve`: answer on the listener (else hold it, accepting nothing)."""
    seen = Seen()
    held: list[socket.socket] = []
    serial = next(_runs)
    out, err = scratch.parent / f"out-{serial}.txt", scratch.parent / f"err-{serial}.txt"
    async with anyio.create_task_group() as group:

        def on_proxy(listener: socket.socket) -> None:
            seen.handed += 1
            seen.listener = {
                "address": list(listener.getsockname()),
                "blocking": listener.getblocking(),
                "accepting": listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN),
                "inheritable": listener.get_inheritable(),
            }
            processes = run_processes()
            seen.namespace = net_view(processes[0]) if processes else {}
            if serve:
                group.start_soon(respond, listener, seen)
            else:
                held.append(listener)

        result = await run_sandboxed(
            [sys.executable, "-I", "-c", code],
            workspace,
            proxy_limits(scratch, backend, **over),
            out,
            err,
            scratch=scratch,
            on_proxy=on_proxy,
        )
        group.cancel_scope.cancel()
    for listener in held:
        listener.close()
    outcome = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name not in ("collected",)}
    outcome["changes"] = None
    outcome["stdout"] = out.read_text()
    outcome["stderr"] = err.read_text()
    outcome["rootless"] = probe_host().rootless
    return outcome, seen


async def serve_proxied(code: str, workspace: Path, scratch: Path, backend: Backend) -> tuple[dict[str, Any], Seen]:
    """A proxied line server (start_server) asked `code` once: its answer, its layers, whether it was rootless."""
    seen = Seen()
    pinned = pin(workspace)
    outcome: dict[str, Any] = {"rootless": probe_host().rootless}
    try:
        spec = ServerSpec(
            (PYTHON, "-I", "-c", LINE_SERVER),
            pinned,
            False,
            DEFAULT_PROTECTED,
            server_limits(scratch, backend, proxy=True),
        )
        async with anyio.create_task_group() as group:

            def on_proxy(listener: socket.socket) -> None:
                seen.handed += 1
                group.start_soon(respond, listener, seen)

            async with start_server(spec, scratch=scratch, on_proxy=on_proxy) as server:
                outcome["answer"] = await Talk(server).ask(code)
                outcome["layers"] = list(server.layers)
            group.cancel_scope.cancel()
    finally:
        pinned.close()
    return outcome, seen


def answers(outcome: dict[str, Any]) -> Any:
    """The JSON value the run's code printed as its last line."""
    lines = outcome["stdout"].strip().splitlines()
    assert lines, outcome["stderr"]
    return json.loads(lines[-1])


def main() -> None:
    code, workspace, scratch = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    backend: Backend = "bubblewrap" if sys.argv[4] == "bubblewrap" else "native"
    way = serve_proxied if sys.argv[5:] == ["server"] else run_proxied
    outcome, seen = anyio.run(lambda: way(code, workspace, scratch, backend))
    print(json.dumps({"outcome": outcome, "seen": dataclasses.asdict(seen)}, default=str))


if __name__ == "__main__":
    main()
