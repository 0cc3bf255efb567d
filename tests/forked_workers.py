"""`--forks N`: the suite's tests run in N worker processes forked from the one that collected them (a pytest plugin, tests/conftest.py).

pytest-xdist starts each worker as a fresh interpreter, which imports pytest, the conftests and the MCP SDK
and collects every test again (about 2.3 s of CPU a worker for the unit tier). Here the pytest process
collects once, with the garbage collector's heap frozen after it (tests/conftest.py, `pytest_collection`),
and forks N workers that share that heap copy-on-write and start on their first test at once (decision 105).

What each part does:

- *The parent* (the pytest process the user started) runs no test. It cuts the collected tests into units
  (tests/conftest.py, `serial_group`: a serial group whole and in order, a cell of a matrix, else a test
  alone), the larger units first, then in collection order (`slow_first` put the slowest modules first), as
  pytest-xdist's load-by-scope scheduler does. It hands a worker its next unit when the worker asks, and logs
  every report a worker sends through the normal hooks (`pytest_runtest_logstart`, `_logreport`,
  `_logfinish`, `pytest_warning_recorded`): the terminal, `-ra`, the exit status, `-x`/`--maxfail`, the
  leftover check (tests/leftover_processes.py) and `--cpu-costs` (tests/cpu_costs.py) see the run as they
  see one process's or pytest-xdist's.
- *A worker* is marked as one to the project's plugins as pytest-xdist's are (`config.workerinput`,
  `config.workeroutput`): the PostgreSQL cluster and the run token are the parent's. It runs its units with
  pytest's own `pytest_runtest_protocol`, asking for the next unit as it is about to run the last test of
  its current one, so that each test's `nextitem` is the one that really follows (module fixtures torn down
  where a single process would). It prints nothing: its terminal reporter is unregistered, and its output
  capture is a new one of its own (the parent's capture files are not shared). At its end it runs the
  session's finish, sends its `workeroutput`, unconfigures, runs its exit handlers (coverage's saves its
  data there) and leaves by `os._exit`, never back into the parent's code.
- *A worker that dies* (a signal, `os._exit` in a test, pytest-timeout's hard kill) fails the test it was
  running, with a report naming the signal or exit status; the tests of its unit it had not begun go back
  to the front of the queue, whole, for a new worker forked in its place (at most `4 * N` times in a run, as
  pytest-xdist's `--max-worker-restart`; after that they are reported as not run, failed). The run goes on.
- *Ctrl-C or SIGTERM of the parent*: each worker (a process group of its own, so a terminal's Ctrl-C reaches
  the parent alone) gets one SIGINT, tears its fixtures down as a single pytest process would, and ends;
  the parent logs what they report, waits for them (`STOP_S`, then SIGKILL) and ends as pytest does when
  interrupted: the leftover check still runs.

The fork is refused (a usage error saying why) while another thread runs, a socket is open, or the parent
made a database template, an admin connection or a fork helper (`_check_forkable`): a thread is gone in the
child with whatever lock it held (the PostgreSQL start's thread is joined first, tests/pg_cluster.py), a
socket, event loop or database engine would be shared by every worker, and a template deleted by the first
worker to end. Per-process state a fork copies: pg_cluster's cluster (stopped and deleted only by the parent:
a worker forgets it, `_forget_parents_state`), the templates, admin connections and fork helper a worker makes
on first use (its own: tests/pg_cluster.py, tests/sqlite_template.py, tests/forked_gateway.py), `random`'s
state (reseeded by Python at each fork), pytest's base temporary folder (made by the parent before the fork,
so a worker does not empty it), the exit handlers (logging's, weakref's finalizers, coverage's: a worker runs
them, as a process ending normally would).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from _pytest.junitxml import LogXML

from tests import forked_gateway, pg_cluster, sqlite_template
from tests.conftest import serial_group
from tests.deadlines import scaled

OPTION = "--forks"
STOP_S = 30.0
"""How long the interrupted parent waits for each worker to tear its fixtures down (TEST_TIME_SCALE times it)."""
_HEADER = struct.Struct("!I")


def pytest_addoption(parser: pytest.Parser) -> None:
    help_text = "run the tests in N workers forked after one collection (tests/forked_workers.py); 0: off"
    parser.getgroup("forked workers").addoption(OPTION, dest="forks", type=int, default=0, metavar="N", help=help_text)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(_Hooks)


class _Hooks:
    @pytest.hookspec
    def pytest_forked_worker_down(self, config: pytest.Config, workeroutput: dict[str, Any]) -> None:
        """A forked worker ended its session and sent its `config.workeroutput` (as pytest-xdist's
        `pytest_testnodedown` gives the controller a worker's)."""


def forks(config: pytest.Config) -> int:
    """The number of forked workers this run asked for (0: none, or inside a worker)."""
    if hasattr(config, "workerinput"):
        return 0
    return int(config.getoption(OPTION, 0) or 0)


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config: pytest.Config) -> None:
    count = forks(config)
    if count < 0:
        raise pytest.UsageError(f"{OPTION}={count}: give a number of workers, or 0 for none")
    if count and (config.getoption("numprocesses", None) or config.getoption("dist", "no") != "no"):
        raise pytest.UsageError(f"{OPTION} and pytest-xdist's -n/--dist spread the same tests: give one of them")
    if count and config.getoption("usepdb", False):
        raise pytest.UsageError(f"--pdb needs the terminal in the test's own process: run it with {OPTION}=0")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if count and reporter is not None:
        reporter.showfspath = False  # tests of many modules arrive interleaved: a dot each, as pytest-xdist shows


