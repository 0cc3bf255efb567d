"""git's data in the workspace's own `.git` (sandbox/git_data.py, decision 83): a commit lands, nothing else does.

The judgement first, table-driven; then a real repository, copied as a server's copy is, a real
`git commit` in the copy, and beside it each way a run could try to get git on the host to run
its command or read another store through what `ChangeRules(git_data=True)` lets through. After
the apply, the developer's own `git status` runs nothing and `git fsck --strict` passes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import stat
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.apply import apply_changes
from sandbox.change_set import Action, Change, ChangeRules, ChangeSet, Refusal, is_protected_change, read_changes
from sandbox.git_data import is_git_data
from sandbox.pinned import Pinned
from sandbox.workspace_copy import Kind
from tests.sandbox.confined_child import requires_root
from tests.sandbox.test_change_set_guards import git_env, refused
from tests.sandbox.test_workspace_changes import copied, workspace

GIT = shutil.which("git")
HASH = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
LOOSE = f".git/objects/{HASH[:2]}/{HASH[2:]}"
ZLIB = zlib.compress(b"blob 0\x00")
"""The empty blob, HASH: a loose object whose content is its name."""
INDEX = b"DIRC" + (2).to_bytes(4) + (0).to_bytes(4)
INDEX += hashlib.sha1(INDEX, usedforsecurity=False).digest()
GIT_DATA = ChangeRules(git_data=True)


@pytest.mark.parametrize(
    ("path", "kind", "mode", "content", "allowed"),
    [
        (".git/HEAD", Kind.FILE, 0o644, b"ref: refs/heads/main\n", True),
        (".git/HEAD", Kind.FILE, 0o644, f"{HASH}\n".encode(), True),  # detached
        (".git/HEAD", Kind.FILE, 0o644, b"ref: ../../x\n", False),
        (".git/HEAD", Kind.FILE, 0o644, b"ref: refs/heads/../../x\n", False),
        (".git/HEAD", Kind.FILE, 0o644, b"ref: refs/heads/main\n[core]\n", False),
        (".git/HEAD", Kind.FILE, 0o644, b"gitdir: /tmp/evil\n", False),
        (".git/refs/heads/main", Kind.FILE, 0o644, f"{HASH}\n".encode(), True),
        (".git/refs/heads/feature/x", Kind.FILE, 0o444, f"{HASH}\n".encode(), True),
        (".git/refs/heads/main", Kind.FILE, 0o644, b"/etc/passwd\n", False),  # a ref holding a path
        (".git/refs/heads/main", Kind.FILE, 0o755, f"{HASH}\n".encode(), False),  # executable
        (".git/refs/heads/main", Kind.FILE, 0o664, f"{HASH}\n".encode(), False),  # group-writable
        (".git/refs/heads/main.lock", Kind.FILE, 0o644, f"{HASH}\n".encode(), False),
        (".git/refs/heads/.hidden", Kind.FILE, 0o644, f"{HASH}\n".encode(), False),
        (".git/refs/remotes/origin/HEAD", Kind.FILE, 0o644, b"ref: refs/remotes/origin/main\n", True),
        (".git/refs", Kind.FOLDER, 0o755, None, True),
        (".git/refs/heads/feature", Kind.FOLDER, 0o775, None, False),
        (LOOSE, Kind.FILE, 0o444, ZLIB, True),
        (LOOSE, Kind.FILE, 0o444, b"[core]\n\tfsmonitor = evil\n", False),  # not zlib
        (LOOSE, Kind.FILE, 0o444, zlib.compress(b"blob 5\x00hello"), False),  # its content is not its name
        (LOOSE, Kind.FILE, 0o444, zlib.compress(b"blob 0\x00" + bytes(1 << 22)), False),  # a zlib bomb past 32x
        (LOOSE, Kind.FILE, 0o444, ZLIB + b"x", False),
        (f".git/objects/{HASH[:2]}/{HASH[2:]}x", Kind.FILE, 0o444, ZLIB, False),
        (f".git/objects/{HASH[:2]}/tmp_obj_abc", Kind.FILE, 0o444, ZLIB, False),
        (f".git/objects/{HASH[:2]}", Kind.FOLDER, 0o755, None, True),
        (f".git/objects/pack/pack-{HASH}.pack", Kind.FILE, 0o444, b"PACK\x00\x00\x00\x02", True),
        (f".git/objects/pack/pack-{HASH}.idx", Kind.FILE, 0o444, b"PACK", False),  # the wrong magic
        (f".git/objects/pack/pack-{HASH}.promisor", Kind.FILE, 0o444, b"", False),
        (".git/objects/info/alternates", Kind.FILE, 0o644, b"/tmp/evil/objects\n", False),  # another object store
        (".git/objects/info/http-alternates", Kind.FILE, 0o644, b"http://x\n", False),
        (".git/objects/info/commit-graph", Kind.FILE, 0o444, b"CGPH\x01", False),  # git trusts its trees
        (f".git/objects/pack/pack-{HASH}.bitmap", Kind.FILE, 0o444, b"BITM", False),
        (f".git/refs/replace/{HASH}", Kind.FILE, 0o644, f"{HASH}\n".encode(), False),  # git shows another object
        (".git/HEAD", Kind.FILE, 0o644, b"ref: refs/replace/x\n", False),
        (".git/logs/HEAD", Kind.FILE, 0o644, f"{'0' * 40} {HASH} dev <d@x> 1 +0000\tcommit: x\n".encode(), True),
        (".git/logs/HEAD", Kind.FILE, 0o644, b"[core]\n\tfsmonitor = evil\n", False),
        (".git/logs/config", Kind.FILE, 0o644, b"", False),
        (".git/logs/refs/heads/main", Kind.FILE, 0o644, b"", True),
        (".git/index", Kind.FILE, 0o644, INDEX, True),
        (".git/index", Kind.FILE, 0o644, INDEX[:-1] + b"x", False),  # not its checksum
        (".git/index", Kind.FILE, 0o644, b"[core]", False),
        (
            ".git/packed-refs",
            Kind.FILE,
            0o644,
            f"# pack-refs with: peeled fully-peeled sorted \n{HASH} refs/tags/v1\n^{HASH}\n".encode(),
            True,
        ),
        (".git/packed-refs", Kind.FILE, 0o644, f"{HASH} refs/heads/x\n[core]\n\tfsmonitor = evil\n".encode(), False),
        (".git/packed-refs", Kind.FILE, 0o644, f"{HASH} refs/../../x\n".encode(), False),
        (".git/ORIG_HEAD", Kind.FILE, 0o644, f"{HASH}\n".encode(), True),
        (".git/MERGE_HEAD", Kind.FILE, 0o644, f"{HASH}\n{HASH}\n".encode(), True),
        (".git/MERGE_MODE", Kind.FILE, 0o644, b"no-ff", True),
        (".git/MERGE_MODE", Kind.FILE, 0o644, b"evil", False),
        (".git/FETCH_HEAD", Kind.FILE, 0o644, f"{HASH}\t\tbranch 'main' of /x\n".encode(), True),
        (".git/COMMIT_EDITMSG", Kind.FILE, 0o644, b"any message\n", True),
        (".git/COMMIT_EDITMSG", Kind.FILE, 0o755, b"#!/bin/sh\n", False),
        (".git/config", Kind.FILE, 0o644, b"[core]\n", False),
        (".git/commondir", Kind.FILE, 0o644, b"../evil\n", False),
        (".git/hooks/pre-commit", Kind.FILE, 0o644, b"", False),
        (".git/hooks2", Kind.FILE, 0o644, b"", False),  # a name not on the list
        (".git/info/exclude", Kind.FILE, 0o644, b"", False),
        (".git/info/attributes", Kind.FILE, 0o644, b"* filter=evil\n", False),
        (".git/shallow", Kind.FILE, 0o644, f"{HASH}\n".encode(), False),
        (".git/sequencer/todo", Kind.FILE, 0o644, b"exec evil\n", False),
        (".git/worktrees/w/commondir", Kind.FILE, 0o644, b"../..\n", False),
        (".git/modules/lib/HEAD", Kind.FILE, 0o644, b"ref: refs/heads/main\n", False),
        (".git/description", Kind.FILE, 0o644, b"", False),
        (".git/index.lock", Kind.FILE, 0o644, b"DIRC", False),
        (".GIT/HEAD", Kind.FILE, 0o644, b"ref: refs/heads/main\n", False),  # only the own `.git`, as spelt
        (".git/OBJECTS/ab/" + HASH[2:], Kind.FILE, 0o444, ZLIB, False),
        ("sub/.git/HEAD", Kind.FILE, 0o644, b"ref: refs/heads/main\n", False),  # a nested repository's
        (".git", Kind.FOLDER, 0o755, None, False),
        (".git/HEAD", Kind.FOLDER, 0o755, None, False),
        (".git/refs/heads/main", Kind.SYMLINK, 0o777, None, False),
    ],
)
def test_git_data_is_named_held_and_moded_as_git_writes_it(
    path: str, kind: Kind, mode: int, content: bytes | None, allowed: bool
) -> None:
    assert is_git_data(path, kind, mode, content, deleted=False) is allowed


@pytest.mark.parametrize(
    ("path", "kind", "allowed"),
    [
        (".git/refs/heads/feature", Kind.FILE, True),  # `git branch -d`
        (".git/logs/refs/heads/feature", Kind.FILE, True),
        (".git/refs/heads/feature", Kind.FOLDER, True),
        (".git/MERGE_HEAD", Kind.FILE, True),
        (".git/HEAD", Kind.FILE, False),
        (".git/index", Kind.FILE, False),
        (LOOSE, Kind.FILE, False),  # gc and prune only free space; a referenced object deleted corrupts the history
        (f".git/objects/pack/pack-{HASH}.pack", Kind.FILE, False),
        (f".git/objects/{HASH[:2]}", Kind.FOLDER, False),
        (".git/refs/heads", Kind.FOLDER, False),
        (".git/refs", Kind.FOLDER, False),
        (".git/logs", Kind.FOLDER, False),
        (".git/config", Kind.FILE, False),
    ],
)
def test_what_git_data_may_be_deleted(path: str, kind: Kind, allowed: bool) -> None:
    assert is_git_data(path, kind, None, None, deleted=True) is allowed


@pytest.mark.parametrize("name", ["\u200c.git", "GIT~1", ".GIT", "x/\ufeff.git/HEAD"])
def test_a_dot_git_in_any_spelling_beneath_the_own_one_is_no_git_data(name: str) -> None:
    ref = Change(f".git/refs/heads/{name}", Action.ADDED, Kind.FILE, None, "b", None, 41, None, 0o644, b"ref: refs/x\n")
    assert is_protected_change(ref, (), git_data=True)


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (LOOSE, False),  # another content under an object's hash
        (f".git/objects/pack/pack-{HASH}.pack", False),
        (f".git/objects/pack/pack-{HASH}.idx", False),
        (f".git/objects/pack/pack-{HASH}.keep", True),
        (".git/refs/heads/main", True),
    ],
)
def test_an_object_named_by_its_hash_is_never_modified(path: str, allowed: bool) -> None:
    content = {"pack": b"PACK", "idx": b"\xfftOc", "keep": b""}.get(path.rpartition(".")[2], ZLIB)
    content = f"{HASH}\n".encode() if "/refs/" in path else content
    assert is_git_data(path, Kind.FILE, 0o444, content, deleted=False)
    assert is_git_data(path, Kind.FILE, 0o444, content, deleted=False, modified=True) is allowed


def test_the_policys_own_list_wins_over_git_data() -> None:
    ref = Change(
        ".git/refs/heads/main", Action.MODIFIED, Kind.FILE, "a", "b", 41, 41, 0o644, 0o644, f"{HASH}\n".encode()
    )
    assert not is_protected_change(ref, (".vscode",), git_data=True)
    assert is_protected_change(ref, (".git/refs",), git_data=True), "a policy listing .git/refs keeps it"
    assert is_protected_change(ref, (".vscode",), git_data=False), "without git_data all of .git is protected"


# A real repository, copied; a real `git commit` in the copy, beside each attempt.
pytestmark = requires_root
HOOK = "touch {marker}; false"


def dev_git(folder: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """git as the developer runs it on the host: no -c, their own HOME, no system config."""
    assert GIT is not None
    return subprocess.run(
        [GIT, *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=git_env(home, folder.parent),
    )


def first_commit(ws: Pinned, home: Path, *then: str) -> None:
    """The developer's repository: one commit (and `then`, a git command run after it)."""
    steps = [
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["-c", "user.name=d", "-c", "user.email=d@x", "commit", "-qm", "first"],
    ]
    for step in [*steps, list(then)] if then else steps:
        assert dev_git(ws.path, *step, home=home).returncode == 0, step


