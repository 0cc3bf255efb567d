"""Start one confined line server as whoever runs this script, ask it things, print the answers as JSON.

The tests start it under `setpriv` as an ordinary uid (a rootless gateway, as rootless_child.py), and as
root for a gateway to SIGKILL. Usage: python server_child.py MODE WORKSPACE SCRATCH BACKEND [CODE...]
MODE `ask`: ask each CODE, stop the server, print the answers, how it ended and whether nothing is left;
MODE `hold`: ask each CODE, print the answers and the server's pid, then wait to be killed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from sandbox import Limits, probe_host
from sandbox.change_set import DEFAULT_PROTECTED
from sandbox.limits import BACKENDS, Backend
from sandbox.pinned import pin
from sandbox.server import ConfinedServer, ServerSpec, start_server

PYTHON = "/usr/bin/python3"
LINE_SERVER = r"""
import json, os, subprocess, sys
for line in sys.stdin:
    scope = {"os": os, "subprocess": subprocess, "json": json, "sys": sys}
    try:
        exec(json.loads(line), scope)
        answer = scope.get("answer")
    except Exception as exc:
        answer = {"error": type(exc).__name__ + ": " + str(exc)}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"""
"""Each line is a JSON string of Python code; it sets `answer`, which comes back as one JSON line."""
ASK_S = 60
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",  # /etc is not the server's to read
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.invalid",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.invalid",
}


def server_limits(scratch: Path, backend: Backend, **over: Any) -> Limits:
    return Limits(
        timeout_s=over.pop("timeout_s", 1),  # a server has no time limit: a small one proves it is not used
        memory_limit_mb=over.pop("memory_limit_mb", 256),
        max_processes=over.pop("max_processes", 16),
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), **GIT_ENV} | over.pop("env", {}),
        scratch_bytes=8 << 20,
        backend=backend,
        **over,
    )


class Talk:
    """Questions to a line server, one at a time."""

    def __init__(self, server: ConfinedServer) -> None:
        self.server = server
        self._lines = BufferedByteReceiveStream(server.stdout)

    async def ask(self, code: str) -> Any:
        with anyio.fail_after(ASK_S):
            await self.server.stdin.send(json.dumps(code).encode() + b"\n")
            return json.loads(await self._lines.receive_until(b"\n", 1 << 20))


async def main() -> None:
    mode, workspace, scratch, backend = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    if backend not in BACKENDS or mode not in ("ask", "hold"):
        raise SystemExit(f"unknown mode or backend: {mode} {backend}")
    chosen: Backend = "native" if backend == "native" else "bubblewrap"
    writable = len(sys.argv) > 5 and sys.argv[5] == "--writable"
    codes = sys.argv[6 if writable else 5 :]
    pinned = pin(workspace)
    state = workspace.parent / "state"  # the gateway's state folder, when the test made one: hidden from the server
    limits = server_limits(scratch, chosen, hidden=(state,) if state.exists() else ())
    spec = ServerSpec((PYTHON, "-I", "-c", LINE_SERVER), pinned, writable, DEFAULT_PROTECTED, limits)
    outcome: dict[str, Any] = {"rootless": probe_host().rootless}
    async with start_server(spec, scratch=scratch) as server:
        talk = Talk(server)
        outcome["answers"] = [await talk.ask(code) for code in codes]
        outcome["layers"] = list(server.layers)
        if writable:
            synced = await server.sync()
            outcome["applied"] = synced.applied.applied
            outcome["written"] = list(synced.applied.written)
            outcome["refused"] = {entry.path: str(entry.why) for entry in synced.changes.refused}
        if mode == "hold":
            outcome["pid"] = server.pid
            print(json.dumps(outcome), flush=True)
            await anyio.sleep_forever()
        await server.stop()
        outcome["ended_by"] = server.ended_by()
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    anyio.run(main)
