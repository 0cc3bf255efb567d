"""A run's supervisors: a PID namespace for native runs, and a watchdog that needs no gateway on both backends (decision 38).

Without it, a run whose gateway is SIGKILLed lives on: a `setsid` daemon leaves the process
group, the uid sweep and the cgroup kill are the gateway's own acts, and RLIMIT_CPU does not
bound a process that sleeps. With it, the child the gateway spawned (`P`, outside the
namespace) forks the namespace's pid 1 (`I`), which forks the command (`C`, pid 2):

    gateway ──(PDEATHSIG SIGKILL)── P ──(PDEATHSIG SIGKILL)── I = pid 1 ── C = pid 2 ── ...

- when pid 1 exits, for any reason, the kernel kills every process of the namespace, daemons
  and `setsid` escapees included: nothing a run starts outlives it;
- `I` is the watchdog: it exits at the run's time limit plus `WATCHDOG_GRACE_S`, whatever the
  gateway does (stopped, stalled on a database lock), and as soon as `P` is dead, which it
  sees through `P`'s pidfd even if `P` died before `I`'s parent-death signal was armed; a
  long-lived server (sandbox/server.py) has no time limit, and `P`'s death alone ends it;
- the gateway's death kills `P` (parent-death signal), `P`'s death kills `I`, and so the run,
  at once; the next gateway to start finds nothing alive, closes the run's record and removes
  its scratch folder (gateway/recovery.py, sandbox/leftovers.py);
- `I` reaps orphans (a namespace's pid 1 must), and passes the command's own wait status to
  the gateway through the status memfd, so an exit code or a signal comes back as it was.

Every layer is applied in `P` before the forks (the namespace is entered by `unshare` as root,
before the uid drop), so `P` and `I` are as confined as the command: the run's uid, cgroup,
Landlock domain and seccomp filter. `P` and `I` close every descriptor they inherited (the
gateway's database, lock files, the exec-error pipe) and never exec; the command cannot see
`P` (outside its namespace) and cannot signal `I` (the kernel drops signals a namespace's pid 1
has no handler for, and `I` blocks every catchable one).

With bubblewrap, which makes its own PID namespace and kills it when bwrap dies
(`--die-with-parent`), there is no `I`: `P` is the watchdog and the command is bwrap, which gets
a parent-death signal to `P` before its exec (kept across the exec of a non-setuid program).

The supervisors count as processes of the run: RLIMIT_NPROC and the pids cgroup are raised by
`limits.SUPERVISOR_PROCESSES` (natively `P` and `I`; with bubblewrap `P`, bwrap and its pid 1).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from sandbox.backends.namespaces import CLONE_NEWPID, unshare
from sandbox.backends.probe import child_succeeds

WATCHDOG_GRACE_S = 2.0

_PR_SET_PDEATHSIG = 1
_REAP_EVERY_S = 0.5
_STATUS = struct.Struct("=ii")
_EXITED, _SIGNALED, _WATCHDOG = 1, 2, 3
_ORPHANED = 125  # `P` or `I` found its parent already gone: nothing ran

# Resolved in the parent at import so the child only makes the call (preexec_fn must not load libraries).
_prctl = ctypes.CDLL(None, use_errno=True).prctl
_prctl.restype = ctypes.c_int
# libc's fork(2) itself, the GIL held through it (PyDLL), for the supervisors' two forks (decision 95).
_fork = ctypes.PyDLL(None, use_errno=True).fork
_fork.argtypes = []
_fork.restype = ctypes.c_int


def pid_namespace_available(before: Callable[[], None] | None = None) -> bool:
    """Whether a child here can make a PID namespace and run a command as its pid 1's child.

    `before`: the step a run takes first (entering its user namespace, when rootless)."""
    supervisor = RunSupervisor(timeout_s=10, status_fd=-1)

    def enter_and_fork() -> None:
        if before is not None:
            before()
        supervisor.enter()
        supervisor.fork()

    return child_succeeds(("/bin/true",), enter_and_fork)


class RunSupervisor:
    """The child-side steps: `enter` (as root, early) and `fork` (last); prepared in the parent.

    With `namespace=False` (the bubblewrap backend, whose bwrap makes its own PID namespace and
    dies with its parent) there is no `I`: `P` itself is the watchdog, and at the deadline it
    kills the command, bwrap, whose namespace goes with it.
    """

    def __init__(self, *, timeout_s: float | None, status_fd: int, namespace: bool = True) -> None:
        """`timeout_s` None: no deadline (a long-lived server, sandbox/server.py): the gateway's death alone ends it."""
        self._deadline_s = math.inf if timeout_s is None else timeout_s + WATCHDOG_GRACE_S
        self._status_fd = status_fd
        self._namespace = namespace
        self._gateway_pid = os.getpid()
        self._catchable = frozenset(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})

    def enter(self) -> None:
        """Make the next child the pid 1 of a new PID namespace (needs CAP_SYS_ADMIN: before the uid drop)."""
        if self._namespace:
            unshare(CLONE_NEWPID)

    def fork(self) -> None:
        """Split into the supervisors (which never return) and the command, which returns to exec."""
        _arm_parent_death(self._gateway_pid)
        start = time.monotonic()
        saved = signal.pthread_sigmask(signal.SIG_BLOCK, self._catchable)
        supervisor = os.getpid()
        # P's own pidfd, for I: it turns readable when P dies, so P's death is seen even when it came
        # before I armed its parent-death signal (I is pid 1 of its namespace: getppid() tells it nothing).
        own = os.pidfd_open(supervisor) if self._namespace else -1
        child = _plain_fork()
        if child and not self._namespace:
            self._watch(child, start)  # P, watchdog of bwrap
        if child:
            self._mirror(child)  # P, outside the namespace
        if self._namespace:
            _set_parent_death_signal()
            command = _plain_fork()
            if command:
                self._watch(command, start, parent=own)  # I, pid 1
            os.close(own)
        else:
            # bwrap keeps this signal across its exec: P's death ends it, even before its own --die-with-parent.
            _arm_parent_death(supervisor)
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)
        # The command: back to preexec_fn's caller, which execs it.

    def _mirror(self, init: int) -> None:
        """P: wait for pid 1 and end as it ended (it can only die by SIGKILL: it blocks every other signal)."""
        _close_all_but(())
        _, status = os.waitpid(init, 0)
        if os.WIFSIGNALED(status):
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)

    def _watch(self, command: int, start: float, *, parent: int = -1) -> None:
        """Wait for the command, reaping every child; at the deadline, or when `parent` (P's pidfd) shows P
        dead, end it (as pid 1: end the namespace)."""
        _close_all_but((self._status_fd, parent))
        try:
            watched = os.pidfd_open(command)
        except OSError:
            os._exit(_ORPHANED)
        waited = [watched] if parent < 0 else [watched, parent]
        while True:
            remaining = start + self._deadline_s - time.monotonic()
            if remaining <= 0:
                self._report(_WATCHDOG, 0)
                os.kill(command, signal.SIGKILL)  # pid 1's exit would do it too; bwrap's needs it
                os.kill(os.getpid(), signal.SIGKILL)  # as pid 1 ignored: then the exit ends the namespace
                os._exit(_ORPHANED)
            ready, _, _ = select.select(waited, [], [], min(remaining, _REAP_EVERY_S))
            if parent in ready:
                os._exit(_ORPHANED)  # P is dead (the gateway's death took it): pid 1's exit ends the namespace
            status = _reap(command)
            if status is not None:
                if os.WIFSIGNALED(status):
                    self._report(_SIGNALED, os.WTERMSIG(status))
                    if os.WTERMSIG(status) == signal.SIGKILL:
                        os.kill(os.getpid(), signal.SIGKILL)
                    os._exit(128 + os.WTERMSIG(status))
                code = os.waitstatus_to_exitcode(status)
                self._report(_EXITED, code)
                os._exit(code & 0xFF)

    def _report(self, kind: int, value: int) -> None:
        if self._status_fd >= 0:
            with contextlib.suppress(OSError):
                os.pwrite(self._status_fd, _STATUS.pack(kind, value), 0)