def commit_in(ws: Path, copy: Path, home: Path, *, init: bool = False) -> None:
    """A real `git commit` of a changed a.py, as a server does in its copy: made in a plain folder holding the
    workspace (git needs a working directory it can name; the copy's tmpfs is mounted nowhere), then laid over the
    copy as git left it."""
    scratch = home.parent / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(ws, scratch, symlinks=True)
    (scratch / "a.py").write_text("x = 2\n")
    steps = [["add", "a.py"], ["commit", "-q", "-m", "agent"]]
    for step in [["init", "-q", "-b", "main"], *steps] if init else steps:
        argv = ["git", "-c", "safe.directory=*", "-c", "user.name=a", "-c", "user.email=a@x", *step]
        env = git_env(home, scratch.parent)
        done = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, timeout=60, check=False, env=env)
        assert done.returncode == 0, done.stderr
    shutil.copytree(scratch, copy, symlinks=True, dirs_exist_ok=True)


def evil_store(copy: Path, marker: Path) -> Path:
    """A git directory beside the workspace's whose config runs `touch marker` (core.fsmonitor)."""
    evil = copy / "evil"
    (evil / "objects").mkdir(parents=True)
    (evil / "refs" / "heads").mkdir(parents=True)
    (evil / "config").write_text(f'[core]\n\tfsmonitor = "{HOOK.format(marker=marker)}"\n')
    return evil


