"""What a writing run may change (decision 78): git's control files, what the run could not read, modes.

In process, on a real copy in a real tmpfs, changed through its fd as a run would change it (the
runs themselves, through the sandbox, are in test_workspace_runs.py). Each case was applied before:
`.git/commondir`, a `gitdir:` file or a bare repository's `config` made the developer's next
`git status` run the run's command; a 0600 `.env` the run unlinked reached the patch and was
deleted; a run made `.git` and a file world-writable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.apply import apply_changes
from sandbox.backends.view import WorkspaceView
from sandbox.change_set import Action, ChangeRules, ChangeSet, Refusal, git_folders, read_changes
from sandbox.limits import BACKENDS, Backend
from sandbox.patch import render_patch, summarize
from sandbox.pinned import Pinned, pin
from sandbox.workspace_copy import Kind, Originals, Owner, copy_workspace
from tests.sandbox.confined_child import requires_root, shared_dir, users_project
from tests.sandbox.test_workspace_changes import changes_of, copied, workspace
from tests.sandbox.test_workspace_runs import ROOTLESS_UID, as_user, run

pytestmark = requires_root

GIT = shutil.which("git")
MARK = "MARK"
"""Replaced by the path a hostile config's command would create."""
REPOSITORY = {
    ".git/HEAD": b"ref: refs/heads/main\n",
    ".git/config": b"[core]\n\trepositoryformatversion = 0\n\tbare = false\n",
    ".git/objects/.keep": b"",
    ".git/refs/heads/.keep": b"",
    "a.py": b"x = 1\n",
    "sub/b.py": b"y = 1\n",
}


def git_directory(at: Path, marker: Path, *, head: bool = True) -> None:
    """A git directory whose config runs `touch marker` at the next `git status` (core.fsmonitor)."""
    (at / "objects").mkdir(parents=True)
    (at / "refs" / "heads").mkdir(parents=True)
    if head:
        (at / "HEAD").write_text("ref: refs/heads/main\n")
    (at / "config").write_text(f'[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch {marker}; false"\n')


def refused(changes: ChangeSet) -> dict[str, Refusal]:
    return {entry.path: entry.why for entry in changes.refused}


def applied_paths(changes: ChangeSet) -> set[str]:
    return {change.path for change in changes.changes}


def commondir(copy: Path, marker: Path) -> None:
    (copy / ".git" / "commondir").write_text("../evil\n")
    git_directory(copy / "evil", marker, head=False)


def gitdir_file(copy: Path, marker: Path) -> None:
    (copy / "sub" / ".git").write_text("gitdir: ../evil\n")
    git_directory(copy / "evil", marker)


def git_file_in_place_of_the_folder(copy: Path, marker: Path) -> None:
    shutil.rmtree(copy / ".git")
    (copy / ".git").write_text("gitdir: evil\n")
    git_directory(copy / "evil", marker)


def nested_repository(copy: Path, marker: Path) -> None:
    git_directory(copy / "sub" / ".git", marker)


def bare_repository(copy: Path, marker: Path) -> None:
    git_directory(copy / "sub", marker)


def worktree_commondir(copy: Path, marker: Path) -> None:
    (copy / ".git" / "worktrees" / "w").mkdir(parents=True)
    (copy / ".git" / "worktrees" / "w" / "commondir").write_text("../../../evil\n")
    git_directory(copy / "evil", marker, head=False)


def attributes(copy: Path, marker: Path) -> None:
    (copy / ".git" / "info").mkdir()
    (copy / ".git" / "info" / "attributes").write_text("*.py filter=evil\n")


def case_folded(copy: Path, marker: Path) -> None:
    git_directory(copy / "sub" / ".GIT", marker)


def world_writable_git(copy: Path, marker: Path) -> None:
    os.chmod(copy / ".git", 0o777)  # noqa: S103  (the hostile mode under test)
    os.chmod(copy / ".git" / "objects", 0o777)  # noqa: S103


EVIL = ("evil", "evil/config", "evil/objects", "evil/refs", "evil/refs/heads")
EVIL_GIT_DIRECTORY = {p: Refusal.GIT_DIRECTORY for p in (*EVIL, "evil/HEAD")}
ANY_PROTECTED: dict[str, Refusal] = {}


