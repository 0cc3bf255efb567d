"""An outside review's sandbox findings (decisions 36, 37, 38), tried through the real gateway on both backends.

Each test states the promise, attacks it the way the review did and with variants of its own,
and judges from outside: the host's disk, the host's IPC tables, the host's process table and
the audit log, not what the hostile code says of itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import shutil
import signal
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sandbox import RUN_GRACE_S
from sandbox.backends.pidns import WATCHDOG_GRACE_S
from sandbox.guarantees import Guarantee
from sandbox.leftovers import ROOT_PREFIX, SCRATCH_PREFIX
from sandbox.limits import BACKENDS, Backend
from tests.adversarial.conftest import RUN_UIDS, Arena, answer_allow_once, open_arena
from tests.harness import GatewayHome, StdioSession

CAP = 1024 * 1024  # the arenas' max_output_bytes

# --- the output descriptors -------------------------------------------------------

GROW = r"""
import ctypes, mmap, os, stat
from _kit import attempt, capture_fd, report

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
GIB = 1 << 30

def fallocate(fd, mode, offset=0):
    if libc.fallocate(fd, mode, offset, GIB) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
    return "reserved"

def reopen(fd):
    # /proc/self/fd/N reopened for writing is a new description of the same object
    new = os.open("/proc/self/fd/%d" % fd, os.O_WRONLY)
    return fallocate(new, 0x01)

def test_grow_the_output_files():
    found = {}
    saved = capture_fd()
    for name, fd in (("saved_stdout", saved), ("saved_stdout_dup", os.dup(saved))):
        found[name + ":type"] = "fifo" if stat.S_ISFIFO(os.fstat(fd).st_mode) else "other"
        for how, action in (
            ("keep_size", lambda: fallocate(fd, 0x01)),
            ("plain", lambda: fallocate(fd, 0)),
            ("zero_range", lambda: fallocate(fd, 0x10 | 0x01)),
            ("far_offset", lambda: fallocate(fd, 0x01, 64 * GIB)),
            ("posix_fallocate", lambda: os.posix_fallocate(fd, 0, GIB)),
            ("ftruncate", lambda: os.ftruncate(fd, GIB)),
            ("pwrite_far", lambda: os.pwrite(fd, b"x", 4 * GIB)),
            ("mmap", lambda: mmap.mmap(fd, GIB, mmap.MAP_SHARED, mmap.PROT_WRITE)),
            ("reopen", lambda: reopen(fd)),
            ("readlink", lambda: os.readlink("/proc/self/fd/%d" % fd)),
        ):
            found[name + ":" + how] = attempt(action)
    report(**found)
"""


def allocated(folder: Path) -> int:
    """Bytes the host's disk holds for everything under `folder`: blocks, not sizes."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*"))


def test_the_output_descriptors_cannot_make_the_host_hold_more_than_the_cap(arena: Arena) -> None:
    arena.write("adv/test_grow_output.py", GROW)
    before = allocated(arena.gateway.home / "artifacts")
    run = arena.run("adv/test_grow_output.py")
    found = run.report()
    assert found["saved_stdout:type"] == "fifo", found
    grown = {k: v for k, v in found.items() if v.startswith("ok") and not k.endswith((":type", ":readlink"))}
    assert grown == {}, grown
    for name in ("saved_stdout:readlink", "saved_stdout_dup:readlink"):
        assert str(arena.gateway.home) not in found[name] and "stdout.txt" not in found[name], found[name]
    assert run.run_dir is not None
    for name in ("stdout.txt", "stderr.txt"):
        held = (run.run_dir / name).stat()
        assert max(held.st_size, held.st_blocks * 512) <= CAP + 4096, name
    assert allocated(arena.gateway.home / "artifacts") - before <= 2 * CAP + (1 << 20)


EVERY_FD = r"""
import os
from _kit import report

def test_where_every_descriptor_leads():
    links = {}
    for fd in range(0, 1024):
        try:
            links[fd] = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            continue
    for name in ("cwd", "exe", "root"):
        try:
            links[name] = os.readlink("/proc/self/" + name)
        except OSError as exc:
            links[name] = "blocked:%s" % exc.errno
    report(**{str(k): v for k, v in links.items()})
"""