# -- the wire: length-prefixed pickles over a socketpair (both ends are this suite's own processes) --------


def _send(sock: socket.socket, message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(sock: socket.socket) -> tuple[Any, ...] | None:
    """One whole message, blocking; None at the end of the stream."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, _HEADER.unpack(header)[0])
    if body is None:
        return None
    message: tuple[Any, ...] = pickle.loads(body)  # noqa: S301  # written by this suite's own parent
    return message


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


# -- the units of work ------------------------------------------------------------------------------------


def units(items: list[pytest.Item]) -> list[list[int]]:
    """The collected tests' indexes cut into `serial_group`'s units, the larger units first, then in
    collection order (pytest-xdist's load-by-scope order)."""
    grouped: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        grouped.setdefault(serial_group(item.nodeid), []).append(index)
    return sorted(grouped.values(), key=len, reverse=True)


# -- the parent ---------------------------------------------------------------------------------------------


@dataclass
class _Worker:
    number: int
    pid: int
    sock: socket.socket
    pidfd: int
    sent: deque[int] = field(default_factory=deque)
    """The indexes handed to it and not yet finished (`pytest_runtest_logfinish`), in order."""
    running: int | None = None
    """The index of the test it began (`logstart`) and has not finished."""
    phases: set[str] = field(default_factory=set)
    """The phases of `running` reported so far: a death after its call is its teardown's."""
    buffer: bytearray = field(default_factory=bytearray)
    done: bool = False
    """It sent its `workeroutput`: it ended its session."""

    @property
    def name(self) -> str:
        return f"forked worker {self.number} (pid {self.pid})"


class _Interrupted(Exception):
    """The parent got SIGTERM: handled as Ctrl-C is."""


def _other_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread is not threading.current_thread()]


def _open_sockets() -> list[int]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.append(int(name))
    return found


def _check_forkable() -> None:
    """Refuse to fork where a worker would inherit a lock held by a thread that is gone, or a socket it shares."""
    pg_cluster._join_start()
    threads = _other_threads()
    if threads:
        raise pytest.UsageError(
            f"{OPTION}: threads {threads} run in the pytest process before the fork; a forked worker would "
            f"inherit the locks they hold. Stop them at collection's end, or run with {OPTION}=0"
        )
    made = [
        name
        for name, state in (
            ("a PostgreSQL template (tests/pg_cluster.py)", pg_cluster._templates),
            ("a PostgreSQL admin connection (tests/pg_cluster.py)", pg_cluster._admins),
            ("a SQLite template (tests/sqlite_template.py)", sqlite_template._template),
            ("a gateway fork helper (tests/forked_gateway.py)", forked_gateway._helpers),
        )
        if state
    ]
    if made:  # each worker would use, and at its end delete or stop, the parent's own
        raise pytest.UsageError(
            f"{OPTION}: the pytest process made {', '.join(made)} before the fork: make it in a fixture"
        )
    sockets = _open_sockets()
    if sockets:
        raise pytest.UsageError(
            f"{OPTION}: sockets are open in the pytest process before the fork (fds {sockets}: an engine, an "
            f"event loop, a connection made at import or collection); every worker would share them. Open "
            f"them in a fixture instead, or run with {OPTION}=0"
        )


class _Parent:
    def __init__(self, session: pytest.Session, count: int) -> None:
        self.session = session
        self.config = session.config
        self.items = session.items
        self.queue: deque[list[int]] = deque(units(self.items))
        self.count = min(count, len(self.queue))
        self.restarts = 4 * count
        self.restarts_left = self.restarts
        self.workers: dict[int, _Worker] = {}
        self.selector = selectors.DefaultSelector()
        self.numbers = iter(range(1, 1 << 30))
        self.errors: list[str] = []
        self.stopping = False
        """Interrupted: no worker is forked any more, in place of one that ends."""

    def run(self) -> None:
        _check_forkable()
        self.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]  # made once, here: see the docstring
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            for _ in range(self.count):
                self.spawn()
            while self.workers:
                self.step()
        except (KeyboardInterrupt, _Interrupted):
            self.interrupt()
            raise KeyboardInterrupt from None
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.selector.close()
        if self.errors:
            self.report_errors()

    def spawn(self) -> None:
        number = next(self.numbers)
        ours, theirs = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            self.forget_in_worker(ours)
            _worker_main(self.session, theirs, number, self.count)
        theirs.close()
        worker = _Worker(number, pid, ours, os.pidfd_open(pid))
        self.workers[pid] = worker
        self.selector.register(ours, selectors.EVENT_READ, ("socket", worker))
        self.selector.register(worker.pidfd, selectors.EVENT_READ, ("exit", worker))

    def forget_in_worker(self, ours: socket.socket) -> None:
        """In a new worker: close the parent's ends (its selector, the other workers' sockets and pidfds)."""
        ours.close()
        self.selector.close()
        for worker in self.workers.values():
            worker.sock.close()
            os.close(worker.pidfd)

    def step(self) -> None:
        for key, _ in self.selector.select():
            kind, worker = key.data
            if worker.pid not in self.workers:
                continue  # ended in this same round
            if kind == "socket":
                self.read(worker)
            else:
                self.ended(worker)

    def read(self, worker: _Worker) -> bool:
        """Handle what `worker` sent; False when nothing more is there now (the stream's end, or a process of one of
        its tests that inherited its socket holding it open)."""
        try:
            chunk = worker.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        worker.buffer += chunk
        while len(worker.buffer) >= _HEADER.size:
            size = _HEADER.unpack_from(worker.buffer)[0]
            if len(worker.buffer) < _HEADER.size + size:
                break
            body = bytes(worker.buffer[_HEADER.size : _HEADER.size + size])
            del worker.buffer[: _HEADER.size + size]
            self.handle(worker, pickle.loads(body))  # noqa: S301  # written by this suite's own worker
        if not chunk:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(worker.sock)
            return False
        return True

    def handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        hook = self.config.hook
        if kind == "next":
            unit = self.next_unit()
            worker.sent.extend(unit)
            with contextlib.suppress(OSError):  # a worker that died meanwhile: `ended` requeues it
                _send(worker.sock, ("unit", unit))
        elif kind == "logstart":
            worker.running = message[1]
            worker.phases.clear()
            item = self.items[message[1]]
            hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        elif kind == "report":
            report = hook.pytest_report_from_serializable(config=self.config, data=message[1])
            worker.phases.add(report.when)
            hook.pytest_runtest_logreport(report=report)
        elif kind == "logfinish":
            item = self.items[message[1]]
            hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            worker.running = None
            with contextlib.suppress(ValueError):
                worker.sent.remove(message[1])
        elif kind == "warning":
            self.warning(message[1:])
        elif kind == "done":
            worker.done = True
            hook.pytest_forked_worker_down(config=self.config, workeroutput=message[1])

    def next_unit(self) -> list[int]:
        """The next unit for a worker that asks, or none once the queue is empty or the run stops (-x)."""
        if self.session.shouldfail or self.session.shouldstop or not self.queue:
            return []
        return self.queue.popleft()

    def warning(self, fields: tuple[Any, ...]) -> None:
        """Record a warning a worker sent (`_WorkerSide.pytest_warning_recorded`) as pytest's own."""
        text, category, filename, lineno, when, nodeid = fields
        module, _, name = category.rpartition(".")
        try:
            kind = getattr(importlib.import_module(module or "builtins"), name)
        except (ImportError, AttributeError):
            kind = UserWarning
        message = warnings.WarningMessage(kind(text), kind, filename, lineno)
        self.config.hook.pytest_warning_recorded.call_historic(
            kwargs={"warning_message": message, "when": when, "nodeid": nodeid, "location": None}
        )

    def ended(self, worker: _Worker) -> None:
        """`worker`'s process ended: what it sent last is logged; a death mid-unit fails its test, requeues the rest."""
        while self.read(worker):
            pass
        _, status = os.waitpid(worker.pid, 0)
        for fileobj in (worker.pidfd, worker.sock):  # its socket may still be open: a test's child holds it
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fileobj)
        os.close(worker.pidfd)
        worker.sock.close()
        del self.workers[worker.pid]
        how = _how_it_ended(status)
        if worker.done and status == 0:
            return
        if worker.running is not None:
            phase: Literal["call", "teardown"] = "teardown" if "call" in worker.phases else "call"
            self.fail(worker.running, f"{worker.name} {how} while running this test", phase, started=True)
            with contextlib.suppress(ValueError):
                worker.sent.remove(worker.running)
        elif worker.done:
            self.errors.append(f"{worker.name} {how} after its last test")
        else:
            self.errors.append(f"{worker.name} {how} between tests")
        rest = list(worker.sent)
        if rest:
            self.queue.appendleft(rest)
        if self.stopping or self.session.shouldfail or self.session.shouldstop or not self.queue:
            return
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self.spawn()
        elif not self.workers:
            while self.queue:
                for index in self.queue.popleft():
                    self.fail(index, f"not run: {self.restarts} forked workers died in this run", "call", started=False)

    def fail(self, index: int, why: str, phase: Literal["call", "teardown"], *, started: bool) -> None:
        """Log a failed report of `phase` of the test at `index` (its worker died), as a run of it would have;
        `started`: its `logstart` was logged already."""
        item = self.items[index]
        hook = self.config.hook
        if not started:
            hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        now = time.time()
        report = pytest.TestReport(
            item.nodeid,
            item.location,
            dict.fromkeys(item.keywords, 1),
            "failed",
            why,
            phase,
            start=now,
            stop=now,
        )
        hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)

    def report_errors(self) -> None:
        self.session.testsfailed += len(self.errors)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for error in self.errors:
            if reporter is not None:
                reporter.write_line(f"{OPTION}: {error}", red=True)
            else:
                print(f"{OPTION}: {error}", file=sys.stderr)

    def interrupt(self) -> None:
        """Ctrl-C or SIGTERM: one SIGINT to each worker, whose reports are logged until it ends (`STOP_S`)."""
        self.stopping = True
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        self.queue.clear()
        deadline = time.monotonic() + scaled(STOP_S)
        while self.workers and time.monotonic() < deadline:
            with contextlib.suppress(KeyboardInterrupt, _Interrupted):
                for key, _ in self.selector.select(max(0.0, deadline - time.monotonic())):
                    kind, worker = key.data
                    if worker.pid in self.workers:
                        (self.read if kind == "socket" else self.ended)(worker)
        for worker in list(self.workers.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
            self.ended(worker)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted


def _how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"was killed by {name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    count = forks(session.config)
    if not count:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(
            f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection"
        )
    if session.config.option.collectonly or not session.items:
        return True
    _Parent(session, count).run()
    if session.shouldfail:
        raise session.Failed(session.shouldfail)
    if session.shouldstop:
        raise session.Interrupted(session.shouldstop)
    return True


# -- a worker ---------------------------------------------------------------------------------------------


class _WorkerSide:
    """A worker's hooks: everything pytest logs goes to the parent, the test by its index in the collection."""

    def __init__(self, config: pytest.Config, sock: socket.socket) -> None:
        self.config = config
        self.sock = sock
        self.current = -1
        """The index of the test `_work` is running."""

    def pytest_runtest_logstart(self) -> None:
        _send(self.sock, ("logstart", self.current))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        _send(self.sock, ("report", data))

    def pytest_runtest_logfinish(self) -> None:
        _send(self.sock, ("logfinish", self.current))

    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage, when: str, nodeid: str) -> None:
        category = warning_message.category
        _send(
            self.sock,
            (
                "warning",
                str(warning_message.message),
                f"{category.__module__}.{category.__qualname__}",
                warning_message.filename,
                warning_message.lineno,
                when,
                nodeid,
            ),
        )