@pytest.mark.parametrize(
    ("hostile", "expected_refused", "expected_applied"),
    [
        # git reads config and hooks from the folder .git/commondir names: the file is refused; a folder
        # with no HEAD is no repository, so what is in it may land and does nothing.
        (commondir, {".git/commondir": Refusal.PROTECTED}, set(EVIL)),
        (gitdir_file, {"sub/.git": Refusal.PROTECTED, **EVIL_GIT_DIRECTORY}, set()),
        (git_file_in_place_of_the_folder, ANY_PROTECTED, set()),
        (nested_repository, ANY_PROTECTED, set()),
        (
            bare_repository,
            {p.replace("evil", "sub"): why for p, why in EVIL_GIT_DIRECTORY.items() if p != "evil"},
            set(),
        ),
        (worktree_commondir, ANY_PROTECTED, set(EVIL)),
        (attributes, {".git/info": Refusal.PROTECTED, ".git/info/attributes": Refusal.PROTECTED}, set()),
        (case_folded, ANY_PROTECTED, set()),
        (world_writable_git, {".git": Refusal.PROTECTED, ".git/objects": Refusal.PROTECTED}, set()),
    ],
)
def test_nothing_git_would_read_as_a_repository_changes(
    tmp_path: Path,
    hostile: Callable[[Path, Path], None],
    expected_refused: dict[str, Refusal],
    expected_applied: set[str],
) -> None:
    marker = tmp_path / "ran"
    with workspace(tmp_path, REPOSITORY) as ws:
        before = snapshot(ws.path / ".git")
        with copied(ws) as (view, originals, copy):
            hostile(copy, marker)
            changes = changes_of(view, originals, ws)
        why = refused(changes)
        if expected_refused is ANY_PROTECTED:
            assert why and all(reason in (Refusal.PROTECTED, Refusal.GIT_DIRECTORY) for reason in why.values()), why
        else:
            assert why == expected_refused
        assert applied_paths(changes) == expected_applied
        assert not any(".git" in p.lower().split("/") or p.startswith("sub") for p in applied_paths(changes))
        assert apply_changes(ws.fd, changes).applied
        assert snapshot(ws.path / ".git") == before, "nothing of .git changed"
        if GIT is not None:  # what a developer does next, outside any sandbox
            for folder in (ws.path, ws.path / "sub", ws.path / "evil"):
                if folder.is_dir():
                    subprocess.run(
                        [GIT, "status", "--short"],
                        cwd=folder,
                        capture_output=True,
                        check=False,
                        timeout=60,
                        env=git_env(tmp_path, ws.path.parent),
                    )
            assert not marker.exists(), "git ran a command the run wrote"


def git_env(home: Path, ceiling: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(ceiling),
    }


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (stat.S_IMODE(p.lstat().st_mode), p.read_bytes() if p.is_file() else b"")
        for p in (folder, *folder.rglob("*"))
    }


def test_the_review_finding_runs_nothing_on_the_hosts_next_git_status(tmp_path: Path) -> None:
    """The review's reproduction with a real repository: `.git/commondir` -> `../evil`, its config's fsmonitor."""
    if GIT is None:
        pytest.skip("git is not installed on this host")
    marker = tmp_path / "ran"
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws:
        subprocess.run([GIT, "init", "-q", str(ws.path)], check=True, timeout=60)
        with copied(ws) as (view, originals, copy):
            commondir(copy, marker)
            (copy / "evil" / "HEAD").write_text("ref: refs/heads/main\n")  # and with a HEAD: a repository
            changes = changes_of(view, originals, ws)
        assert refused(changes) == {".git/commondir": Refusal.PROTECTED, **EVIL_GIT_DIRECTORY}
        assert apply_changes(ws.fd, changes).applied
        subprocess.run([GIT, "status"], cwd=ws.path, capture_output=True, check=True, timeout=60)
        assert not marker.exists()
        assert not (ws.path / ".git" / "commondir").exists()