def test_no_descriptor_of_the_run_names_the_state_folder(arena: Arena) -> None:
    """A variant: `readlink` of any fd (not only 1 and 2) must not lead into the state folder."""
    arena.write("adv/test_every_fd.py", EVERY_FD)
    found = arena.run("adv/test_every_fd.py").report()
    assert len(found) >= 3, found
    home = str(arena.gateway.home)
    assert not [link for link in found.values() if home in link or "artifacts" in link], found


FLOOD_PAST_THE_CAP = r"""
import os, time
from _kit import capture_fd

def test_flood_through_the_saved_descriptor_and_a_daemon():
    fd = capture_fd()
    if os.fork() == 0:
        os.setsid()
        block = b"d" * 65536
        while True:
            os.write(fd, block)
    block = b"p" * 65536
    for _ in range(64):
        os.write(fd, block)
    time.sleep(30)
"""


def test_a_flood_past_the_cap_is_cut_and_the_run_stopped(arena: Arena) -> None:
    arena.write("adv/test_flood_saved.py", FLOOD_PAST_THE_CAP)
    before = allocated(arena.gateway.home / "artifacts")
    run = arena.run("adv/test_flood_saved.py")
    assert run.error_code == -32006 and run.response["error"]["data"]["reason"] == "output_limit", run.response
    assert run.sandbox_event()["killed_by"] == "output"
    assert run.sandbox_event()["truncated"] is True
    assert allocated(arena.gateway.home / "artifacts") - before <= 2 * CAP + (1 << 20)
    assert arena.leftovers("adv/test_flood_saved.py") == []


# --- IPC objects ---------------------------------------------------------------------

IPC = r"""
import ctypes, errno, os
from _kit import attempt, report

libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT, IPC_EXCL, IPC_STAT = 0o1000, 0o2000, 2
KEY = PARAMS["key"]

def call(function, *args):
    value = function(*args)
    if value == -1 or value is None:
        raise OSError(ctypes.get_errno(), function.__name__)
    return value

def create():
    found = {}
    found["shm"] = attempt(lambda: call(libc.shmget, KEY, 64 << 20, IPC_CREAT | IPC_EXCL | 0o600))
    found["msg"] = attempt(lambda: call(libc.msgget, KEY, IPC_CREAT | IPC_EXCL | 0o600))
    found["sem"] = attempt(lambda: call(libc.semget, KEY, 1, IPC_CREAT | IPC_EXCL | 0o600))
    found["mq"] = attempt(lambda: call(rt.mq_open, b"/mcp-adv-%d" % KEY, os.O_CREAT | os.O_RDWR, 0o600, None))
    return found

def reach():
    # by key, and by id: ids are small numbers handed out in order, so try the first ones
    found = {}
    found["shm"] = attempt(lambda: call(libc.shmget, KEY, 0, 0))
    found["msg"] = attempt(lambda: call(libc.msgget, KEY, 0))
    found["sem"] = attempt(lambda: call(libc.semget, KEY, 0, 0))
    found["mq"] = attempt(lambda: call(rt.mq_open, b"/mcp-adv-%d" % KEY, os.O_RDONLY, 0, None))
    buffer = ctypes.create_string_buffer(512)
    found["shm_ids"] = [i for i in range(64) if libc.shmctl(i, IPC_STAT, buffer) == 0]
    found["msg_ids"] = [i for i in range(64) if libc.msgctl(i, IPC_STAT, buffer) == 0]
    found["sem_ids"] = [i for i in range(64) if libc.semctl(i, 0, IPC_STAT, buffer) == 0]
    return found

def test_ipc():
    report(**(create() if PARAMS["mode"] == "create" else reach()))
"""


def host_ipc() -> dict[str, list[tuple[int, int]]]:
    """The host's SysV objects: kind -> [(key, owner uid)]."""
    columns = {"shm": 7, "msg": 7, "sem": 4}
    table: dict[str, list[tuple[int, int]]] = {}
    for kind, uid_column in columns.items():
        rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        table[kind] = [(int(row.split()[0]), int(row.split()[uid_column])) for row in rows]
    return table


