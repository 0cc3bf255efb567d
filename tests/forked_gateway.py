"""`mcp-gateway ...` in a process of its own, forked from one that has the gateway imported already.

A short command (`user add`, `token issue`, `audit export`, ...) spends about 0.4 of its 0.45 s of
CPU importing the gateway, SQLAlchemy and their dependencies, and `serve` about 0.75 of its 0.83 s
to its `initialize` answer (the MCP SDK most of it); the suite starts several hundred of each.
Each pytest process starts one helper (`python -m tests.forked_gateway`, on first use) that
imports what `gateway.cli.main` imports (and, on the first `serve`, `gateway.server`) and then, for
each command, forks: the child takes the caller's stdin, stdout and stderr (passed over a Unix
socket), environment, working folder and umask, and runs `raise SystemExit(main(argv))` at the top
level, as `gateway/__main__.py` does, so the interpreter's own exit ends it (an escaping exception
printed as a traceback with exit 1, atexit handlers, threads joined). The helper reports the
child's pid at once and its exit status when it ends. `run` returns what `subprocess.run(...,
capture_output=True, text=True)` returns; `start` returns a `ForkedProcess`, which the tests use
as they use a `subprocess.Popen` (pid, stdin, stdout, poll, wait, send_signal, terminate, kill).

What only a real start shows keeps `python -m gateway` (see docs/decisions/0076-the-suites-plumbing.md):
`--version`, another interpreter, another uid, `console`, `approvals` and `demo`, and a gateway whose
`/proc/<pid>/environ` or `cmdline` a test reads (a fork keeps the helper's: `StdioSession(forked=False)`);
tests/e2e/test_cli.py and tests/e2e/test_smoke.py compare forked and started answers. With
MCP_GATEWAY_TEST_FORK=off every command starts `python -m gateway`.

The helper also answers what it holds (`loaded_modules`): the modules of a new interpreter after a short
command's imports, and after `serve`'s too; tests/gateway/test_cli_start_up.py reads them there, where an
interpreter of its own imported the same again (1.2 s of CPU).

The helper is single-threaded (a fork copies only the calling thread: it checks before each one),
reaps its children as they end, and exits when its pytest process closes the socket or dies
(PR_SET_PDEATHSIG), killing the children still running.
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
from pathlib import Path
from typing import IO, Any

SWITCH_VARIABLE = "MCP_GATEWAY_TEST_FORK"
"""`off`: every command starts `python -m gateway`, as a person's shell starts it."""
STARTED_ONLY = frozenset({"console", "approvals", "demo", "--version", "--help", "-h"})
"""Arguments whose commands always start `python -m gateway`: a console or approver another process
talks to over HTTP or a terminal, the demo, and what answers before the commands load."""
PRELOADED = ("gateway.cli", "gateway.cli.commands", "gateway.logs")
"""What `gateway.cli.main` imports once the arguments parse, for every command."""
REPO = Path(__file__).resolve().parent.parent
_MAX_MESSAGE = 1 << 20


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

    def ready(self) -> bool:
        return b"\n" in self.buffer

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


def _die_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


