"""Spawning real children through the identity, rlimits and netns layers, chained as the runner will."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.backends import identity, netns, rlimits
from sandbox.backends.containment import sweep
from sandbox.backends.identity import RunIdentity, UidPool
from sandbox.backends.rlimits import MIB, ResourceLimits
from sandbox.pinned import Pinned, pin

# The venv's interpreter resolves under /root (0700): a pool uid gets EACCES at exec. The
# system interpreter is world-readable and the children need only the standard library.
PYTHON = "/usr/bin/python3"
TEST_POOL = range(62000, 62200)  # apart from the default pool, so a live gateway's runs are never swept
CHILD_TIMEOUT_S = 30

# A double fork + setsid: the grandchild leaves the session and the process tree, and prints its pid.
DAEMONIZE = """
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        os.write(w, str(os.getpid()).encode())
        time.sleep(60)
    os._exit(0)
os.close(w)
print(int(os.read(r, 16)))
"""

requires_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(PYTHON), reason="needs root and /usr/bin/python3"
)


def resource_limits(**overrides: int) -> ResourceLimits:
    values = {
        "address_space_bytes": 256 * MIB,
        "cpu_seconds": 30,
        "open_files": 64,
        "processes": 20,
        "file_size_bytes": 16 * MIB,
    }
    values.update(overrides)
    return ResourceLimits(**values)


def confine(
    who: RunIdentity, limits: ResourceLimits, *, network: bool = False, drop: bool = True
) -> Callable[[], None]:
    """The preexec chain in its required order: root-only steps, rlimits, then the uid drop."""

    def preexec() -> None:
        if not network:
            netns.unshare_network()
        rlimits.apply(limits)
        if drop:
            identity.drop_privileges(who.uid, who.gid)

    return preexec


def run_python(code: str, preexec: Callable[[], None], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-I", "-c", code, *args],
        preexec_fn=preexec,  # pytest is single-threaded, so preexec_fn is safe here
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )


POOL = UidPool(TEST_POOL)


@contextlib.contextmanager
def leased_identity() -> Iterator[RunIdentity]:
    """A pool uid for one test; whatever it left running is swept before the uid goes back."""
    who = POOL.acquire()
    try:
        yield who
    finally:
        sweep(who.uid)
        POOL.release(who)


@contextlib.contextmanager
def shared_dir() -> Iterator[Path]:
    """A folder the pool uid can enter and read (pytest's tmp dirs are 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-id-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@contextlib.contextmanager
def project(files: dict[str, str]) -> Iterator[tuple[Path, Pinned]]:
    """A world-readable workspace owned by root (as a developer's is by them), pinned, and a scratch folder beside it."""
    with shared_dir() as folder:
        ws = folder / "ws"
        ws.mkdir()
        for name, text in files.items():
            (ws / name).parent.mkdir(parents=True, exist_ok=True)
            (ws / name).write_text(text)
        for path in (ws, *ws.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        (folder / "scratch").mkdir()
        pinned = pin(ws)
        try:
            yield folder, pinned
        finally:
            pinned.close()


@contextlib.contextmanager
def users_project(files: dict[str, str], uid: int) -> Iterator[Path]:
    """A workspace, scratch and outside folder of the ordinary `uid`, as its own gateway would have them."""
    with shared_dir() as folder:
        for sub in ("ws", "scratch", "outside"):
            (folder / sub).mkdir()
        for name, text in files.items():
            (folder / "ws" / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / "ws" / name).write_text(text)
        for path in (folder, *folder.rglob("*")):
            os.chown(path, uid, uid)
        folder.chmod(0o755)
        yield folder