def test_ipc_objects_die_with_the_run_and_no_later_run_reaches_them(arena: Arena) -> None:
    key = 0x4D430000 + secrets.randbelow(0xFFFF)
    arena.write("adv/test_ipc_create.py", IPC, key=key, mode="create")
    arena.write("adv/test_ipc_reach.py", IPC, key=key, mode="reach")
    created = arena.run("adv/test_ipc_create.py").report()
    assert all(created[kind].startswith("ok") for kind in ("shm", "msg", "sem")), created
    leftover = {kind: [k for k, uid in rows if k == key or uid in RUN_UIDS] for kind, rows in host_ipc().items()}
    assert leftover == {"shm": [], "msg": [], "sem": []}, "a run's IPC object outlived it on the host"
    assert not Path(f"/dev/mqueue/mcp-adv-{key}").exists()
    reached = arena.run("adv/test_ipc_reach.py").report()
    assert all(reached[kind].startswith("blocked") for kind in ("shm", "msg", "sem", "mq")), reached
    assert (reached["shm_ids"], reached["msg_ids"], reached["sem_ids"]) == ([], [], []), reached


IPC_HOLD = IPC.replace(
    'report(**(create() if PARAMS["mode"] == "create" else reach()))',
    'found = create() if PARAMS["mode"] == "create" else reach()\n'
    "    import time\n"
    '    time.sleep(PARAMS.get("hold", 0))\n'
    "    report(**found)",
)


def test_a_concurrent_run_cannot_reach_a_live_runs_ipc_objects(arena: Arena) -> None:
    """Variant: the owner is still running (same key, ids 0..63), and the other run is another tenant's process."""
    key = 0x4D430000 + secrets.randbelow(0xFFFF)
    arena.write("adv/test_ipc_hold.py", IPC_HOLD, key=key, mode="create", hold=4)
    arena.write("adv/test_ipc_peek.py", IPC_HOLD, key=key, mode="reach")
    session = arena.session
    holder = session.send_call("run_pytest", {"test_path": "adv/test_ipc_hold.py", "timeout_s": 30}, arena.token)
    time.sleep(2)
    peeker = session.send_call("run_pytest", {"test_path": "adv/test_ipc_peek.py", "timeout_s": 30}, arena.token)
    first = session.wait_response(holder, timeout=90)
    second = session.wait_response(peeker, timeout=90)
    held = report_of(arena, first)
    peeked = report_of(arena, second)
    assert held["shm"].startswith("ok"), held
    assert all(peeked[kind].startswith("blocked") for kind in ("shm", "msg", "sem", "mq")), peeked
    assert (peeked["shm_ids"], peeked["msg_ids"], peeked["sem_ids"]) == ([], [], []), peeked


def report_of(arena: Arena, response: dict[str, Any]) -> dict[str, Any]:
    result = response.get("result")
    assert isinstance(result, dict), response
    run_id = result["structuredContent"]["run_id"]
    stdout = (arena.gateway.home / "artifacts" / run_id / "stdout.txt").read_text()
    line = next(line for line in stdout.splitlines() if "REPORT {" in line)
    found: dict[str, object] = json.loads(line[line.index("{") :])
    return found


# --- a run whose gateway dies or stalls --------------------------------------------

SLEEPERS = r"""
import os, time

def test_daemons_that_outlive_the_gateway():
    for spin in (False, True):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while spin:
                    pass
                time.sleep(3600)
            os._exit(0)
        os.wait()
    time.sleep(3600)
"""