def _reap(sock: socket.socket, children: set[int]) -> None:
    """Report every child that ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(sock, {"ended": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _serve(sock: socket.socket) -> list[str] | None:
    """Answer requests until the socket closes (None); in a forked child, the arguments it is to run."""
    lines = _Lines(sock)
    children: set[int] = set()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    try:
        while True:
            if not lines.ready():
                readable = {key.fd for key, _events in selector.select()}
                if wake_read in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                _reap(sock, children)
                if sock.fileno() not in readable:
                    continue
            request = lines.read()
            if request is None:
                return None
            if request.get("modules"):
                import gateway.server  # as before the first serve, if none came yet

                _send(sock, {"modules": {"commands": _commands_modules, "serve": sorted(sys.modules)}})
                continue
            fds = lines.fds[:3]
            del lines.fds[:3]
            if request.get("serve"):
                import gateway.server  # noqa: F401  (imported once, before the first serve is forked)
            if threading.active_count() != 1:  # a fork copies only this thread: refuse rather than hang
                _send(sock, {"error": f"{threading.active_count()} threads in the fork helper"})
                for fd in fds:
                    os.close(fd)
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                sock.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_read, wake_write):
                    os.close(fd)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                os.chdir(request["cwd"])
                os.umask(request["umask"])
                os.environ.clear()
                os.environ.update(request["env"])
                sys.argv = [sys.argv[0], *request["argv"]]
                argv: list[str] = request["argv"]
                return argv
            children.add(pid)
            for fd in fds:
                os.close(fd)
            _send(sock, {"pid": pid})
    finally:
        if os.getpid() in _helper_pid:
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in children:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


_helper_pid: list[int] = []
_commands_modules: list[str] = []
"""What the helper held once it had imported what every command imports (`PRELOADED`), before anything else."""


def _helper_main() -> list[str] | None:
    _die_with_parent()
    _helper_pid.append(os.getpid())
    sock = socket.socket(fileno=int(sys.argv[1]))
    import gateway.cli

    with gateway.cli.imports_without_gc():  # as `main` imports them
        for name in PRELOADED if sys.argv[2:] != ["bare"] else ():
            __import__(name)
    _commands_modules.extend(sorted(sys.modules))
    _send(sock, {"ready": True})
    return _serve(sock)


# -- the client, in the pytest process ----------------------------------------------------------


class _Helper:
    def __init__(self, *, bare: bool = False) -> None:
        """bare: nothing imported ahead (a test of the helper itself); each child then imports what it runs."""
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.forked_gateway", str(theirs.fileno()), *(["bare"] if bare else [])],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )
        theirs.close()
        self.sock = ours
        lines = _Lines(ours)
        ready = lines.read()
        if ready != {"ready": True}:
            self.close()
            raise RuntimeError(f"the gateway fork helper did not start: {ready!r}")
        self.lock = threading.Lock()
        """Held from a request's sending to its answer's arrival: the next `pid`, `error` or `modules` message is
        that request's."""
        self.started: list[dict[str, Any] | None] = []
        self.started_ready = threading.Condition()
        self.ended: dict[int, int] = {}
        self.ended_ready = threading.Condition()
        self.reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self.reader.start()

    def _read(self, lines: _Lines) -> None:
        while True:
            try:
                message = lines.read()
            except OSError:
                message = None
            if message is None or "pid" in message or "error" in message or "modules" in message:
                with self.started_ready:
                    self.started.append(message)
                    self.started_ready.notify_all()
                if message is None:
                    with self.ended_ready:
                        self.ended_ready.notify_all()
                    return
            else:
                with self.ended_ready:
                    self.ended[message["ended"]] = message["returncode"]
                    self.ended_ready.notify_all()

    def _ask(self, request: Mapping[str, Any], fds: Sequence[int] = ()) -> dict[str, Any] | None:
        """Send `request`; the helper's answer to it (None if the helper ended)."""
        with self.lock:
            _send(self.sock, request, fds)
            with self.started_ready:
                while not self.started:
                    self.started_ready.wait()
                return self.started.pop(0)

    def fork(self, request: Mapping[str, Any], fds: Sequence[int]) -> int:
        answer = self._ask(request, fds)
        if answer is None or "pid" not in answer:
            raise RuntimeError(f"the gateway fork helper did not run {request['argv']!r}: {answer!r}")
        pid: int = answer["pid"]
        return pid

    def modules(self) -> dict[str, list[str]]:
        answer = self._ask({"modules": True})
        if answer is None or "modules" not in answer:
            raise RuntimeError(f"the gateway fork helper did not say what it holds: {answer!r}")
        modules: dict[str, list[str]] = answer["modules"]
        return modules

    def returncode(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit status once it ended, waiting up to `timeout` s (None: as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.ended_ready:
            while pid not in self.ended:
                if not self.reader.is_alive():
                    raise RuntimeError("the gateway fork helper ended")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.ended_ready.wait(left)
            return self.ended[pid]

    def close(self) -> None:
        # The helper reads EOF, kills what still runs, and exits. `shutdown` first: a close alone leaves the
        # socket open while the reader thread is inside its recv (the kernel holds the file until that call
        # returns), so the helper saw no EOF and every pytest process waited out the 30 s below at its end.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_helpers: dict[int, _Helper] = {}
"""This process's helper (by pid: a forked pytest process must not use its parent's)."""


def _helper() -> _Helper | None:
    """This process's helper, started on first use; None where a command must start `python -m gateway`."""
    if os.environ.get(SWITCH_VARIABLE) == "off":
        return None
    pid = os.getpid()
    if pid not in _helpers:
        if threading.current_thread() is not threading.main_thread():
            return None  # PR_SET_PDEATHSIG would stop the helper when this thread ends
        _helpers[pid] = _Helper()
    return _helpers[pid]


def loaded_modules() -> dict[str, list[str]] | None:
    """The names in `sys.modules` of this process's helper, a new interpreter, once it had imported what every
    command imports ("commands"), and then `gateway.server` ("serve"); None where forks are off."""
    helper = _helper()
    return None if helper is None else helper.modules()


def stop_helper() -> None:
    """Stop this process's helper, if it started one (tests/conftest.py calls it as the session ends)."""
    helper = _helpers.pop(os.getpid(), None)
    if helper is not None:
        helper.close()


class ForkedProcess:
    """A forked `mcp-gateway ...`, as the tests use a `subprocess.Popen`: its pid is the command's own."""

    def __init__(self, helper: _Helper, args: list[str], pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None):
        self._helper = helper
        self.args = args
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._helper.returncode(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._helper.returncode(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # not once it is reaped: the pid may be another process's by then
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _request(argv: Sequence[str], env: Mapping[str, str] | None, serve: bool) -> dict[str, Any]:
    umask = os.umask(0o022)
    os.umask(umask)
    environment = dict(os.environ if env is None else env)
    return {"argv": list(argv), "env": environment, "cwd": os.getcwd(), "umask": umask, "serve": serve}


def start(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, stderr: IO[bytes] | None = None
) -> ForkedProcess | subprocess.Popen[bytes]:
    """`subprocess.Popen([sys.executable, "-m", "gateway", *argv], stdin=PIPE, stdout=PIPE, stderr=stderr,
    env=env)`, forked from the helper (see the module's docstring) when it can be."""
    command = [sys.executable, "-m", "gateway", *argv]
    helper = None if STARTED_ONLY & set(argv) else _helper()
    if helper is None:
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env)
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    error = os.dup(stderr.fileno()) if stderr is not None else os.dup(2)
    theirs = (stdin_read, stdout_write, error)
    try:
        pid = helper.fork(_request(argv, env, serve=True), theirs)
    except BaseException:
        for fd in (stdin_write, stdout_read):
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return ForkedProcess(helper, command, pid, open(stdin_write, "wb"), open(stdout_read, "rb"))


def _communicate(pipes: tuple[int, int, int], data: bytes, deadline: float) -> tuple[bytes, bytes] | None:
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
    input=input, timeout=timeout)`, forked from the helper (see the module's docstring) when it can be."""
    command = [sys.executable, "-m", "gateway", *argv]
    helper = None if STARTED_ONLY & set(argv) else _helper()
    if helper is None:
        return subprocess.run(
            command, capture_output=True, text=True, env=env, input=input, timeout=timeout, check=False
        )
    ends = [os.pipe() for _ in range(3)]
    theirs = (ends[0][0], ends[1][1], ends[2][1])
    ours = (ends[0][1], ends[1][0], ends[2][0])
    deadline = time.monotonic() + timeout
    try:
        pid = helper.fork(_request(argv, env, serve=False), theirs)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    encoding = locale.getpreferredencoding(False)  # what text=True encodes and decodes with
    output = _communicate(ours, (input or "").encode(encoding), deadline)
    returncode = helper.returncode(pid, max(0.0, deadline - time.monotonic()) if output is not None else 0)
    if output is None or returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        helper.returncode(pid, None)  # reaped by the helper: nothing of it is left
        raise subprocess.TimeoutExpired(command, timeout)
    # As text=True reads: the locale's encoding, universal newlines.
    stdout, stderr = (part.decode(encoding).replace("\r\n", "\n").replace("\r", "\n") for part in output)
    return subprocess.CompletedProcess(command, returncode, stdout, stderr)


if __name__ == "__main__":
    forked = _helper_main()
    if forked is not None:
        from gateway.cli import main

        raise SystemExit(main(forked))