def read_status(data: bytes) -> tuple[int | None, int | None, bool] | None:
    """(exit_code, signal, watchdog_fired) from what pid 1 wrote; None when it wrote nothing."""
    if len(data) < _STATUS.size:
        return None
    kind, value = _STATUS.unpack_from(data)
    if kind == _EXITED:
        return value, None, False
    if kind == _SIGNALED:
        return None, value, False
    if kind == _WATCHDOG:
        return None, signal.SIGKILL, True
    return None


def _reap(command: int) -> int | None:
    """Reap every child that ended; the command's wait status if it was among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == command:
            found = status


def _plain_fork() -> int:
    """fork(2) without CPython's fork hooks: `os.fork` takes the import lock and runs every hook modules
    registered (`random` reseeds from 2.5 KB of getrandom, `threading` and `logging` rebuild their locks),
    about 0.5 ms a fork here and more in a gateway-sized process (decision 95). None of it matters in
    `P` and `I`: they are children of the spawn's own fork, which ran the hooks once, they have one
    thread, and they run only system calls until they exit or the command execs. Raises OSError as
    `os.fork` does."""
    pid = _fork()
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    if "coverage.control" in sys.modules:
        _measure(sys.modules["coverage.control"], child=pid == 0)
    return int(pid)


def _measure(control: Any, *, child: bool) -> None:
    """Under coverage (`make coverage`, pyproject.toml), what `os.fork` would have let it do, so the
    supervisors' lines are counted: the child measured as a process of its own (coverage's own fork
    hook), and in both what was measured saved as the process ends by `os._exit`, the supervisors' one
    way out but SIGKILL (as coverage's `_exit` patch). Without coverage `_plain_fork` only looks in
    `sys.modules` (it never imports it: a preexec_fn must not load modules)."""
    if control.Coverage.current() is None:
        return
    if child:
        control._after_fork_in_child()  # a new Coverage, its data file this process's
    if getattr(os._exit, "saves_coverage", False):
        return
    exit_now = os._exit

    def save_and_exit(status: int) -> NoReturn:
        with contextlib.suppress(Exception):  # as coverage's own patch: the exit comes whatever the save does
            control.Coverage.current().save()
        exit_now(status)

    save_and_exit.saves_coverage = True  # type: ignore[attr-defined]
    os._exit = save_and_exit


def _set_parent_death_signal() -> None:
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(_ORPHANED)


def _arm_parent_death(parent: int) -> None:
    """SIGKILL when the gateway dies; already gone (a race with its death): stop now, nothing ran."""
    _set_parent_death_signal()
    if os.getppid() != parent:
        os._exit(_ORPHANED)


def _close_all_but(keep: tuple[int, ...]) -> None:
    """A supervisor keeps nothing of the gateway's: its database, locks, the exec-error pipe."""
    low = 0
    for fd in sorted(fd for fd in keep if fd >= 0):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