def config(copy: Path, marker: Path) -> None:
    with (copy / ".git" / "config").open("a") as file:
        file.write(f'\tfsmonitor = "{HOOK.format(marker=marker)}"\n')


def hook(copy: Path, marker: Path) -> None:
    (copy / ".git" / "hooks").mkdir(exist_ok=True)
    (copy / ".git" / "hooks" / "post-checkout").write_text(f"#!/bin/sh\n{HOOK.format(marker=marker)}\n")
    (copy / ".git" / "hooks" / "post-checkout").chmod(0o755)


def commondir(copy: Path, marker: Path) -> None:
    evil_store(copy, marker)
    (copy / ".git" / "commondir").write_text("../evil\n")


def alternates(copy: Path, marker: Path) -> None:
    evil_store(copy, marker)
    (copy / ".git" / "objects" / "info").mkdir(exist_ok=True)
    (copy / ".git" / "objects" / "info" / "alternates").write_text(f"{copy / 'evil' / 'objects'}\n")


def ref_holding_a_path(copy: Path, marker: Path) -> None:
    (copy / ".git" / "refs" / "heads" / "evil").write_text("../../evil\n")


def head_out_of_refs(copy: Path, marker: Path) -> None:
    (copy / ".git" / "HEAD").write_text("ref: ../../x\n")