def test_a_bare_repository_already_in_the_workspace_keeps_its_config_and_its_folders(tmp_path: Path) -> None:
    files = {"fixtures/repo.git/HEAD": b"ref: refs/heads/main\n", "fixtures/repo.git/config": b"[core]\n", "a.py": b"x"}
    with workspace(tmp_path, files) as ws, copied(ws) as (view, originals, copy):
        (copy / "fixtures" / "repo.git" / "config").write_text('[core]\n\tfsmonitor = "evil"\n')
        (copy / "fixtures" / "repo.git" / "hooks").mkdir()
        (copy / "a.py").write_bytes(b"y")
        changes = changes_of(view, originals, ws)
        assert refused(changes) == {
            "fixtures/repo.git/config": Refusal.GIT_DIRECTORY,
            "fixtures/repo.git/hooks": Refusal.GIT_DIRECTORY,
        }
        assert applied_paths(changes) == {"a.py"}
    (tmp_path / "again").mkdir()
    with workspace(tmp_path / "again", files) as ws, copied(ws) as (view, originals, copy):
        shutil.rmtree(copy / "fixtures")
        changes = changes_of(view, originals, ws)
        assert applied_paths(changes) == set(), "a folder holding a repository is not deleted, nor anything of it"
        assert refused(changes)["fixtures"] is Refusal.PROTECTED
        assert apply_changes(ws.fd, changes).applied
        assert (ws.path / "fixtures" / "repo.git" / "config").read_bytes() == b"[core]\n"


@pytest.mark.parametrize(
    ("present", "folders"),
    [
        ([".git/HEAD", "a.py"], {".git"}),
        (["repo.git/HEAD", "repo.git/config"], {"repo.git"}),
        (["HEAD"], {""}),  # the workspace itself laid out as a repository: nothing of it changes
        (["x/head"], {"x"}),  # a folder that folds case finds `head` for `HEAD`
        (["x/HEADS", "x/HEAD.txt"], set()),
    ],
)
def test_a_folder_holding_a_head_is_a_git_folder(present: list[str], folders: set[str]) -> None:
    assert git_folders(present) == folders


# What the run could not read (a copy given to a pool uid, as a root gateway gives it).
RUN = Owner(64071, 64071)
DEVELOPER = 1000
"""A developer's uid, outside the pool runs get theirs from (61000-61999, sandbox/backends/identity.py)."""


@contextlib.contextmanager
def copied_for(ws: Pinned, owner: Owner) -> Iterator[tuple[WorkspaceView, Originals, Path]]:
    """The workspace copied as a root gateway copies it for a run of `owner`'s uid."""
    with WorkspaceView(64 << 20, 10_000) as view:
        originals = copy_workspace(ws.fd, view.mount_fd, owner, max_entries=10_000, max_bytes=32 << 20)
        root = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=view.mount_fd)
        try:
            yield view, originals, Path(f"/proc/self/fd/{root}")
        finally:
            os.close(root)


def read_as_the_run(view: WorkspaceView, originals: Originals, ws: Pinned) -> ChangeSet:
    view.freeze()
    return read_changes(view.mount_fd, originals, ChangeRules(), ws.fd, run_owner=RUN)


SECRET = b"AWS_SECRET_ACCESS_KEY=wJalr-SECRET\n"
KEY = b"-----BEGIN OPENSSH PRIVATE KEY----- SECRET-KEY\n"


def private(ws: Path) -> None:
    """A developer's `.env` (0600) and a 0700 folder holding a key, as in their tree."""
    (ws / ".env").write_bytes(SECRET)
    (ws / "private").mkdir()
    (ws / "private" / "id_ed25519").write_bytes(KEY)
    (ws / "drop").mkdir()
    (ws / "drop" / "inbox.txt").write_bytes(b"SECRET-INBOX\n")
    (ws / "conf").mkdir(mode=0o755)
    (ws / "conf" / "a.py").write_bytes(b"a = 1\n")
    (ws / "conf" / ".env").write_bytes(SECRET)
    for path, mode in ((".env", 0o600), ("private", 0o700), ("private/id_ed25519", 0o600), ("drop", 0o733)):
        os.chown(ws / path, DEVELOPER, DEVELOPER)
        os.chmod(ws / path, mode)
    (ws / "drop" / "inbox.txt").chmod(0o606)  # others may write it, not read it
    os.chmod(ws / "conf" / "a.py", 0o644)
    os.chown(ws / "conf" / ".env", DEVELOPER, DEVELOPER)
    os.chmod(ws / "conf" / ".env", 0o600)
    os.chown(ws / "drop" / "inbox.txt", DEVELOPER, DEVELOPER)


def unlink_env(copy: Path) -> None:
    (copy / ".env").unlink()


def rename_private(copy: Path) -> None:
    (copy / "private").rename(copy / "moved")