def pump_until(session: StdioSession, condition: Callable[[], bool], timeout: float) -> bool:
    """Answer the gateway's consent questions while waiting for `condition`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        try:
            message = session.read_message(timeout=0.1)
        except queue.Empty:
            continue
        if message.get("method") == "elicitation/create":
            session.send({"jsonrpc": "2.0", "id": message["id"], "result": answer_allow_once(message)})
    return condition()


def finished(gateway: GatewayHome, run_id: str) -> list[dict[str, Any]]:
    return [e for e in gateway.events_of(run_id) if e["event_type"] == "TOOL_FINISHED"]


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def run_row(arena: Arena, run_id: str) -> tuple[str, float | None]:
    with sqlite3.connect(arena.gateway.home / "gateway.db") as db:
        status, deadline = db.execute("SELECT status, deadline FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return str(status), deadline


@contextlib.contextmanager
def sleepers_running(
    factory: pytest.TempPathFactory,
    backend: Backend,
    name: str,
    timeout_s: int,
    serve_env: Mapping[str, str] | None = None,
) -> Iterator[tuple[Arena, int, str]]:
    """An arena of its own (the test kills or stops its gateway) with SLEEPERS running: (arena, call id,
    the marker its run's processes carry). The marker names the backend: the pool's uids are shared, and
    a test's other backend may be running on another worker at the same moment."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox confines only when the gateway runs as root (as CI runs it)")
    policy = {"sandbox": {"backend": backend, "require": [g.value for g in Guarantee]}}
    with open_arena(factory.mktemp(f"{name}-{backend}"), policy, serve_env) as arena:
        marker = f"adv/{name}_{backend}.py"
        arena.write(marker, SLEEPERS)
        session = arena.session
        call = session.send_call("run_pytest", {"test_path": marker, "timeout_s": timeout_s}, arena.token)
        assert pump_until(session, lambda: len(arena.leftovers(marker)) >= 3, timeout=30)
        yield arena, call, marker


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_dies_with_its_gateway_and_the_next_gateway_closes_its_record(
    backend: Backend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Every gateway that starts removes the scratch folders nobody holds in its temp folder: this
    # gateway and its successor get a temp folder of their own (sticky and open, as /tmp), so that
    # no other gateway starting on the host meanwhile (a parallel test, another suite) sweeps first.
    own_tmp = Path(tempfile.mkdtemp(prefix="mcp-adv-tmp-"))
    own_tmp.chmod(0o1777)
    env = {"TMPDIR": str(own_tmp)}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, own_tmp, True)
        arena, _, marker = cleanup.enter_context(sleepers_running(tmp_path_factory, backend, "test_outlive", 8, env))
        session = arena.session
        run_id = next(e["run_id"] for e in arena.gateway.audit_events() if e["event_type"] == "TOOL_STARTED")
        os.kill(arena.serve_pid, signal.SIGKILL)
        session.process.wait(timeout=10)
        # Nobody is left to kill anything: the parent-death signal and pid 1 do it, at once.
        assert wait_until(lambda: arena.leftovers(marker) == [], timeout=2), "the run outlived it"
        status, deadline = run_row(arena, run_id)
        assert status == "running" and deadline is not None
        scratch = list((own_tmp / f"{ROOT_PREFIX}{os.geteuid()}").glob(f"{SCRATCH_PREFIX}{run_id[:8]}-*"))
        assert len(scratch) == 1, "the dead gateway's run left its scratch folder"
        time.sleep(max(0.0, deadline - time.time()) + 0.2)
        successor = StdioSession(arena.gateway, env=env)
        try:
            assert "result" in successor.initialize()
            # The run's row is closed first, its TOOL_FINISHED written in the next transaction: wait for both.
            assert wait_until(
                lambda: run_row(arena, run_id)[0] == "abandoned" and bool(finished(arena.gateway, run_id)), timeout=10
            ), successor.stderr_text()
            assert not scratch[0].exists(), "the next gateway to start removes it"
        finally:
            successor.close()
        ended = finished(arena.gateway, run_id)
        assert [e["detail"] for e in ended] == [{"status": "abandoned", "reason": "gateway_lost"}]
        assert arena.gateway.chain_ok()
        with sqlite3.connect(arena.gateway.home / "gateway.db") as db:
            (charged,) = db.execute("SELECT elapsed_ms FROM budget_charges WHERE run_id = ?", (run_id,)).fetchone()
        assert charged == 8000, "a run whose end nobody saw is charged its whole time limit"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stopped_gateway_cannot_stretch_a_runs_time_limit(
    backend: Backend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Variant: the gateway is alive but frozen (SIGSTOP, like a loop stuck on a database lock)."""
    with sleepers_running(tmp_path_factory, backend, "test_frozen", timeout_s=5) as (arena, call, marker):
        session = arena.session
        os.kill(arena.serve_pid, signal.SIGSTOP)
        try:
            gone = wait_until(lambda: arena.leftovers(marker) == [], timeout=5 + WATCHDOG_GRACE_S + 2)
        finally:
            os.kill(arena.serve_pid, signal.SIGCONT)
        assert gone, "the run lived past its time limit while its gateway was stopped"
        response = session.wait_response(call, timeout=30)
        assert response.get("error", {}).get("code") == -32007, response
        assert RUN_GRACE_S > WATCHDOG_GRACE_S