def symlink_in_refs(copy: Path, marker: Path) -> None:
    (copy / ".git" / "refs" / "heads" / "link").symlink_to("/etc/passwd")


def odd_packed_refs(copy: Path, marker: Path) -> None:
    head = (copy / ".git" / "refs" / "heads" / "main").read_text().strip()
    (copy / ".git" / "packed-refs").write_text(f"{head} refs/heads/x\n[core]\n\tfsmonitor = {marker}\n")


def index_symlink(copy: Path, marker: Path) -> None:
    (copy / ".git" / "index").unlink()
    (copy / ".git" / "index").symlink_to("/etc/passwd")


def new_name(copy: Path, marker: Path) -> None:
    (copy / ".git" / "hooks2").write_text(f"#!/bin/sh\n{HOOK.format(marker=marker)}\n")


def case_variant(copy: Path, marker: Path) -> None:
    (copy / ".GIT" / "objects" / "ab").mkdir(parents=True)
    (copy / ".GIT" / "objects" / "ab" / HASH[2:]).write_bytes(ZLIB)


def rewritten_object(copy: Path, marker: Path) -> None:
    """A pack the workspace has, given another content (still a pack's magic) under its hash."""
    pack = next((copy / ".git" / "objects" / "pack").glob("*.pack"))
    pack.chmod(0o644)
    pack.write_bytes(b"PACK\x00\x00\x00\x02")
    pack.chmod(0o444)


