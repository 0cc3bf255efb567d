"""The PID namespace's supervisors and the IPC namespace (decisions 37, 38), each as the runner uses it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import psutil
import pytest

from sandbox import Limits, RunResult, run_sandboxed
from sandbox.backends import pidns
from sandbox.backends.identity import RunIdentity
from sandbox.limits import BACKENDS, Backend
from sandbox.runner import KilledBy
from tests.sandbox.confined_child import PYTHON, leased_identity, requires_root, shared_dir


def daemons(*spins: bool) -> str:
    """A command that starts one setsid daemon per entry (True: it spins; False: it sleeps, RLIMIT_CPU never fires),
    says "started" and sleeps on."""
    return f"""
import os, sys, time
for spin in {spins!r}:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while spin:
                pass
            time.sleep(600)
        os._exit(0)
    os.wait()
print("started", flush=True)
time.sleep(600)
"""


DAEMONS = daemons(False, True)
SLEEPING_DAEMON = daemons(False)
"""For the tests that wait out a watchdog's deadline: a spinner there would burn a core up to the deadline (3-5 s)
and prove nothing the sleeper does not. The namespace's end takes a running process as it takes a sleeping one (a
spinner's end is `test_daemons_die_with_the_run_and_its_end_comes_back_as_it_was`), and in a run RLIMIT_CPU (the
timeout plus one second) ends a spinner with a core of its own before the watchdog's deadline (the timeout plus its
grace): it is the limit, not the watchdog, that a spinner there would see."""


def limits(backend: Backend = "native", timeout_s: float = 20) -> Limits:
    return Limits(
        timeout_s=timeout_s,
        memory_limit_mb=256,
        max_processes=16,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin"},
        scratch_bytes=8 << 20,
        backend=backend,
    )


def run(folder: Path, code: str, limits: Limits) -> RunResult:
    scratch = folder / f"scratch-{time.monotonic_ns()}"
    scratch.mkdir()
    return anyio.run(
        lambda: run_sandboxed(
            [PYTHON, "-I", "-c", code], folder, limits, folder / "out", folder / "err", scratch=scratch
        )
    )


def processes_of(uid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info["uids"]
        if uids is not None and uid in uids and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def spawn_supervised(supervisor: pidns.RunSupervisor, who: RunIdentity) -> subprocess.Popen[bytes]:
    """SLEEPING_DAEMON under `supervisor`, dropped to `who`, in the order the runner's preexec_fn takes; its first
    line read."""

    def preexec() -> None:
        supervisor.enter()
        os.setgroups([])
        os.setresgid(who.gid, who.gid, who.gid)
        os.setresuid(who.uid, who.uid, who.uid)
        supervisor.fork()

    process = subprocess.Popen(
        [PYTHON, "-I", "-c", SLEEPING_DAEMON],
        preexec_fn=preexec,  # noqa: PLW1509  (pytest is single-threaded here)
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"started\n"
    assert len(processes_of(who.uid)) >= 4, "P, I, the command and its daemons run"
    return process


def none_left(uid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while processes_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return processes_of(uid) == []


@requires_root
def test_the_watchdog_ends_the_namespace_without_any_gateway() -> None:
    """Nobody kills anything here: pid 1 ends the run at its time limit plus the grace, daemons included."""
    status = os.memfd_create("status")
    with leased_identity() as who:
        supervisor = pidns.RunSupervisor(timeout_s=1, status_fd=status)
        started = time.monotonic()
        process = spawn_supervised(supervisor, who)
        with process.stdout or contextlib.nullcontext():
            process.wait(timeout=1 + pidns.WATCHDOG_GRACE_S + 5)
        elapsed = time.monotonic() - started
        assert 1 <= elapsed <= 1 + pidns.WATCHDOG_GRACE_S + 1.5
        assert pidns.read_status(os.pread(status, 64, 0)) == (None, signal.SIGKILL, True)
        assert none_left(who.uid, 2), "a daemon outlived pid 1"
    os.close(status)


@requires_root
def test_pid_1_without_a_deadline_ends_the_namespace_when_its_outer_supervisor_dies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server's pid 1 has no deadline (decision 83): P's pidfd alone must end it when P dies before pid 1 armed its
    parent-death signal. That race is made certain here: the children arm no parent-death signal at all."""
    monkeypatch.setattr(pidns, "_set_parent_death_signal", lambda: None)
    status = os.memfd_create("status")
    with leased_identity() as who:
        process = spawn_supervised(pidns.RunSupervisor(timeout_s=None, status_fd=status), who)
        with process.stdout or contextlib.nullcontext():
            process.kill()  # P alone: only the pidfd tells I
            process.wait(timeout=10)
        assert none_left(who.uid, 3), "pid 1 outlived P"
    os.close(status)