def _forget_parents_state() -> None:
    """What a worker must not do with the parent's state it copied (see the module's docstring)."""
    pg_cluster._started.clear()  # the parent stops and deletes the cluster
    pg_cluster._outcome_folders.clear()
    pg_cluster._starting.clear()  # joined before the fork (`_check_forkable`)


class _WriterOnly:
    """A worker's stand-in for the terminal reporter: its hooks gone (the parent reports), its writer kept for
    the few that write on their own as a process ends (pytest-timeout's stack dump before its hard kill)."""

    def __init__(self, writer: object) -> None:
        self._tw = writer


def _quiet(config: pytest.Config) -> None:
    """The worker prints nothing: no terminal reporter, no JUnit XML of its own, a capture of its own."""
    manager = config.pluginmanager
    reporter = manager.get_plugin("terminalreporter")
    if reporter is not None:
        manager.unregister(reporter)
        manager.register(_WriterOnly(reporter._tw), "terminalreporter")
    for plugin in manager.get_plugins():
        if isinstance(plugin, LogXML):
            manager.unregister(plugin)
    capture = manager.get_plugin("capturemanager")
    if capture is not None and capture._global_capturing is not None:
        # The parent's capture files are shared by every fork (one file offset): each worker makes its own.
        inherited, capture._global_capturing = capture._global_capturing, None
        inherited.stop_capturing()
        capture.start_global_capturing()
        capture.suspend_global_capture()