def forged_object(copy: Path, marker: Path) -> None:
    """A new loose object under another content's name: `git show` would display what no tree holds."""
    (copy / ".git" / "objects" / "ab").mkdir(exist_ok=True)
    (copy / ".git" / "objects" / "ab" / HASH[2:]).write_bytes(zlib.compress(b"blob 5\x00hello"))
    (copy / ".git" / "objects" / "ab" / HASH[2:]).chmod(0o444)


def replace_ref(copy: Path, marker: Path) -> None:
    head = (copy / ".git" / "refs" / "heads" / "main").read_text()
    (copy / ".git" / "refs" / "replace").mkdir()
    (copy / ".git" / "refs" / "replace" / head.strip()).write_text(head)


def index_hiding_a_file(copy: Path, marker: Path) -> None:
    """The index the commit wrote, its first entry marked assume-unchanged (its checksum made again)."""
    body = bytearray((copy / ".git" / "index").read_bytes()[:-20])
    body[12 + 40 + 20] |= 0x80
    (copy / ".git" / "index").write_bytes(bytes(body) + hashlib.sha1(body, usedforsecurity=False).digest())


def executable_object(copy: Path, marker: Path) -> None:
    """The empty blob, its content its name, but executable."""
    (copy / LOOSE).parent.mkdir(exist_ok=True)
    (copy / LOOSE).write_bytes(ZLIB)
    (copy / LOOSE).chmod(0o755)


def reflog_as_a_repository(copy: Path, marker: Path) -> None:
    """`logs/refs/x` laid out as a repository (HEAD, objects, refs, config): a person entering it would run it."""
    at = copy / ".git" / "logs" / "refs" / "x"
    evil = evil_store(copy, marker)
    shutil.copytree(evil, at)
    (at / "HEAD").write_text("")


def nested_repository(copy: Path, marker: Path) -> None:
    shutil.copytree(copy / ".git", copy / "sub" / ".git")


def deletes_objects_and_head(copy: Path, marker: Path) -> None:
    shutil.rmtree(copy / ".git" / "objects" / "pack")
    (copy / ".git" / "HEAD").unlink()


def git_file_in_place(copy: Path, marker: Path) -> None:
    evil_store(copy, marker)
    (copy / "evil" / "HEAD").write_text("ref: refs/heads/main\n")
    shutil.rmtree(copy / ".git")
    (copy / ".git").write_text("gitdir: evil\n")