@requires_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_daemons_die_with_the_run_and_its_end_comes_back_as_it_was(backend: Backend) -> None:
    code = DAEMONS.replace('print("started", flush=True)\ntime.sleep(600)', "os.kill(os.getpid(), 11)")
    with shared_dir() as folder:
        result = run(folder, code, limits(backend))
    assert "pid_namespace" in result.layers
    assert result.killed_by is None
    # Natively pid 1 reports the command's own status; bubblewrap reports a signal N as 128+N.
    assert (result.exit_code, result.signal) == ((None, 11) if backend == "native" else (128 + 11, None))
    if backend == "native":  # (bwrap's outer process may report before its namespace is fully gone)
        assert result.survivors_killed == 0, "the daemons died with pid 1, before the cgroup kill looked"


@requires_root
def test_an_exit_code_passes_through_both_supervisors() -> None:
    with shared_dir() as folder:
        result = run(folder, "import sys; sys.exit(7)", limits())
    assert (result.exit_code, result.signal, result.killed_by) == (7, None, None)


@requires_root
def test_the_command_cannot_signal_its_pid_1() -> None:
    code = """
import json, os, signal, time
found = {}
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGKILL, signal.SIGSTOP):
    try:
        os.kill(1, sig)
        found[sig.name] = "sent"
    except OSError as exc:
        found[sig.name] = "refused:%d" % exc.errno
time.sleep(0.3)
found["ppid"] = os.getppid()
found["pid"] = os.getpid()
print(json.dumps(found))
"""
    with shared_dir() as folder:
        result = run(folder, code, limits())
        found = json.loads((folder / "out").read_text())
    assert result.exit_code == 0, "the command lived on: pid 1 ignored every signal it sent"
    assert (found["pid"], found["ppid"]) == (2, 1)


# SysV shared memory, a message queue, a semaphore set and a POSIX message queue, each owner-only.
IPC = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
IPC_CREAT, IPC_EXCL = 0o1000, 0o2000
key = int(sys.argv[1])
mode = sys.argv[2]
found = {}
if mode == "create":
    found["shm"] = libc.shmget(key, 1 << 20, IPC_CREAT | IPC_EXCL | 0o600)
    found["msg"] = libc.msgget(key, IPC_CREAT | IPC_EXCL | 0o600)
    found["sem"] = libc.semget(key, 1, IPC_CREAT | IPC_EXCL | 0o600)
    found["mq"] = rt.mq_open(b"/mcp-test-%d" % key, os.O_CREAT | os.O_RDWR, 0o600, None)
else:
    found["shm"] = libc.shmget(key, 0, 0)
    found["msg"] = libc.msgget(key, 0)
    found["sem"] = libc.semget(key, 0, 0)
    found["mq"] = rt.mq_open(b"/mcp-test-%d" % key, os.O_RDONLY, 0, None)
print(json.dumps(found))
"""


def sysv_keys() -> set[int]:
    keys = set()
    for kind in ("shm", "msg", "sem"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            keys.add(int(line.split()[0]))
    return keys


@requires_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_ipc_objects_die_with_the_run_and_no_later_run_sees_them(backend: Backend) -> None:
    key = 0x4D43_0000 + os.getpid() % 0xFFFF
    with shared_dir() as folder:
        first = run(folder, IPC.replace("sys.argv[1]", str(key)).replace("sys.argv[2]", "'create'"), limits(backend))
        created = json.loads((folder / "out").read_text())
        (folder / "out").unlink()
        (folder / "err").unlink()
        # Natively Landlock refuses POSIX message queues outright (their files are outside every grant).
        mq_refused = backend == "native"
        assert first.exit_code == 0, created
        assert {name: value >= 0 for name, value in created.items()} == {
            "shm": True, "msg": True, "sem": True, "mq": not mq_refused
        }, created  # fmt: skip
        assert "ipc_namespace" in first.layers
        assert key not in sysv_keys(), "a SysV object outlived its run on the host"
        assert not Path(f"/dev/mqueue/mcp-test-{key}").exists()
        second = run(folder, IPC.replace("sys.argv[1]", str(key)).replace("sys.argv[2]", "'open'"), limits(backend))
        reopened = json.loads((folder / "out").read_text())
    assert second.exit_code == 0
    assert reopened == {"shm": -1, "msg": -1, "sem": -1, "mq": -1}, "a later run reached an earlier run's object"


def marked(marker: str) -> list[int]:
    """Live processes whose command line carries `marker` (the run's, never another's)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