def replace_env(copy: Path) -> None:
    (copy / ".env").unlink()
    (copy / ".env").write_bytes(b"MINE=1\n")
    os.chown(copy / ".env", RUN.uid, RUN.gid)


def replace_private(copy: Path) -> None:
    (copy / "private").rename(copy / "old")
    (copy / "private").mkdir()
    (copy / "private" / "id_ed25519").write_bytes(b"mine\n")


def write_in_a_drop_box(copy: Path) -> None:
    (copy / "drop" / "new.txt").write_bytes(b"dropped\n")


def overwrite_an_unreadable_file(copy: Path) -> None:
    (copy / "drop" / "inbox.txt").write_bytes(b"overwritten without reading\n")


def move_env_into_a_new_folder(copy: Path) -> None:
    (copy / "mine").mkdir()
    (copy / ".env").rename(copy / "mine" / ".env")


def rename_env_over_a_readable_file(copy: Path) -> None:
    (copy / ".env").rename(copy / "a.py")


def delete_the_folder_holding_one(copy: Path) -> None:
    shutil.rmtree(copy / "conf")


DELETED_A = {"conf/a.py": Action.DELETED}
MINE = {"mine": Action.ADDED}


@pytest.mark.parametrize(
    ("act", "expected_refused", "expected_changes"),
    [
        (unlink_env, {".env": Refusal.NOT_READABLE}, {}),
        (rename_private, {"moved": Refusal.NOT_READABLE, "private": Refusal.NOT_READABLE}, {}),
        (replace_env, {".env": Refusal.NOT_READABLE}, {}),
        (replace_private, {"old": Refusal.NOT_READABLE, "private": Refusal.NOT_READABLE}, {}),
        (write_in_a_drop_box, {"drop": Refusal.NOT_READABLE}, {}),
        (move_env_into_a_new_folder, {".env": Refusal.NOT_READABLE, "mine/.env": Refusal.NOT_READABLE}, MINE),
        (rename_env_over_a_readable_file, {".env": Refusal.NOT_READABLE, "a.py": Refusal.NOT_READABLE}, {}),
        (overwrite_an_unreadable_file, {"drop": Refusal.NOT_READABLE}, {}),
        (delete_the_folder_holding_one, {"conf/.env": Refusal.NOT_READABLE, "conf": Refusal.NOT_READABLE}, DELETED_A),
    ],
)
def test_what_the_run_could_not_read_is_never_shown_read_or_applied(
    tmp_path: Path,
    act: Callable[[Path], None],
    expected_refused: dict[str, Refusal],
    expected_changes: dict[str, Action],
) -> None:
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws:
        ws.path.chmod(0o755)
        private(ws.path)
        with copied_for(ws, RUN) as (view, originals, copy):
            assert os.stat(copy / "a.py").st_uid == RUN.uid and os.stat(copy / ".env").st_uid == DEVELOPER
            act(copy)
            changes = read_as_the_run(view, originals, ws)
        assert refused(changes) == expected_refused
        assert {c.path: c.action for c in changes.changes} == expected_changes
        shown = render_patch(changes) + summarize(changes) + repr(changes)
        for secret in (b"SECRET", b"id_ed25519", b"inbox"):
            assert secret.decode() not in shown, "no content, and no name beneath a folder the run could not list"
        hashes = {c.sha256_before for c in changes.changes} | {c.sha256_after for c in changes.changes}
        assert originals[".env"].sha256 not in hashes
        assert apply_changes(ws.fd, changes).applied
        assert (ws.path / ".env").read_bytes() == SECRET
        assert (ws.path / "a.py").read_bytes() == b"x = 1\n"
        assert (ws.path / "private" / "id_ed25519").read_bytes() == KEY
        assert sorted(os.listdir(ws.path / "drop")) == ["inbox.txt"]
        assert (ws.path / "conf" / ".env").read_bytes() == SECRET
        assert (ws.path / "drop" / "inbox.txt").read_bytes() == b"SECRET-INBOX\n"