def shallow_and_state(copy: Path, marker: Path) -> None:
    (copy / ".git" / "shallow").write_text((copy / ".git" / "refs" / "heads" / "main").read_text())
    (copy / ".git" / "sequencer").mkdir()
    (copy / ".git" / "sequencer" / "todo").write_text(f"exec {HOOK.format(marker=marker)}\n")


P = Refusal.PROTECTED
CASES: list[tuple[Callable[[Path, Path], None], dict[str, Refusal]]] = [
    (config, {".git/config": P}),
    (hook, {".git/hooks/post-checkout": P}),
    (commondir, {".git/commondir": P}),
    (alternates, {".git/objects/info/alternates": P}),
    (ref_holding_a_path, {".git/refs/heads/evil": P}),
    (head_out_of_refs, {".git/HEAD": P}),
    (symlink_in_refs, {".git/refs/heads/link": Refusal.SYMLINK}),
    (odd_packed_refs, {".git/packed-refs": P}),
    (index_symlink, {".git/index": Refusal.SYMLINK}),
    (new_name, {".git/hooks2": P}),
    (case_variant, {p: P for p in (".GIT", ".GIT/objects", ".GIT/objects/ab", f".GIT/objects/ab/{HASH[2:]}")}),
    (rewritten_object, {".git/objects/pack/pack-*.pack": P}),
    (forged_object, {f".git/objects/ab/{HASH[2:]}": P}),
    (replace_ref, {".git/refs/replace": P, ".git/refs/replace/*": P}),
    (index_hiding_a_file, {".git/index": P}),
    (executable_object, {LOOSE: P}),
    (nested_repository, {"sub/.git": P, "sub/.git/HEAD": P}),
    (reflog_as_a_repository, {".git/logs/refs/x": Refusal.GIT_DIRECTORY, ".git/logs/refs/x/config": P}),
    (deletes_objects_and_head, {".git/HEAD": P}),
    (shallow_and_state, {".git/shallow": P, ".git/sequencer": P, ".git/sequencer/todo": P}),
]


