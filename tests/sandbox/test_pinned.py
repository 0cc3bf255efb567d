"""sandbox/pinned.py: a path pinned by identity, then real runs that use the pin after its path was swapped (decision 30)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from sandbox import Limits, probe_host, run_sandboxed
from sandbox.limits import BACKENDS, Backend
from sandbox.pinned import Pinned, is_intact, open_without_links, pin
from tests.sandbox.confined_child import PYTHON, requires_root, shared_dir


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/parent/ws/mine.txt, tmp/parent/other/secret.txt."""
    (tmp_path / "parent" / "ws").mkdir(parents=True)
    (tmp_path / "parent" / "ws" / "mine.txt").write_text("mine")
    (tmp_path / "parent" / "other").mkdir()
    (tmp_path / "parent" / "other" / "secret.txt").write_text("secret")
    return tmp_path


def swap_for_link(path: Path, target: Path | str) -> Path:
    """What the tenant did: rename the folder away and put a symlink in its place; returns the new name."""
    away = path.with_name(path.name + "-away")
    path.rename(away)
    path.symlink_to(target, target_is_directory=True)
    return away


# --- pinning ------------------------------------------------------------------------------


def test_a_pin_holds_the_inode_reached_without_links(tree: Path) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    info = ws.stat()
    assert (pinned.path, pinned.dev, pinned.ino, pinned.is_dir) == (ws, info.st_dev, info.st_ino, True)
    assert fcntl.fcntl(pinned.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC, "never inherited unless handed on"
    assert fcntl.fcntl(pinned.fd, fcntl.F_GETFL) & os.O_PATH, "O_PATH: it reads nothing by itself"
    assert is_intact(pinned)


def test_a_file_can_be_pinned(tree: Path) -> None:
    secret = tree / "parent" / "other" / "secret.txt"
    pinned = pin(secret)
    assert not pinned.is_dir and is_intact(pinned)
    secret.rename(secret.with_name("moved"))
    secret.symlink_to(tree / "parent" / "ws" / "mine.txt")
    assert not is_intact(pinned)


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_path_with_a_link_in_any_component_is_not_pinned(tree: Path, where: str) -> None:
    (tree / "link").symlink_to(tree / "parent", target_is_directory=True)
    path = tree / "link" if where == "last" else tree / "link" / "ws"
    with pytest.raises(OSError, match="symlink") as caught:
        pin(path)
    assert caught.value.errno == errno.ELOOP


@pytest.mark.parametrize("path", ["relative/ws", "/tmp/../etc"])
def test_only_absolute_paths_without_dots_are_pinned(path: str) -> None:
    with pytest.raises(OSError, match="absolute") as caught:
        open_without_links(Path(path))
    assert caught.value.errno == errno.EINVAL


def test_a_missing_path_is_not_pinned(tree: Path) -> None:
    with pytest.raises(FileNotFoundError):
        pin(tree / "parent" / "nope")


def test_the_root_folder_can_be_pinned() -> None:
    assert is_intact(pin(Path("/")))


# --- what a later swap does to the check, and to the fd -----------------------------------------


@pytest.mark.parametrize("target", ["parent", "/"], ids=["link-to-parent", "link-to-root"])
def test_a_folder_swapped_for_a_link_is_not_intact_but_the_fd_still_reaches_the_original(
    tree: Path, target: str
) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    swap_for_link(ws, tree / "parent" if target == "parent" else "/")
    assert not is_intact(pinned)
    assert os.listdir(f"/proc/self/fd/{pinned.fd}") == ["mine.txt"]


def test_a_link_in_a_middle_component_fails_even_when_it_leads_to_the_same_folder(tree: Path) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    away = swap_for_link(tree / "parent", tree / "parent-away")
    assert (away / "ws").stat().st_ino == pinned.ino, "the link leads to the very folder..."
    assert not is_intact(pinned), "...but a link is never followed"


def test_a_folder_replaced_by_a_new_one_of_the_same_name_is_not_intact(tree: Path) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    ws.rename(tree / "parent" / "ws-away")
    ws.mkdir()
    (ws / "mine.txt").write_text("mine")  # same name, same content: another inode
    assert not is_intact(pinned)


def test_a_middle_folder_replaced_by_a_new_tree_is_not_intact(tree: Path) -> None:
    pinned = pin(tree / "parent" / "ws")
    (tree / "parent").rename(tree / "parent-away")
    (tree / "parent" / "ws").mkdir(parents=True)
    assert not is_intact(pinned)


def test_the_folder_restored_at_its_path_is_intact_again(tree: Path) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    away = swap_for_link(ws, tree / "parent")
    assert not is_intact(pinned)
    ws.unlink()
    away.rename(ws)
    assert is_intact(pinned)


def test_a_removed_folder_is_not_intact_and_its_inode_stays_held(tree: Path) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    shutil.rmtree(ws)
    assert not is_intact(pinned)
    ws.mkdir()
    assert ws.stat().st_ino != pinned.ino, "the held inode cannot be handed to the new folder"
    assert not is_intact(pinned)


@contextlib.contextmanager
def bind_mounted(source: Path, target: Path) -> Iterator[None]:
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(target)], check=True)


@requires_root
def test_another_folder_bind_mounted_over_the_path_is_not_intact(tree: Path) -> None:
    ws = tree / "parent" / "ws"
    pinned = pin(ws)
    with bind_mounted(tree / "parent" / "other", ws):
        assert not is_intact(pinned)
        assert os.listdir(f"/proc/self/fd/{pinned.fd}") == ["mine.txt"], "the fd is below the mount"
    assert is_intact(pinned)