def test_an_untouched_unreadable_entry_is_no_change_and_the_gateways_own_run_reads_all(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws:
        ws.path.chmod(0o755)
        private(ws.path)
        with copied_for(ws, RUN) as (view, originals, copy):
            (copy / "a.py").write_bytes(b"x = 2\n")
            changes = read_as_the_run(view, originals, ws)
        assert (refused(changes), {c.path: c.action for c in changes.changes}) == ({}, {"a.py": Action.MODIFIED})
        with copied(ws) as (view, originals, copy):  # rootless: the run had the gateway's uid, which read all of it
            (copy / ".env").unlink()
            changes = changes_of(view, originals, ws)
        assert {c.path: c.action for c in changes.changes} == {".env": Action.DELETED}


def test_a_workspace_the_run_could_not_enter_changes_nothing(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a.py": b"x = 1\n"}) as ws:
        os.chown(ws.path, DEVELOPER, DEVELOPER)
        ws.path.chmod(0o750)
        with copied_for(ws, RUN) as (view, originals, copy):
            (copy / "a.py").unlink()
            (copy / "new.py").write_bytes(b"n")
            changes = read_as_the_run(view, originals, ws)
        assert changes.changes == ()
        assert refused(changes) == {"a.py": Refusal.NOT_READABLE, "new.py": Refusal.NOT_READABLE}


# Modes: no write bit for others, nor for the group where there was none.
@pytest.mark.parametrize(
    ("path", "mode", "refused_or_applied"),
    [
        ("a.py", 0o666, Refusal.WRITABLE),
        ("a.py", 0o646, Refusal.WRITABLE),
        ("a.py", 0o664, Refusal.WRITABLE),  # g+w where the file had none
        ("a.py", 0o600, Action.MODIFIED),
        ("a.py", 0o755, Action.MODIFIED),
        ("shared.py", 0o664, None),  # it had g+w: keeping it is no change
        ("shared.py", 0o660, Action.MODIFIED),
        ("shared.py", 0o666, Refusal.WRITABLE),
        ("sub", 0o777, Refusal.WRITABLE),
        ("sub", 0o775, Refusal.WRITABLE),
        ("sub", 0o700, Action.MODIFIED),
        ("group/in.py", 0o666, Refusal.WRITABLE),
    ],
)
def test_a_mode_giving_write_to_others_or_newly_to_the_group_is_refused(
    tmp_path: Path, path: str, mode: int, refused_or_applied: Refusal | Action | None
) -> None:
    files = {"a.py": b"x", "shared.py": b"s", "sub/b.py": b"b", "group/in.py": b"i"}
    with workspace(tmp_path, files) as ws:
        (ws.path / "sub").chmod(0o755)
        (ws.path / "shared.py").chmod(0o664)
        (ws.path / "group").chmod(0o775)
        with copied(ws) as (view, originals, copy):
            os.chmod(copy / path, mode)
            changes = changes_of(view, originals, ws)
        if isinstance(refused_or_applied, Refusal):
            assert (refused(changes), changes.changes) == ({path: refused_or_applied}, ())
            assert f"{path} (group_or_world_writable)" in render_patch(changes)
        elif refused_or_applied is None:
            assert changes.is_empty
        else:
            assert [(c.path, c.action) for c in changes.changes] == [(path, refused_or_applied)]
        before = {p: stat.S_IMODE((ws.path / p).stat().st_mode) for p in files}
        assert apply_changes(ws.fd, changes).applied
        after = {p: stat.S_IMODE((ws.path / p).stat().st_mode) for p in files}
        assert all(not mode & 0o002 for mode in after.values()) and after.keys() == before.keys()


@pytest.mark.parametrize(
    ("where", "mode", "kind", "why"),
    [
        ("new.py", 0o666, Kind.FILE, Refusal.WRITABLE),
        ("new.py", 0o664, Kind.FILE, Refusal.WRITABLE),  # the workspace's root (0755) has no g+w
        ("new.py", 0o644, Kind.FILE, None),
        ("group/new.py", 0o664, Kind.FILE, None),  # added in a folder that had g+w: a group's shared tree
        ("group/new.py", 0o666, Kind.FILE, Refusal.WRITABLE),
        ("newdir", 0o777, Kind.FOLDER, Refusal.WRITABLE),
        ("newdir", 0o1777, Kind.FOLDER, Refusal.WRITABLE),
        ("group/newdir", 0o775, Kind.FOLDER, None),
    ],
)
def test_an_added_entry_may_not_be_writable_by_others(
    tmp_path: Path, where: str, mode: int, kind: Kind, why: Refusal | None
) -> None:
    with workspace(tmp_path, {"group/in.py": b"i"}) as ws:
        ws.path.chmod(0o755)
        (ws.path / "group").chmod(0o775)
        with copied(ws) as (view, originals, copy):
            if kind is Kind.FOLDER:
                (copy / where).mkdir()
            else:
                (copy / where).write_bytes(b"n")
            os.chmod(copy / where, mode)
            changes = changes_of(view, originals, ws)
        if why is None:
            assert [(c.path, c.action, c.mode_after) for c in changes.changes] == [(where, Action.ADDED, mode & 0o777)]
        else:
            assert (refused(changes), changes.changes) == ({where: why}, ())


# The same through real runs, root and rootless, both backends.
HOSTILE_RUN = """
import json, os, pathlib
def repository(at, head=True):
    os.makedirs(f"{at}/objects"); os.makedirs(f"{at}/refs/heads")
    if head:
        pathlib.Path(f"{at}/HEAD").write_text("ref: refs/heads/main\\n")
    pathlib.Path(f"{at}/config").write_text('[core]\\n\\tfsmonitor = "touch MARK; false"\\n')
steps = {
    "commondir": lambda: pathlib.Path(".git/commondir").write_text("../evil\\n"),
    "evil": lambda: repository("evil"),
    "gitdir": lambda: pathlib.Path("sub/.git").write_text("gitdir: ../evil\\n"),
    "bare": lambda: repository("bare"),
    "git_mode": lambda: os.chmod(".git", 0o777),
    "wide": lambda: os.chmod("a.py", 0o666),
    "read_env": lambda: open(".env").read(),
    "env": lambda: os.unlink(".env"),
    "private": lambda: os.rename("private", "moved"),
}
done = {}
for name, step in steps.items():
    try:
        step()
        done[name] = "ok"
    except OSError as exc:
        done[name] = exc.strerror
pathlib.Path("made.txt").write_text("made\\n")
print(json.dumps(done))
"""
GIT_REFUSED = {
    ".git": "protected_path",
    ".git/commondir": "protected_path",
    "sub/.git": "protected_path",
    **{path: "git_directory" for path in (*EVIL, "evil/HEAD")},
    **{path.replace("evil", "bare"): "git_directory" for path in (*EVIL, "evil/HEAD")},
    "a.py": "group_or_world_writable",
}


def hostile_project(ws: Path) -> None:
    """A repository with a `.env` and a folder holding a key, beside what everyone may read (all 0644 or 0755)."""
    for folder in (".git/objects", ".git/refs/heads", "sub", "private"):
        (ws / folder).mkdir(parents=True, exist_ok=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / ".git" / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (ws / "a.py").write_text("x = 1\n")
    (ws / ".env").write_bytes(SECRET)
    (ws / "private" / "id_ed25519").write_bytes(KEY)
    for path in (ws, *ws.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


def developers_own(ws: Path) -> None:
    """The `.env` (0600) and the folder (0700) made the developer's: a root gateway's run cannot read them."""
    for name, mode in ((".env", 0o600), ("private", 0o700), ("private/id_ed25519", 0o600)):
        os.chown(ws / name, DEVELOPER, DEVELOPER)
        (ws / name).chmod(mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_root_gateways_run_changes_no_git_control_nothing_it_could_not_read_and_no_mode_to_writable(
    backend: Backend,
) -> None:
    with shared_dir() as folder:
        ws = folder / "ws"
        ws.mkdir()
        hostile_project(ws)
        developers_own(ws)
        (folder / "scratch").mkdir()
        pinned = pin(ws)
        try:
            result = run(folder, pinned, HOSTILE_RUN.replace("MARK", str(folder / "ran")), backend)
            done = json.loads((folder / "out").read_text())
            assert done["read_env"] == "Permission denied" and done["env"] == "ok" and done["private"] == "ok", done
            assert result.changes is not None
            assert {c.path: c.action for c in result.changes.changes} == {"made.txt": Action.ADDED}
            assert {r.path: str(r.why) for r in result.changes.refused} == GIT_REFUSED | {
                ".env": "not_readable_by_the_run",
                "private": "not_readable_by_the_run",
                "moved": "not_readable_by_the_run",
            }
            assert "SECRET" not in render_patch(result.changes) and "id_ed25519" not in render_patch(result.changes)
            assert apply_changes(pinned.fd, result.changes).applied
        finally:
            pinned.close()
        assert (ws / ".env").read_bytes() == SECRET and (ws / "private" / "id_ed25519").read_bytes() == KEY
        assert sorted(os.listdir(ws)) == [".env", ".git", "a.py", "made.txt", "private", "sub"]
        assert sorted(os.listdir(ws / ".git")) == ["HEAD", "config", "objects", "refs"]
        assert stat.S_IMODE((ws / ".git").stat().st_mode) == 0o755
        assert stat.S_IMODE((ws / "a.py").stat().st_mode) == 0o644
        if GIT is not None:
            subprocess.run(
                [GIT, "status"], cwd=ws, capture_output=True, check=False, timeout=60, env=git_env(folder, folder)
            )
            assert not (folder / "ran").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_run_changes_no_git_control_and_no_mode_to_writable(backend: Backend) -> None:
    """Rootless, the run has the gateway's uid: what the gateway could copy, the run could read."""
    with users_project({}, ROOTLESS_UID) as folder:
        hostile_project(folder / "ws")
        for path in (folder, *folder.rglob("*")):
            os.chown(path, ROOTLESS_UID, ROOTLESS_UID)
        (folder / "ws" / ".env").chmod(0o600)  # the gateway's user's own: the run (that uid) reads it
        seen = as_user(HOSTILE_RUN.replace("MARK", str(folder / "ran")), folder, backend)
        assert seen["exit_code"] == 0, seen
        done = json.loads(seen["stdout"].splitlines()[-1])
        assert done["read_env"] == "ok", "the run has the gateway's uid: the file is its own"
        assert dict(map(tuple, seen["refused"])) == GIT_REFUSED
        assert dict(map(tuple, seen["changes"])) == {
            ".env": "deleted",
            "made.txt": "added",
            "moved": "added",
            "moved/id_ed25519": "added",
            "private/id_ed25519": "deleted",
            "private": "deleted",
        }
        assert seen["applied"] is True
        ws = folder / "ws"
        assert sorted(os.listdir(ws / ".git")) == ["HEAD", "config", "objects", "refs"]
        assert not (ws / "bare").exists() and not (ws / "sub" / ".git").exists()
        assert stat.S_IMODE((ws / "a.py").stat().st_mode) == 0o644


@pytest.mark.parametrize("hidden", [".env", "private"])
def test_a_rootless_gateway_cannot_copy_what_it_cannot_read_and_runs_nothing(hidden: str) -> None:
    with users_project({"a.py": "x = 1\n"}, ROOTLESS_UID) as folder:
        (folder / "ws" / ".env").write_bytes(SECRET)
        (folder / "ws" / "private").mkdir()
        (folder / "ws" / "private" / "id_ed25519").write_bytes(KEY)
        (folder / "ws" / hidden).chmod(
            0o700 if hidden == "private" else 0o600
        )  # root's: the gateway's uid cannot read it
        for other in {".env", "private", "private/id_ed25519"} - {hidden}:
            os.chown(folder / "ws" / other, ROOTLESS_UID, ROOTLESS_UID)
        marker = folder / "outside" / "ran"
        seen = as_user(f"open({str(marker)!r}, 'w')", folder, "native")
        assert seen == {"rootless": True, "start_error": "workspace_copy_failed"}
        assert not marker.exists() and (folder / "ws" / ".env").read_bytes() == SECRET
        assert (folder / "ws" / "private" / "id_ed25519").read_bytes() == KEY


def test_a_file_added_in_a_folder_refused_for_its_mode_lands_in_a_folder_writable_by_no_one_else(
    tmp_path: Path,
) -> None:
    """The folder is made as applying makes any missing one: 0755 less the gateway's umask."""
    with workspace(tmp_path, {"a.py": b"x"}) as ws:
        ws.path.chmod(0o755)
        with copied(ws) as (view, originals, copy):
            (copy / "gen").mkdir()
            (copy / "gen" / "out.py").write_bytes(b"generated\n")
            (copy / "gen").chmod(0o777)
            changes = changes_of(view, originals, ws)
        assert refused(changes) == {"gen": Refusal.WRITABLE}
        assert [(c.path, c.action) for c in changes.changes] == [("gen/out.py", Action.ADDED)]
        assert apply_changes(ws.fd, changes).applied
        assert not stat.S_IMODE((ws.path / "gen").stat().st_mode) & 0o022
        assert (ws.path / "gen" / "out.py").read_bytes() == b"generated\n"
