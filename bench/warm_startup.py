"""A warm per-user gateway that `serve` hands its stdio to, measured against a cold `serve` (decision 94).

A prototype, not shipped: it measures what a host would see if `mcp-gateway serve` were a small
stub that passes its stdin, stdout and stderr to a per-user process that has imported the gateway
and the MCP SDK already, and that process forked a child per session to run `serve` there.

- The warm process (`--warm FOLDER`, started once by this bench): makes FOLDER with mode 0700
  (refused if it exists), imports what `gateway.cli.main` imports for `serve` (with the collector
  off, as `main` does), listens on FOLDER/warm.sock and is single-threaded (a fork copies one
  thread). For each connection it reads the peer's uid with SO_PEERCRED and closes the connection
  of any other uid; otherwise it takes one request, a JSON line (argv, environment, working folder,
  umask) with three fds (SCM_RIGHTS), forks, and the child puts the fds on 0, 1 and 2, takes the
  environment, folder and umask and runs `raise SystemExit(main(argv))` as `gateway/__main__.py`
  does. When the child ends the warm process writes its exit status and CPU on the connection; when
  the stub's end of the connection closes first (the host killed the stub), it kills the child.
- The stub (`STUB`, run as `python -c`): the socket, os, sys and json modules only; connects, sends
  the request with fds 0, 1 and 2, and exits with the status the warm process sends.

Rows, each a fresh process timed from `Popen` until the line the row waits for is read, in
interleaved rounds: `python -c pass` (the floor), the cold `serve` (`python -m gateway ... serve`)
and the stub, each to its `initialize` answer and then to its `tools/list` answer (after the
`initialized` notification). CPU: the cold row's process from start to exit; the stub's row is the
stub's CPU plus the forked child's (start to exit, which the warm process measures with wait4).
The warm process's own start (its imports) is paid once per user and printed apart.

    .venv/bin/python bench/warm_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup import serve_session, tree_env  # bench/startup.py: this script's folder is on sys.path

REPO = Path(__file__).resolve().parent.parent
SOCKET_NAME = "warm.sock"

STUB = """
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
request = {"argv": sys.argv[2:], "env": dict(os.environ), "cwd": os.getcwd(), "umask": os.umask(0o077)}
socket.send_fds(s, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
os.close(0); os.close(1)
answer = b""
while not answer.endswith(b"\\n"):
    data = s.recv(4096)
    if not data:
        sys.exit(1)
    answer += data
sys.exit(json.loads(answer)["status"])
"""
"""The `serve` stub: what `gateway/cli/__init__.py` would do for `serve` under the setting, before any import."""


# -- the warm process -----------------------------------------------------------------------


def _peer_uid(connection: socket.socket) -> int:
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _read_request(connection: socket.socket) -> tuple[dict[str, object], list[int]] | None:
    data, fds, _flags, _address = socket.recv_fds(connection, 1 << 20, 3)
    if not data.endswith(b"\n") or len(fds) != 3:  # one message: the stub sends it in one sendmsg
        for fd in fds:
            os.close(fd)
        return None
    request: dict[str, object] = json.loads(data)
    return request, fds


def _child(request: dict[str, object], fds: list[int]) -> list[str]:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(str(request["cwd"]))
    umask = request["umask"]
    assert isinstance(umask, int)
    os.umask(umask)
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    argv = request["argv"]
    assert isinstance(argv, list)
    return [str(a) for a in argv]


class _Warm:
    """The warm process's state: its listener, the SIGCHLD wake-up pipe, and each session's child and stub."""

    def __init__(self, folder: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(folder / SOCKET_NAME))
        self.listener.listen(64)
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self.stop: list[bool] = []
        signal.signal(signal.SIGTERM, lambda _signum, _frame: self.stop.append(True))
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        self.sessions: dict[int, socket.socket] = {}
        """A child's pid -> its stub's connection."""
        self.by_fd: dict[int, int] = {}
        """A watched connection's fd -> its child's pid."""
        self.pid = os.getpid()

    def serve(self) -> list[str] | None:
        """Serve connections until SIGTERM (None); in a forked child, the arguments it is to run."""
        try:
            while not self.stop:
                for key, _events in self.selector.select(timeout=1.0):
                    if key.fileobj is self.listener:
                        argv = self._accept()
                        if argv is not None:
                            return argv
                    elif key.fileobj == self.wake_read:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self.wake_read, 4096)
                        self._reap()
                    else:  # the stub's end closed (or wrote, which it never does): the host ended the session
                        self.selector.unregister(key.fileobj)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(self.by_fd.pop(key.fd), signal.SIGKILL)
        finally:
            if os.getpid() == self.pid:
                for pid in self.sessions:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        return None

    def _accept(self) -> list[str] | None:
        connection, _address = self.listener.accept()
        if _peer_uid(connection) != os.getuid():  # another user: nothing read, nothing run
            connection.close()
            return None
        got = _read_request(connection)
        if got is None:
            connection.close()
            return None
        request, fds = got
        pid = os.fork()
        if pid == 0:
            self.selector.close()
            self.listener.close()
            for other in self.sessions.values():
                other.close()
            connection.close()
            signal.set_wakeup_fd(-1)
            for number in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(number, signal.SIG_DFL)
            os.close(self.wake_read)
            os.close(self.wake_write)
            return _child(request, fds)
        for fd in fds:
            os.close(fd)
        self.sessions[pid] = connection
        self.by_fd[connection.fileno()] = pid
        self.selector.register(connection, selectors.EVENT_READ)
        return None

    def _reap(self) -> None:
        while self.sessions:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.sessions.pop(pid)
            if self.by_fd.pop(connection.fileno(), None) is not None:
                self.selector.unregister(connection)
            cpu_ms = (usage.ru_utime + usage.ru_stime) * 1000
            answer = {"status": os.waitstatus_to_exitcode(status), "cpu_ms": cpu_ms}
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps(answer).encode() + b"\n")
            connection.close()
            with Path(os.environ["WARM_CPU_LOG"]).open("a") as log:
                log.write(f"{cpu_ms}\n")


def _warm(folder: Path) -> list[str] | None:
    """Import what `serve` needs, then serve (`_Warm.serve`)."""
    folder.mkdir(mode=0o700)
    import gateway.cli  # noqa: PLC0415  (the warm process only: the bench itself imports no gateway)

    with gateway.cli.imports_without_gc():
        for name in ("gateway.cli.commands", "gateway.logs", gateway.cli.COMMAND_MODULES["serve"]):
            __import__(name)
    warm = _Warm(folder)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    (folder / "ready").write_text(f"{(usage.ru_utime + usage.ru_stime) * 1000:.1f}\n")
    return warm.serve()


# -- the bench ------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return tree_env(REPO)


def _gateway_args(home: Path) -> list[str]:
    db = f"sqlite:///{home}/gateway.db"
    return ["--home", str(home), "--db", db, "--policy", str(home / "policy.yaml"), "serve"]


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _last_cpu(log: Path, lines_before: int) -> float:
    deadline = time.monotonic() + 30
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) > lines_before:
            return float(lines[-1])
        if time.monotonic() > deadline:
            raise RuntimeError("the warm process reported no child CPU")
        time.sleep(0.01)


ROWS = ("python -c pass", "cold serve", "warm stub")
Figures = dict[str, list[float]]


def _rounds(runs: int, commands: dict[str, list[str]], cpu_log: Path) -> tuple[Figures, Figures, Figures]:
    """`initialize` and `tools/list` ms and CPU ms of each row, interleaved; a first round unmeasured (caches)."""
    init: Figures = {r: [] for r in ROWS}
    listed: Figures = {r: [] for r in ROWS}
    cpu: Figures = {r: [] for r in ROWS}
    for round_no in range(runs + 1):
        for row in ROWS if round_no % 2 else tuple(reversed(ROWS)):
            before = _children_cpu_ms()
            log_lines = len(cpu_log.read_text().splitlines()) if cpu_log.exists() else 0
            if row == "python -c pass":
                start = time.perf_counter_ns()
                subprocess.run([sys.executable, "-c", "pass"], check=True)
                first = second = (time.perf_counter_ns() - start) / 1e6
            else:
                first, second = serve_session(commands[row], REPO, _env())
            spent = _children_cpu_ms() - before
            if row == "warm stub":
                spent += _last_cpu(cpu_log, log_lines)
            if round_no:
                init[row].append(first)
                listed[row].append(second)
                cpu[row].append(spent)
    return init, listed, cpu


def _measure(runs: int) -> tuple[Figures, Figures, Figures, float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as scratch:
        root = Path(scratch)
        home = root / "home"
        subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(home), "--db", f"sqlite:///{home}/gateway.db", "init"],
            cwd=REPO, env=_env(), check=True, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        folder = root / "run"  # as $XDG_RUNTIME_DIR/mcp-gateway would be
        cpu_log = root / "cpu.log"
        started = time.perf_counter_ns()
        warm = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--warm", str(folder)],
            cwd=REPO, env={**_env(), "WARM_CPU_LOG": str(cpu_log)}, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while not (folder / "ready").exists() or not (folder / "ready").read_text().endswith("\n"):
                if warm.poll() is not None:
                    raise RuntimeError("the warm process ended before it was ready")
                time.sleep(0.005)
            warm_ready_ms = (time.perf_counter_ns() - started) / 1e6
            warm_cpu = float((folder / "ready").read_text())
            commands = {
                "cold serve": [sys.executable, "-m", "gateway", *_gateway_args(home)],
                "warm stub": [sys.executable, "-c", STUB, str(folder / SOCKET_NAME), *_gateway_args(home)],
            }
            return (*_rounds(runs, commands, cpu_log), warm_ready_ms, warm_cpu)
        finally:
            warm.send_signal(signal.SIGTERM)
            warm.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="samples of each row (default 15)")
    parser.add_argument("--warm", metavar="FOLDER", help=argparse.SUPPRESS)  # the warm process itself
    args = parser.parse_args()
    if args.warm:
        argv = _warm(Path(args.warm))
        if argv is None:
            return 0
        from gateway.cli import main as gateway_main  # noqa: PLC0415  (the forked child: imported already)

        sys.argv = ["mcp-gateway", *argv]
        return gateway_main(argv)
    try:
        init, listed, cpu, warm_ready_ms, warm_cpu = _measure(args.runs)
    except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
        print(f"warm_startup: {exc}", file=sys.stderr)
        return 1
    print(f"{args.runs} runs each, ms (Python {sys.version.split()[0]}; load {os.getloadavg()[0]:.2f} at the end)")
    print(f"{'row':<16}{'initialize':>12}{'p90':>9}{'tools/list':>12}{'p90':>9}{'cpu':>9}")
    for row in ROWS:
        a, b = sorted(init[row]), sorted(listed[row])
        p90 = min(len(a) - 1, int(0.9 * len(a)))
        print(
            f"{row:<16}{statistics.median(a):>12.1f}{a[p90]:>9.1f}{statistics.median(b):>12.1f}{b[p90]:>9.1f}"
            f"{statistics.median(cpu[row]):>9.1f}"
        )
    print(f"warm process ready after {warm_ready_ms:.1f} ms (once per user); its CPU to then {warm_cpu:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
