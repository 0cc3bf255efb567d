"""`mcp-gateway COMMAND` in a process of its own, forked from one that has the gateway imported already.

A short command (`user add`, `token issue`, `audit export`, `policy check`, ...) spends about 90% of
its CPU importing the gateway, SQLAlchemy and their dependencies (about 0.4 s of a `user list`'s
0.45 s), and the CLI tests run a few hundred of them. Each pytest process starts one helper
(`python -m tests.cli_fork`, on first use) that imports what `python -m gateway` imports and then,
for each command, forks: the child takes the test's stdin, stdout and stderr (three pipes, passed
over a Unix socket), environment, working folder and umask, and runs `raise SystemExit(main(argv))`
at the top level, as `gateway/__main__.py` does, so the interpreter's own exit (an escaping
exception printed as a traceback, exit 1; atexit handlers; threads joined) ends it. The helper
reports the child's pid at once (a timeout kills it, as `subprocess.run` would) and its wait
status when it ends. `run` returns what `subprocess.run(..., capture_output=True, text=True)`
returns.

What only a real start shows (the entry point, imports, `--help` and usage errors before the
commands load, another interpreter or uid) keeps `subprocess.run` on `python -m gateway`:
tests/e2e/test_cli.py compares both ways for a sample of commands, output and exit status.
Long-running commands (`serve`, `console`, `approvals`, `demo`) never come here.

The helper is single-threaded (a fork copies only the calling thread; it checks before each one)
and ends when its pytest process closes the socket, or dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LONG_RUNNING = frozenset({"serve", "console", "approvals", "demo"})
"""Commands that run until stopped: always `python -m gateway`, never forked here."""
PRELOADED = ("gateway.cli", "gateway.cli.commands", "gateway.logs")
"""What `gateway.cli.main` imports once the arguments parse, for every short command."""
_MAX_MESSAGE = 1 << 20
REPO = Path(__file__).resolve().parent.parent


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


class _Lines:
    """Newline-delimited JSON messages from a stream socket, with the fds that came along."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.fds: list[int] = []

    def read(self) -> dict[str, Any] | None:
        while b"\n" not in self.buffer:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, _MAX_MESSAGE, 8)
            self.fds.extend(fds)
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message


# -- the helper process -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Command:
    argv: list[str]


def _die_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


