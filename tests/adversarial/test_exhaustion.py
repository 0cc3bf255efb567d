"""Hostile suites that try to exhaust the machine or outlive their run: each bounded, each judged from outside."""

from __future__ import annotations

import errno
import re
import time

from tests.adversarial.conftest import Arena, wait_gone

FORK_BOMB = """
import os, time
from _kit import report

def test_fork_bomb():
    pids, refused = [], 0
    for _ in range(500):
        try:
            pid = os.fork()
        except OSError:
            refused += 1
            continue
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        pids.append(pid)
    report(forked=len(pids), refused=refused, pids=pids)
"""


def test_fork_bomb_stops_at_max_processes_and_nothing_survives(arena: Arena) -> None:
    arena.write("adv/test_fork_bomb.py", FORK_BOMB)
    run = arena.run("adv/test_fork_bomb.py")
    assert run.structured["failed"] == 1
    found = run.report()
    assert found["forked"] <= 64, "RLIMIT_NPROC (max_processes 64) did not hold"
    assert found["refused"] >= 400
    assert run.sandbox_event()["duration_ms"] < 5000, "the run waited for the sleeping children"
    assert wait_gone(found["pids"], timeout=2) == [], "forked children outlived the run"


MEMORY_HOG = """
from _kit import report

def test_memory_hog():
    held, mib = [], 0
    for _ in range(64):  # 64 x 64 MiB = 4 GiB
        try:
            held.append(bytearray(64 << 20))
        except MemoryError:
            break
        mib += 64
    del held
    report(allocated_mib=mib)
"""


def test_memory_hog_stops_at_the_memory_limit(arena: Arena) -> None:
    arena.write("adv/test_memory_hog.py", MEMORY_HOG)
    run = arena.run("adv/test_memory_hog.py")
    assert run.report()["allocated_mib"] < 512
    assert run.sandbox_event()["peak_memory_kb"] <= 512 * 1024


MEMORY_SPLIT = """
import os, time
from _kit import report

def test_several_hogs_each_under_the_limit():
    children = []
    for _ in range(3):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                block = b"x" * (320 << 20)  # every page written: all of it counts
                os.write(w, b"1")
            except MemoryError:
                os.write(w, b"0")
            time.sleep(3)  # hold it while the others hold theirs
            os._exit(0)
        os.close(w)
        children.append((pid, r))
    holding = [pid for pid, r in children if os.read(r, 1) == b"1"]
    time.sleep(0.5)  # one moment for all: a holder killed since it reported is gone by now
    alive = [pid for pid in holding if os.waitpid(pid, os.WNOHANG) == (0, 0)]
    report(held_at_once_mib=320 * len(alive), reported=len(holding))
"""


def test_several_processes_under_the_limit_each_stay_under_it_together(arena: Arena) -> None:
    arena.write("adv/test_memory_split.py", MEMORY_SPLIT)
    run = arena.run("adv/test_memory_split.py")
    assert run.report()["held_at_once_mib"] <= 512
    event = run.sandbox_event()
    assert event["peak_memory_kb"] <= 512 * 1024, "the run as a whole went over its memory limit"
    assert event["oom_kills"] >= 1 and event["killed_by"] == "memory"
    assert run.error_code == -32006, run.response
    assert run.response["error"]["data"]["reason"] == "memory_limit"
    assert arena.leftovers("adv/test_memory_split.py") == []


CPU_SPIN = """
import os, signal, time

def spin():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pass

def test_cpu_spin():
    if os.fork() == 0:
        spin()
        os._exit(0)
    spin()
"""


def test_cpu_spin_ignoring_sigterm_is_killed_at_the_timeout(arena: Arena) -> None:
    arena.write("adv/test_cpu_spin.py", CPU_SPIN)
    started = time.monotonic()
    run = arena.run("adv/test_cpu_spin.py", timeout_s=2)
    assert run.error_code == -32007, run.response
    assert time.monotonic() - started < 10
    assert run.sandbox_event()["killed_by"] == "timeout"
    assert arena.leftovers("adv/test_cpu_spin.py") == [], "a spinning process outlived the timeout"


OUTPUT_FLOOD = """
import os

def test_output_flood(capsys):
    chunk = b"y" * (1 << 20)
    with capsys.disabled():
        for _ in range(1024):  # 1 GiB at most
            os.write(1, chunk)
"""


def test_a_gigabyte_of_output_is_cut_at_the_cap(arena: Arena) -> None:
    arena.write("adv/test_output_flood.py", OUTPUT_FLOOD)
    run = arena.run("adv/test_output_flood.py")
    assert run.error_code == -32006, run.response
    assert run.response["error"]["data"]["reason"] == "output_limit"
    assert run.run_dir is not None
    assert (run.run_dir / "stdout.txt").stat().st_size <= 1024 * 1024
    assert run.sandbox_event()["killed_by"] == "output"
    assert arena.leftovers("adv/test_output_flood.py") == []


DAEMON = """
import os, stat, time
from _kit import capture_fd, report

def daemon(fd, marker):
    os.write(fd, ("\\nDAEMON_PID %d\\n" % os.getpid()).encode())
    for _ in range(150):  # 15 s at most
        stamp = ("DAEMON_TICK %.3f\\n" % time.time()).encode()
        if fd is not None:
            try:
                os.write(fd, stamp)
            except OSError:
                pass
        try:
            with open(marker, "ab") as handle:
                handle.write(stamp)
        except OSError:
            pass
        time.sleep(0.1)

def test_daemonized_grandchild():
    fd = capture_fd()
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            daemon(fd, PARAMS["marker"])
            os._exit(0)
        os._exit(0)
    os.close(w)
    grandchild = int(os.read(r, 32))
    os.wait()
    time.sleep(PARAMS.get("linger_s", 0.3))  # let it tick while the run is still on
    report(grandchild=grandchild, capture_fd=fd)
"""


