"""Output through pipes: a run cannot make the host hold more than the cap per stream, by any means (decision 36)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Limits, RunResult, run_sandboxed, run_unsafe_unconfined
from sandbox.limits import BACKENDS, Backend
from sandbox.runner import KilledBy
from tests.sandbox.confined_child import PYTHON, requires_root, shared_dir

CAP = 64 * 1024
GIB = 1 << 30

# Every way a descriptor lets its holder grow a file without write(): each must fail on the
# run's stdout and stderr, and on a duplicate of them (pytest keeps one while it captures).
GROW = r"""
import ctypes, errno, json, mmap, os, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE = 0x01, 0x02, 0x10
GIB = 1 << 30

def attempt(action):
    try:
        value = action()
    except OSError as exc:
        return "blocked:%s" % errno.errorcode.get(exc.errno, exc.errno)
    return "ok:%r" % (value,)

def fallocate(fd, mode):
    if libc.fallocate(fd, mode, 0, GIB) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
    return 0

found = {}
for fd in (1, 2, os.dup(1)):
    found["%d:fallocate_keep_size" % fd] = attempt(lambda: fallocate(fd, KEEP_SIZE))
    found["%d:fallocate" % fd] = attempt(lambda: fallocate(fd, 0))
    found["%d:fallocate_zero_range" % fd] = attempt(lambda: fallocate(fd, ZERO_RANGE | KEEP_SIZE))
    found["%d:posix_fallocate" % fd] = attempt(lambda: os.posix_fallocate(fd, 0, GIB))
    found["%d:ftruncate" % fd] = attempt(lambda: os.ftruncate(fd, GIB))
    found["%d:pwrite_far" % fd] = attempt(lambda: os.pwrite(fd, b"x", GIB))
    found["%d:lseek_far" % fd] = attempt(lambda: os.lseek(fd, GIB, os.SEEK_SET))
    found["%d:mmap" % fd] = attempt(lambda: mmap.mmap(fd, GIB, mmap.MAP_SHARED, mmap.PROT_WRITE))
    found["%d:link" % fd] = attempt(lambda: os.readlink("/proc/self/fd/%d" % fd))
sys.stderr.write(json.dumps(found))
"""


def limits(backend: Backend = "native", **overrides: Any) -> Limits:
    base = Limits(
        timeout_s=20,
        memory_limit_mb=256,
        max_processes=16,
        max_output_bytes=CAP,
        env={"PATH": "/usr/bin:/bin"},
        scratch_bytes=8 << 20,
        backend=backend,
    )
    return dataclasses.replace(base, **overrides)


def run_confined(folder: Path, code: str, limits: Limits) -> RunResult:
    scratch = folder / "scratch"
    scratch.mkdir()
    return anyio.run(
        lambda: run_sandboxed(
            [PYTHON, "-I", "-c", code], folder, limits, folder / "out", folder / "err", scratch=scratch
        )
    )


def held_on_disk(path: Path) -> int:
    """Bytes the host holds for `path`: its blocks, whatever `st_size` says."""
    info = path.stat()
    return max(info.st_size, info.st_blocks * 512)


def assert_nothing_grew(found: dict[str, str], folder: Path) -> None:
    grown = {name: outcome for name, outcome in found.items() if outcome.startswith("ok") and ":link" not in name}
    assert grown == {}, grown
    links = [outcome for name, outcome in found.items() if ":link" in name]
    assert not any(str(folder) in outcome or "err" in outcome.split("/")[-1:] for outcome in links), links
    for name in ("out", "err"):
        assert held_on_disk(folder / name) <= CAP + 4096


@requires_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_confined_run_cannot_grow_its_output_files_by_any_means(backend: Backend) -> None:
    with shared_dir() as folder:
        result = run_confined(folder, GROW, limits(backend))
        found = json.loads((folder / "err").read_text())
        assert result.exit_code == 0, found
        assert_nothing_grew(found, folder)


def test_an_unconfined_run_gets_pipes_too(tmp_path: Path) -> None:
    result = anyio.run(
        run_unsafe_unconfined,
        [sys.executable, "-c", GROW],
        tmp_path,
        limits(),
        tmp_path / "out",
        tmp_path / "err",
    )
    found = json.loads((tmp_path / "err").read_text())
    assert result.exit_code == 0
    assert_nothing_grew(found, tmp_path)
    assert all(outcome.startswith("ok:'pipe:[") for name, outcome in found.items() if ":link" in name), found


@requires_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_flood_on_both_streams_keeps_at_most_the_cap_of_each(backend: Backend) -> None:
    # A daemon keeps writing after its parent exits: the cap holds for what the pipes still carry.
    flood = """
import os, sys
if os.fork() == 0:
    os.setsid()
    while True:
        os.write(2, b"e" * 65536)
while True:
    os.write(1, b"o" * 65536)
"""
    with shared_dir() as folder:
        result = run_confined(folder, flood, limits(backend))
        assert result.killed_by is KilledBy.OUTPUT
        assert result.truncated
        for name in ("out", "err"):
            assert held_on_disk(folder / name) <= CAP + 4096
        assert result.stdout_bytes <= CAP and result.stderr_bytes <= CAP


@requires_root
def test_output_written_just_before_exit_is_all_kept() -> None:
    # The pipes are drained after the run ends: the tail of a run's output is not lost.
    code = "import os\nfor i in range(200):\n    os.write(1, b'%05d\\n' % i)\nos.write(2, b'bye')\n"
    with shared_dir() as folder:
        result = run_confined(folder, code, limits())
        lines = (folder / "out").read_text().split()
        assert lines == [f"{i:05d}" for i in range(200)]
        assert (folder / "err").read_text() == "bye"
        assert (result.stdout_bytes, result.stderr_bytes, result.truncated) == (1200, 3, False)


def test_the_capture_files_are_new_and_never_followed(tmp_path: Path) -> None:
    # The gateway creates the files itself: a link planted at the path is refused, not followed.
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    os.symlink(target, tmp_path / "out")
    with pytest.raises(FileExistsError):
        anyio.run(run_unsafe_unconfined, [sys.executable, "-c", "print(1)"], tmp_path, limits(), tmp_path / "out",
                  tmp_path / "err")  # fmt: skip
    assert target.read_text() == "keep"