@pytest.mark.parametrize(("hostile", "expected"), CASES, ids=[case.__name__ for case, _ in CASES])
def test_a_commit_lands_and_nothing_else_of_git_does(
    tmp_path: Path, hostile: Callable[[Path, Path], None], expected: dict[str, Refusal]
) -> None:
    if GIT is None:
        pytest.skip("git is not installed on this host")
    marker, home = tmp_path / "ran", tmp_path / "home"
    home.mkdir()
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws:
        first_commit(ws, home, "gc", "-q")
        with copied(ws) as (view, originals, copy):
            commit_in(ws.path, copy, home)
            hostile(copy, marker)
            view.freeze()
            changes = read_changes(view.mount_fd, originals, GIT_DATA, ws.fd)
        why = refused(changes)
        for pattern, reason in expected.items():
            matching = [path for path in why if fnmatch.fnmatchcase(path, pattern)]
            assert matching and all(why[path] is reason for path in matching), (pattern, why)
        assert all(reason in (P, Refusal.SYMLINK, Refusal.GIT_DIRECTORY) for reason in why.values()), why
        landing = {change.path for change in changes.changes}
        assert {".git/refs/heads/main", ".git/logs/HEAD", "a.py"} <= landing, landing
        assert not any(
            p.startswith((".git/hooks", ".git/config", ".git/commondir", ".git/objects/info/alt")) for p in landing
        )
        assert all(p.startswith((".git/", "evil")) or p in ("a.py", "sub") for p in landing), landing
        assert apply_changes(ws.fd, changes, git_data=True).applied
        assert dev_git(ws.path, "log", "--format=%s", home=home).stdout.split() == ["agent", "first"]
        status = dev_git(ws.path, "status", "--porcelain", home=home)
        assert status.returncode == 0, status.stderr
        if ".git/index" in landing:
            assert "a.py" not in status.stdout, "the workspace, the index and HEAD agree"
        fsck = dev_git(ws.path, "fsck", "--strict", home=home)
        assert fsck.returncode == 0, fsck.stderr
        for folder in (ws.path / "evil", ws.path / ".git" / "logs" / "refs" / "x"):
            if folder.is_dir():
                dev_git(folder, "status", home=home)
        assert not marker.exists(), "git on the host ran a command the copy wrote"
        assert not (ws.path / ".git" / "commondir").exists() and not (ws.path / ".git" / "hooks2").exists()
        assert not (ws.path / ".git" / "objects" / "info" / "alternates").exists()
        assert (ws.path / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
        modes = {stat.S_IMODE(p.lstat().st_mode) for p in (ws.path / ".git").rglob("*")}
        assert not any(mode & 0o022 for mode in modes), sorted(map(oct, modes))


def test_without_git_data_or_its_own_folder_nothing_of_git_lands(tmp_path: Path) -> None:
    """A declared tool's rules, a `.git` the run replaced with a `gitdir:` file, a `.git` the run made."""
    if GIT is None:
        pytest.skip("git is not installed on this host")
    home = tmp_path / "home"
    home.mkdir()
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws:
        first_commit(ws, home)
        with copied(ws) as (view, originals, copy):
            commit_in(ws.path, copy, home)
            view.freeze()
            plain = read_changes(view.mount_fd, originals, ChangeRules(), ws.fd)
        assert {c.path for c in plain.changes} == {"a.py"}, "a declared tool's run commits nothing"
        assert not apply_changes(ws.fd, with_head(plain), git_data=False).applied, "nor does its apply"
        with copied(ws) as (view, originals, copy):
            git_file_in_place(copy, tmp_path / "ran")
            view.freeze()
            swapped = read_changes(view.mount_fd, originals, GIT_DATA, ws.fd)
        assert not any(c.path.startswith(".git") for c in swapped.changes), swapped.changes
    (tmp_path / "fresh").mkdir()
    with workspace(tmp_path / "fresh", {"a.py": b"x = 1\n"}) as ws, copied(ws) as (view, originals, copy):
        commit_in(ws.path, copy, home, init=True)
        view.freeze()
        made = read_changes(view.mount_fd, originals, GIT_DATA, ws.fd)
        assert {c.path for c in made.changes} == {"a.py"}, "a repository the run made is not the workspace's own"
        assert made.refused and all(entry.why is P for entry in made.refused)


def with_head(changes: ChangeSet) -> ChangeSet:
    """A set built by hand holding a change of `.git/HEAD`: apply_changes judges it again."""
    head = Change(".git/HEAD", Action.MODIFIED, Kind.FILE, "x", "y", 21, 21, 0o644, 0o644, b"ref: refs/heads/main\n")
    return ChangeSet((*changes.changes, head), changes.refused)


def test_apply_judges_git_data_again_for_a_set_built_by_hand(tmp_path: Path) -> None:
    with workspace(tmp_path, {".git/HEAD": b"ref: refs/heads/main\n"}) as ws:
        bad = Change(".git/HEAD", Action.MODIFIED, Kind.FILE, "x", "y", 21, 13, 0o644, 0o644, b"ref: ../../x\n")
        result = apply_changes(ws.fd, ChangeSet((bad,), ()), git_data=True)
        assert (result.applied, result.reason, result.conflicts) == (False, "changes_protected", (".git/HEAD",))
        config = Change(".git/config", Action.ADDED, Kind.FILE, None, "y", None, 8, None, 0o644, b"[core]\n")
        assert apply_changes(ws.fd, ChangeSet((config,), ()), git_data=True).reason == "changes_protected"
        assert (ws.path / ".git" / "HEAD").read_bytes() == b"ref: refs/heads/main\n"
        assert not os.path.exists(ws.path / ".git" / "config")