@requires_root
def test_a_path_that_is_a_bind_mount_at_load_is_pinned_as_what_it_shows(tree: Path) -> None:
    target = tree / "mounted"
    target.mkdir()
    with bind_mounted(tree / "parent" / "ws", target):
        pinned = pin(target)
        assert is_intact(pinned)
        assert os.listdir(f"/proc/self/fd/{pinned.fd}") == ["mine.txt"]
        pinned.close()  # a held fd keeps the mount busy


def test_close_releases_the_fd_once(tree: Path) -> None:
    pinned = pin(tree / "parent" / "ws")
    fd = pinned.fd
    pinned.close()
    pinned.close()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


def test_the_fd_closes_when_the_last_reference_goes(tree: Path) -> None:
    fd = pin(tree / "parent" / "ws").fd
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)


# --- real runs: the sandbox uses the pin, not the path -------------------------------------------

SEES = """
import errno, json, os

def attempt(action):
    try:
        return "ok:" + repr(action())
    except OSError as exc:
        return "blocked:" + errno.errorcode.get(exc.errno, str(exc.errno))

def read(path):
    with open(path) as handle:
        return handle.read()

def held_fds():
    found = []
    for fd in range(3, 256):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        found.append([info.st_dev, info.st_ino])
    return found

P = json.loads(PARAMS)
print(json.dumps({
    "listing": attempt(lambda: sorted(os.listdir("."))),
    "mine": attempt(lambda: read("mine.txt")),
    "up": attempt(lambda: read("../other/secret.txt")),
    "through_the_path": attempt(lambda: read(P["through"])),
    "direct": attempt(lambda: read(P["direct"])),
    "policy": attempt(lambda: read(P["policy"])),
    "extra_data": attempt(lambda: read(P["extra_data"])),
    "extra_secret": attempt(lambda: read(P["extra_secret"])),
    "fds": held_fds(),
}))
"""


@contextlib.contextmanager
def swapped_tenant_tree(target: str) -> Iterator[tuple[Path, Pinned, Pinned, dict[str, str], bytes]]:
    """A world-readable tree as two tenants and the operator leave it; the workspace and an extra
    read-only folder are pinned, then both swapped for links by their tenant."""
    secret = f"SECRET-{secrets.token_hex(16)}".encode()
    with shared_dir() as folder:
        parent = folder / "parent"
        (parent / "ws").mkdir(parents=True)
        (parent / "ws" / "mine.txt").write_text("mine")
        (parent / "other").mkdir()
        (parent / "other" / "secret.txt").write_bytes(secret)
        (parent / "policy.yaml").write_bytes(secret)
        (parent / "extra").mkdir()
        (parent / "extra" / "data.txt").write_text("data")
        for path in (parent, *parent.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        ws, extra = pin(parent / "ws"), pin(parent / "extra")
        swap_for_link(parent / "ws", parent if target == "parent" else "/")
        swap_for_link(parent / "extra", parent / "other")
        through = "other/secret.txt" if target == "parent" else str(parent / "other" / "secret.txt").lstrip("/")
        params = {
            "through": str(parent / "ws" / through),
            "direct": str(parent / "other" / "secret.txt"),
            "policy": str(parent / "policy.yaml"),
            "extra_data": str(parent / "extra" / "data.txt"),
            "extra_secret": str(parent / "extra" / "secret.txt"),
        }
        scratch = folder / "scratch"
        scratch.mkdir()
        yield folder, ws, extra, params, secret


@requires_root
@pytest.mark.parametrize("target", ["parent", "/"], ids=["link-to-parent", "link-to-root"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_sees_the_pinned_folders_after_their_paths_were_swapped_for_links(backend: Backend, target: str) -> None:
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.skip("bubblewrap does not run here")
    with swapped_tenant_tree(target) as (folder, ws, extra, params, secret):
        limits = Limits(
            timeout_s=20,
            memory_limit_mb=256,
            max_processes=16,
            max_output_bytes=100_000,
            allowed_paths=(extra,),
            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(folder / "scratch")},
            scratch_bytes=8 << 20,
            backend=backend,
        )
        code = f"PARAMS = {json.dumps(json.dumps(params))}\n{SEES}"
        result = anyio.run(
            lambda: run_sandboxed(
                [PYTHON, "-I", "-c", code], ws, limits, folder / "out", folder / "err", scratch=folder / "scratch"
            )
        )
        output = (folder / "out").read_bytes() + (folder / "err").read_bytes()
        assert result.exit_code == 0, output
        seen = json.loads((folder / "out").read_text())
        held = {tuple(pair) for pair in seen.pop("fds")}
    assert secret not in output
    assert seen["listing"] == "ok:['mine.txt']", "the cwd is the pinned folder"
    assert seen["mine"] == "ok:'mine'"
    for name in ("up", "through_the_path", "direct", "policy", "extra_secret"):
        assert seen[name].startswith("blocked:"), (name, seen)
    if backend == "bubblewrap":
        assert seen["extra_data"] == "ok:'data'", "the bind is the pinned folder, at its pinned path"
    else:
        assert seen["extra_data"].startswith("blocked:"), "the path leads elsewhere now, and only the inode is granted"
    # An O_PATH fd on a host folder would let the run walk `..` out of bubblewrap's tree.
    assert (ws.dev, ws.ino) not in held and (extra.dev, extra.ino) not in held, "no pinned fd reaches the run"