def _serve(sock: socket.socket) -> _Command | None:
    """Answer requests until the socket closes (None); in a forked child, the command it is to run."""
    lines = _Lines(sock)
    while True:
        request = lines.read()
        if request is None:
            return None
        stdin, stdout, stderr = lines.fds[:3]
        del lines.fds[:3]
        if threading.active_count() != 1:  # a fork copies only this thread: refuse rather than hang
            _send(sock, {"error": f"{threading.active_count()} threads in the fork helper"})
            for fd in (stdin, stdout, stderr):
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            for target, fd in enumerate((stdin, stdout, stderr)):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(request["cwd"])
            os.umask(request["umask"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = [sys.argv[0], *request["argv"]]
            return _Command(request["argv"])
        for fd in (stdin, stdout, stderr):
            os.close(fd)
        _send(sock, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(sock, {"returncode": os.waitstatus_to_exitcode(status)})


def _helper_main() -> _Command | None:
    _die_with_parent()
    sock = socket.socket(fileno=int(sys.argv[1]))
    import gateway.cli

    with gateway.cli.imports_without_gc():  # as `main` imports them
        for name in PRELOADED:
            __import__(name)
    _send(sock, {"ready": True})
    return _serve(sock)


# -- the client, in the pytest process ----------------------------------------------------------


class _Helper:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_fork", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )
        theirs.close()
        self.sock = ours
        self.lines = _Lines(ours)
        self.lock = threading.Lock()
        ready = self.lines.read()
        if ready != {"ready": True}:
            self.close()
            raise RuntimeError(f"the CLI fork helper did not start: {ready!r}")

    def close(self) -> None:
        self.sock.close()  # the helper reads EOF and exits
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_helpers: dict[int, _Helper] = {}
"""This process's helper (by pid: a forked pytest process must not use its parent's)."""


def _helper() -> _Helper:
    pid = os.getpid()
    if pid not in _helpers:
        _helpers[pid] = _Helper()
    return _helpers[pid]


def stop_helper() -> None:
    """Stop this process's helper, if it started one (tests/conftest.py calls it as the session ends)."""
    helper = _helpers.pop(os.getpid(), None)
    if helper is not None:
        helper.close()


def _communicate(pipes: tuple[int, int, int], data: bytes, deadline: float, child: int) -> tuple[bytes, bytes] | None:
    """Write `data` to the child's stdin and read its stdout and stderr to their ends; None at the deadline."""
    stdin, stdout, stderr = pipes
    os.set_blocking(stdin, False)
    out: dict[int, list[bytes]] = {stdout: [], stderr: []}
    with selectors.DefaultSelector() as selector:
        if data:
            selector.register(stdin, selectors.EVENT_WRITE)
        else:
            os.close(stdin)
        selector.register(stdout, selectors.EVENT_READ)
        selector.register(stderr, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
                for key in list(selector.get_map().values()):
                    os.close(key.fd)
                return None
            for key, _events in selector.select(left):
                if key.fd == stdin:
                    try:
                        written = os.write(stdin, data)
                    except BrokenPipeError:
                        written = len(data)
                    data = data[written:]
                    if not data:
                        selector.unregister(stdin)
                        os.close(stdin)
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    out[key.fd].append(chunk)
                else:
                    selector.unregister(key.fd)
                    os.close(key.fd)
    return b"".join(out[stdout]), b"".join(out[stderr])


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([sys.executable, "-m", "gateway", *argv], capture_output=True, text=True, env=env,
    input=input, timeout=timeout)`, forked from the helper (see the module's docstring). A long-running
    command, or a helper that cannot fork, goes to `subprocess.run` itself."""
    command = [sys.executable, "-m", "gateway", *argv]
    if any(word in LONG_RUNNING for word in argv) or threading.current_thread() is not threading.main_thread():
        # From another thread: PR_SET_PDEATHSIG would stop the helper when that thread ends.
        return subprocess.run(
            command, capture_output=True, text=True, env=env, input=input, timeout=timeout, check=False
        )
    helper = _helper()
    ends = [os.pipe() for _ in range(3)]
    theirs = (ends[0][0], ends[1][1], ends[2][1])
    ours = (ends[0][1], ends[1][0], ends[2][0])
    umask = os.umask(0o022)
    os.umask(umask)
    request = {"argv": list(argv), "env": dict(os.environ if env is None else env), "cwd": os.getcwd(), "umask": umask}
    deadline = time.monotonic() + timeout
    with helper.lock:
        try:
            _send(helper.sock, request, theirs)
        finally:
            for fd in theirs:
                os.close(fd)
        started = helper.lines.read()
        if started is None or "pid" not in started:
            for fd in ours:
                os.close(fd)
            raise RuntimeError(f"the CLI fork helper did not run {argv!r}: {started!r}")
        encoding = locale.getpreferredencoding(False)  # what text=True encodes and decodes with
        output = _communicate(ours, (input or "").encode(encoding), deadline, started["pid"])
        ended = helper.lines.read()
    if ended is None:
        raise RuntimeError(f"the CLI fork helper ended while running {argv!r}")
    if output is None:
        raise subprocess.TimeoutExpired(command, timeout)
    # As text=True reads: the locale's encoding, universal newlines.
    stdout, stderr = (part.decode(encoding).replace("\r\n", "\n").replace("\r", "\n") for part in output)
    return subprocess.CompletedProcess(command, ended["returncode"], stdout, stderr)


if __name__ == "__main__":
    forked = _helper_main()
    if forked is not None:
        from gateway.cli import main

        raise SystemExit(main(forked.argv))