@requires_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_watchdog_ends_a_run_whose_gateway_is_stuck(backend: Backend) -> None:
    """The gateway's event loop blocks (a database lock, say): its timer cannot fire, the watchdog's does."""
    marker = f"mcp-stuck-{os.getpid()}-{backend}"
    code = f"# {marker}\n" + SLEEPING_DAEMON
    seen: dict[str, object] = {}

    async def main(folder: Path) -> RunResult:
        scratch = folder / "scratch"
        scratch.mkdir()
        # Long enough for the daemons to be up before the limit on a loaded machine (a parallel suite):
        # started after it, they would never show, and the test would see nothing to end.
        timeout_s = 3
        run_limits = limits(backend, timeout_s=timeout_s)
        async with anyio.create_task_group() as group:

            async def run_it() -> None:
                seen["result"] = await run_sandboxed(
                    [PYTHON, "-I", "-c", code], folder, run_limits, folder / "out", folder / "err", scratch=scratch
                )

            began = time.monotonic()  # the watchdog starts later than this: it cannot end the run before
            group.start_soon(run_it)
            with anyio.fail_after(10):
                while len(marked(marker)) < 2:  # the command and its daemon
                    await anyio.sleep(0.05)
            # The point: the loop is stuck (blocking sleeps, never an await) from here on, for as long as before
            # at most; it looks for the run's processes only once the watchdog's deadline can have passed.
            stuck_until = time.monotonic() + timeout_s + pidns.WATCHDOG_GRACE_S + 1
            time.sleep(max(0.0, began + timeout_s + pidns.WATCHDOG_GRACE_S - time.monotonic()))
            while marked(marker) and time.monotonic() < stuck_until:
                time.sleep(0.05)
            seen["alive"] = marked(marker)
        result = seen["result"]
        assert isinstance(result, RunResult)
        return result

    with shared_dir() as folder:
        result = anyio.run(main, folder)
    assert seen["alive"] == [], "the run outlived its time limit while the gateway was stuck"
    assert result.killed_by is KilledBy.TIMEOUT


def ended_child_pending(others: set[int]) -> bool:
    """Whether a child of this process that is not in `others` is still running (a zombie has ended)."""
    running = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.pid not in others and child.status() != psutil.STATUS_ZOMBIE:
                running.append(child.pid)
    return bool(running)


@requires_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_that_ended_by_itself_past_its_limit_while_the_gateway_was_stuck_is_a_timeout(backend: Backend) -> None:
    """The command exits on its own after the limit, before the watchdog; nobody killed it: a timeout (decision 49)."""
    seen: dict[str, RunResult] = {}

    async def main(folder: Path) -> None:
        scratch = folder / "scratch"
        scratch.mkdir()
        # The command ends at a time set here, 1.5 s on: past the 1 s limit, 1.5 s before the watchdog's kill,
        # however long its interpreter took to start on a busy machine.
        ends_at = time.time() + 1.5
        async with anyio.create_task_group() as group:

            async def run_it() -> None:
                seen["result"] = await run_sandboxed(
                    [PYTHON, "-I", "-c", f"import time; time.sleep(max(0.0, {ends_at!r} - time.time()))"],
                    folder,
                    limits(backend, timeout_s=1),
                    folder / "out",
                    folder / "err",
                    scratch=scratch,
                )

            others = {child.pid for child in psutil.Process().children()}
            group.start_soon(run_it)
            await anyio.sleep(0.2)
            # The loop is stuck (blocking sleeps, never an await) past the limit, 2.2 s at most, while the
            # command ends by itself; it stays stuck until the run's outer supervisor, this process's child,
            # has exited too (a zombie nobody reaped yet), so the gateway finds the run ended on its own.
            stuck_until = time.monotonic() + 2.2
            time.sleep(max(0.0, ends_at - time.time()))  # the command's own sleep: nothing can end before
            while ended_child_pending(others) and time.monotonic() < stuck_until:
                time.sleep(0.05)

    with shared_dir() as folder:
        anyio.run(main, folder)
    result = seen["result"]
    assert result.exit_code == 0 and result.duration_ms > 1000
    assert result.killed_by is KilledBy.TIMEOUT


_HOOK_FD: list[int] = []


def _count_fork_hook() -> None:
    if _HOOK_FD:
        os.write(_HOOK_FD[0], b"x")


os.register_at_fork(after_in_child=_count_fork_hook)


@requires_root
def test_the_supervisors_fork_without_the_gateways_fork_hooks() -> None:
    """The spawn's own fork runs CPython's fork hooks once, in `P`; `I` and the command are forked by libc's fork
    alone, which skips them and their cost (decision 95), and the command still runs and reports its status."""
    read_end, write_end = os.pipe()
    status = os.memfd_create("status")
    supervisor = pidns.RunSupervisor(timeout_s=10, status_fd=status)

    def preexec() -> None:
        supervisor.enter()
        supervisor.fork()

    _HOOK_FD.append(write_end)
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", "exit 7"],
            preexec_fn=preexec,  # noqa: PLW1509  (pytest is single-threaded here)
            start_new_session=True,
            pass_fds=(write_end,),
        )
        assert process.wait(timeout=10) == 7
    finally:
        _HOOK_FD.clear()
        os.close(write_end)
    with os.fdopen(read_end, "rb") as hooks:
        assert hooks.read() == b"x", "the hooks ran in P only"
    assert pidns.read_status(os.pread(status, 64, 0)) == (7, None, False)
    os.close(status)