def _worker_main(session: pytest.Session, sock: socket.socket, number: int, count: int) -> None:
    """A worker's life: its own process group, its units (`_work`), its exit handlers, `os._exit`."""
    status = 1
    try:
        os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the parent, which passes it on once
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # The parent's SIGINT is its request to stop, whatever the run was started with: a background job of a
        # shell without job control (`cmd &` in a script, a CI step) starts with SIGINT ignored, and a worker
        # that ignored it was killed after `STOP_S` without tearing its fixtures down.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        config = session.config
        config.workerinput = {"workerid": f"fork{number}", "workercount": count}  # type: ignore[attr-defined]
        config.workeroutput = {}  # type: ignore[attr-defined]
        _forget_parents_state()
        _quiet(config)
        side = _WorkerSide(config, sock)
        config.pluginmanager.register(side, "forked_worker_side")
        status = _work(session, sock, side)
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
    except BaseException:  # a worker never returns into the parent's code
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(status)


def _work(session: pytest.Session, sock: socket.socket, side: _WorkerSide) -> int:
    """Run the units the parent hands out, then end the session; the exit status (0: it ended as it should)."""
    items = session.items
    queue: deque[int] = deque()

    def ask() -> None:
        _send(sock, ("next",))
        answer = _receive(sock)
        if answer is None:
            raise SystemExit(1)  # the parent is gone
        queue.extend(answer[1])

    exitstatus: int | pytest.ExitCode = pytest.ExitCode.OK
    try:
        ask()
        while queue:
            index = queue.popleft()
            if not queue and not (session.shouldfail or session.shouldstop):
                ask()
            nextitem = items[queue[0]] if queue else None
            side.current = index
            items[index].config.hook.pytest_runtest_protocol(item=items[index], nextitem=nextitem)
            if session.shouldfail or session.shouldstop:
                break
    except KeyboardInterrupt:
        exitstatus = pytest.ExitCode.INTERRUPTED
    setup_state = session._setupstate
    with contextlib.suppress(Exception, KeyboardInterrupt):
        setup_state.teardown_exact(None)
    session.exitstatus = exitstatus
    session.config.hook.pytest_sessionfinish(session=session, exitstatus=exitstatus)
    _send(sock, ("done", session.config.workeroutput))  # type: ignore[attr-defined]
    session.config._ensure_unconfigure()
    return 0