def test_daemonized_grandchild_dies_with_the_run(arena: Arena) -> None:
    marker = arena.outside / "daemon-alive"
    arena.write("adv/test_daemon.py", DAEMON, marker=str(marker))
    run = arena.run("adv/test_daemon.py")
    found = run.report()
    assert found["capture_fd"] is not None, "the daemon found no channel to show it is alive"
    time.sleep(1.0)  # it ticks every 0.1 s: a survivor would have written by now
    assert wait_gone([found["grandchild"]], timeout=1) == [], "the daemonized grandchild outlived the run"
    ticks = [float(t) for t in re.findall(r"DAEMON_TICK (\d+\.\d+)", run.stdout)]
    assert ticks, "the daemon never ran"
    assert max(ticks) <= run.ended_at, "the daemon was still writing after the call returned"
    assert not marker.exists(), "the daemon wrote outside its scratch folder"


DISK_FILL_ONE_FILE = """
import os
from _kit import report

def test_one_huge_file():
    chunk, written = b"z" * (16 << 20), 0
    path = os.path.join(os.environ["TMPDIR"], "fill")
    try:
        with open(path, "wb") as handle:
            for _ in range(32):  # 512 MiB at most
                handle.write(chunk)
                handle.flush()
                written += len(chunk)
    except OSError as exc:
        error = type(exc).__name__
    else:
        error = None
    size = os.path.getsize(path)
    os.remove(path)  # room again for pytest's own junit XML, which carries this report
    report(written_mib=written >> 20, size_mib=size >> 20, error=error)
"""


def test_one_file_cannot_grow_past_the_file_size_limit(arena: Arena) -> None:
    arena.write("adv/test_disk_one_file.py", DISK_FILL_ONE_FILE)
    run = arena.run("adv/test_disk_one_file.py")
    found = run.report()
    assert found["size_mib"] <= 256 and found["error"] is not None


DISK_FILL_MANY_FILES = """
import os
from _kit import report

def test_many_files():
    chunk, written, error, paths = b"z" * (16 << 20), 0, None, []
    for index in range(48):  # 768 MiB at most, each file under RLIMIT_FSIZE
        paths.append(os.path.join(os.environ["TMPDIR"], "fill%d" % index))
        try:
            with open(paths[-1], "wb") as handle:
                handle.write(chunk)
        except OSError as exc:
            error = exc.errno
            break
        written += len(chunk)
    for path in paths:  # room again for pytest's own junit XML, which carries this report
        if os.path.exists(path):
            os.remove(path)
    report(written_mib=written >> 20, error=error)
"""


def test_many_files_cannot_fill_the_disk(arena: Arena) -> None:
    arena.write("adv/test_disk_many_files.py", DISK_FILL_MANY_FILES)
    run = arena.run("adv/test_disk_many_files.py")
    found = run.report()
    assert found["written_mib"] <= 256, "the scratch space (256 MiB by default) let more through"
    assert found["error"] == errno.ENOSPC, found


INODE_FILL = """
import os
from _kit import report

def test_inode_fill():
    made, error = 0, None
    for index in range(30000):
        try:
            os.close(os.open(os.path.join(os.environ["TMPDIR"], "i%d" % index), os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            error = exc.errno
            break
        made += 1
    for index in range(made):  # room again for pytest's own junit XML, which carries this report
        os.remove(os.path.join(os.environ["TMPDIR"], "i%d" % index))
    report(files=made, error=error)
"""


def test_inode_fill_is_bounded(arena: Arena) -> None:
    arena.write("adv/test_inode_fill.py", INODE_FILL)
    run = arena.run("adv/test_inode_fill.py")
    found = run.report()
    assert found["files"] < 10000, "the scratch space (8192 inodes by default) let more through"
    assert found["error"] == errno.ENOSPC, found


HOPPING_DAEMON = """
import os, time
from _kit import capture_fd, report

def hop(fd):
    # A process that is never the same pid for long: it forks and its parent exits, again and again.
    deadline = time.time() + 8
    for count in range(200000):
        if time.time() > deadline:
            break
        try:
            if os.fork():
                os._exit(0)
        except OSError:
            continue
        if count % 50 == 0:
            try:
                os.write(fd, ("HOP_TICK %.3f %d\\n" % (time.time(), os.getpid())).encode())
            except OSError:
                pass
    os._exit(0)

def test_hopping_daemon():
    fd = capture_fd()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            hop(fd)
        os._exit(0)
    os.wait()
    time.sleep(0.3)
    report(capture_fd=fd)
"""


def test_a_daemon_that_keeps_changing_pid_dies_with_the_run(arena: Arena) -> None:
    arena.write("adv/test_hopping_daemon.py", HOPPING_DAEMON)
    run = arena.run("adv/test_hopping_daemon.py")
    assert run.report()["capture_fd"] is not None
    time.sleep(1.0)
    ticks = [float(t) for t in re.findall(r"HOP_TICK (\d+\.\d+)", run.stdout)]
    assert ticks, "the daemon never ran"
    assert arena.leftovers("adv/test_hopping_daemon.py") == [], "a pid-hopping daemon outlived the sweep"
    assert max(ticks) <= run.ended_at, "the daemon was still running after the call returned"
