"""Long-lived confined servers (sandbox/server.py, decision 83): real processes over real pipes, root and rootless, both backends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from sandbox import probe_host
from sandbox.backends import pidns
from sandbox.backends.containment import owned_by
from sandbox.change_set import DEFAULT_PROTECTED, Refusal
from sandbox.errors import SandboxStartError
from sandbox.layers import Layer
from sandbox.limits import BACKENDS, Backend
from sandbox.pinned import Pinned
from sandbox.server import ConfinedServer, ServerSpec, start_server
from tests.deadlines import scaled
from tests.harness import REPO
from tests.sandbox.confined_child import DAEMONIZE, project, requires_root, users_project
from tests.sandbox.server_child import LINE_SERVER, PYTHON, Talk, server_limits

pytestmark = requires_root

CHILD = str(REPO / "tests" / "sandbox" / "server_child.py")
GONE_WITHIN_S = pidns.WATCHDOG_GRACE_S + 10.0  # the watchdog's grace, and a busy machine's margin


def skip_without(backend: Backend) -> None:
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.skip("bubblewrap does not run here")


@contextlib.asynccontextmanager
async def serving(
    folder: Path, ws: Pinned, backend: Backend, *, writable: bool = False, **over: Any
) -> AsyncIterator[tuple[ConfinedServer, Talk]]:
    limits = server_limits(folder / "scratch", backend, **over)
    spec = ServerSpec((PYTHON, "-I", "-c", LINE_SERVER), ws, writable, DEFAULT_PROTECTED, limits)
    async with start_server(spec, scratch=folder / "scratch") as server:
        yield server, Talk(server)


def alive(pids: list[int]) -> list[int]:
    living = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
    return living


def family(pid: int) -> list[int]:
    """`pid` and every process beneath it (a confined server's daemons stay beneath its PID namespace's pid 1)."""
    try:
        return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


CONFINED = """
import socket
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
answer = {
    "cwd": os.getcwd(),
    "read": open("a.txt").read(),
    "workspace": attempt(lambda: open("a.txt", "w").write("x")),
    "new_in_workspace": attempt(lambda: open("new.txt", "w").write("x")),
    "outside": attempt(lambda: open(OUTSIDE, "w").write("x")),
    "state": attempt(lambda: open(STATE).read()),
    "network": attempt(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2)),
    "scratch": attempt(lambda: open(os.environ["TMPDIR"] + "/s.txt", "w").write("x")),
}
"""
"""Set OUTSIDE, PORT (a listener of the test's) and STATE (a file of the hidden state folder) before it."""
REFUSED_BY_CONFINEMENT = ("workspace", "new_in_workspace", "outside", "state", "network")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_answers_over_its_pipes_confined_and_lives_past_its_timeout(backend: Backend) -> None:
    skip_without(backend)
    with project({"README.md": "hello\n"}) as (folder, ws):

        async def main() -> None:
            async with serving(folder, ws, backend) as (server, talk):
                assert await talk.ask("answer = 6 * 7") == 42
                identity = await talk.ask("answer = [os.getuid(), os.getcwd(), open('README.md').read()]")
                assert identity[1:] == [str(ws.path), "hello\n"], "the workspace is its cwd, readable"
                assert identity[0] != 0, "never root"
                await anyio.sleep(2.5)  # past the limits' timeout_s (1 s) and the watchdog's grace: no deadline
                assert await talk.ask("answer = 'still here'") == "still here"
                assert server.returncode is None and server.ended_by() is None
                expected = {Layer.PID_NAMESPACE, Layer.NETWORK_NAMESPACE, Layer.SECCOMP, Layer.RLIMITS}
                assert expected <= set(server.layers)
                await server.stop()
                assert server.ended_by() == "stopped"
                await server.stop()  # idempotent
            assert server.ended_by() == "stopped"

        anyio.run(main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_writes_nowhere_reaches_no_network_and_no_hidden_state(backend: Backend) -> None:
    skip_without(backend)
    with project({"a.txt": "a\n"}) as (folder, ws), socket.create_server(("127.0.0.1", 0)) as listener:
        state = folder / "state"
        state.mkdir(mode=0o700)
        (state / "secret").write_text("s3cret")
        outside = folder / "outside.txt"
        port = listener.getsockname()[1]

        async def main() -> dict[str, Any]:
            async with serving(folder, ws, backend, hidden=(state,)) as (_, talk):
                code = f"OUTSIDE = {str(outside)!r}\nPORT = {port}\nSTATE = {str(state / 'secret')!r}\n{CONFINED}"
                answer: dict[str, Any] = await talk.ask(code)
                return answer

        seen = anyio.run(main)
        assert seen["scratch"] == "ok", seen
        assert all(seen[name] != "ok" for name in ("workspace", "new_in_workspace", "outside", "state", "network")), (
            seen
        )
        assert (ws.path / "a.txt").read_text() == "a\n" and not (ws.path / "new.txt").exists()
        assert not outside.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_kills_the_server_and_the_daemons_it_left(backend: Backend) -> None:
    skip_without(backend)
    with project({}) as (folder, ws):

        async def main() -> tuple[list[int], int]:
            async with serving(folder, ws, backend) as (server, talk):
                await talk.ask(f"exec({DAEMONIZE!r}.replace('print(', 'answer = ('))")
                started = family(server.pid)
                assert len(started) >= 3, "the supervisors, the server and its daemon"
                uid: int = psutil.Process(started[-1]).uids().real
            return started, uid

        started, uid = anyio.run(main)
        assert wait_gone(started, 5.0) == [], "nothing of the server outlives its context (SIGKILLed: dead at once)"
        assert owned_by(uid) == [] or uid == os.getuid(), "nothing of its uid is left"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_that_ends_by_itself_says_how(backend: Backend) -> None:
    skip_without(backend)
    with project({}) as (folder, ws):

        async def main() -> list[str | None]:
            seen: list[str | None] = []
            async with serving(folder, ws, backend) as (server, talk):
                await server.stdin.send(json.dumps("sys.stderr.write('dying words\\n'); os._exit(3)").encode() + b"\n")
                with anyio.fail_after(30):
                    await server.wait()
                seen.append(server.ended_by())
                with anyio.fail_after(10):
                    while "dying words" not in server.stderr_tail():
                        await anyio.sleep(0.01)
            async with serving(folder, ws, backend) as (server, talk):
                await server.stdin.send(json.dumps("os.kill(os.getpid(), 15)").encode() + b"\n")
                with anyio.fail_after(30):
                    await server.wait()
                seen.append(server.ended_by())
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await talk.ask("answer = 1")
            return seen

        assert anyio.run(main) == ["exit 3", "signal 15"] if backend == "native" else ["exit 3", "exit 143"]


def test_the_stderr_tail_is_bounded() -> None:
    with project({}) as (folder, ws):

        async def main() -> str:
            async with serving(folder, ws, "native") as (server, talk):
                await talk.ask("sys.stderr.write('x' * 100000 + 'END'); sys.stderr.flush(); answer = 1")
                with anyio.fail_after(10):
                    while not server.stderr_tail().endswith("END"):
                        await anyio.sleep(0.01)
                return server.stderr_tail()

        tail = anyio.run(main)
        assert tail.endswith("END") and len(tail) <= 4096


def test_a_server_that_cannot_start_raises_with_its_step() -> None:
    with project({}) as (folder, ws):

        async def main() -> None:
            limits = server_limits(folder / "scratch", "native")
            spec = ServerSpec(("/nonexistent/server",), ws, False, DEFAULT_PROTECTED, limits)
            async with start_server(spec, scratch=folder / "scratch"):
                pytest.fail("started")

        with pytest.raises(SandboxStartError) as caught:
            anyio.run(main)
        assert caught.value.reason == "spawn_failed"
        relative = ServerSpec(("python3",), ws, False, DEFAULT_PROTECTED, server_limits(folder / "scratch", "native"))
        with pytest.raises(SandboxStartError) as caught:
            anyio.run(lambda: _enter(relative, folder / "scratch"))
        assert caught.value.reason == "server_program_not_absolute"


async def _enter(spec: ServerSpec, scratch: Path) -> None:
    async with start_server(spec, scratch=scratch):
        pass


def test_the_memory_limit_holds_for_the_whole_server() -> None:
    """Three children of 90 MiB each cannot live in a server of 160 MiB: the kernel's OOM killer ends one of its
    processes. Its supervisors, forks of the gateway, are often the largest: then the whole server ends, for memory."""
    if not probe_host().cgroup:
        pytest.skip("no cgroup here: the memory limit is per process only")
    with project({}) as (folder, ws):
        hog = "import time; b = bytearray(90 << 20); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True); time.sleep(60)"

        async def main() -> tuple[str | None, Any]:
            async with serving(folder, ws, "native", memory_limit_mb=160) as (server, talk):
                try:
                    answer = await talk.ask(
                        f"procs = [subprocess.Popen([{PYTHON!r}, '-c', {hog!r}], stdout=subprocess.PIPE) for _ in range(3)]\n"
                        "lines = [p.stdout.readline() for p in procs]\n"
                        "import time; time.sleep(1)\n"
                        "answer = [p.poll() for p in procs]\n"
                        "[p.kill() or p.wait() for p in procs]"
                    )
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    with anyio.fail_after(30):
                        await server.wait()
                    answer = None
                return server.ended_by(), answer

        ended_by, answer = anyio.run(main)
        if answer is None:
            assert ended_by == "memory"
        else:
            assert ended_by is None and -9 in answer, answer


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_process_limit_holds_for_the_whole_server(backend: Backend) -> None:
    skip_without(backend)
    with project({}) as (folder, ws):

        async def main() -> Any:
            async with serving(folder, ws, backend, max_processes=6) as (_, talk):
                return await talk.ask(
                    "procs = []\n"
                    "for _ in range(20):\n"
                    "    try:\n"
                    "        procs.append(subprocess.Popen(['/usr/bin/sleep', '30']))\n"
                    "    except OSError as exc:\n"
                    "        break\n"
                    "answer = len(procs)"
                )

        started = anyio.run(main)
        assert 1 <= started < 6, f"the server itself counts: at most 5 more, {started} started"


@contextlib.contextmanager
def holding(
    argv_prefix: list[str], folder: Path, backend: Backend, env: dict[str, str]
) -> Iterator[tuple[int, list[int]]]:
    """server_child.py holding a server that left a daemon: the helper's pid and the server's processes.

    The helper (the gateway here) is SIGKILLed by the test; whatever happens, it is killed and reaped at the end."""
    argv = [*argv_prefix, sys.executable, CHILD, "hold", str(folder / "ws"), str(folder / "scratch"), backend]
    argv.append(f"exec({DAEMONIZE!r}.replace('print(', 'answer = ('))")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/") as helper:
        try:
            assert helper.stdout is not None and helper.stderr is not None
            line = helper.stdout.readline()
            if not line:
                helper.kill()
                pytest.fail(f"the helper did not start its server: {helper.stderr.read().decode()}")
            yield helper.pid, family(json.loads(line)["pid"])
        finally:
            helper.kill()
            helper.wait()


def kill_gateway_and_wait(helper_pid: int, server: list[int]) -> tuple[list[int], float]:
    assert len(server) >= 3, "the supervisors, the server and its daemon"
    os.kill(helper_pid, signal.SIGKILL)  # only the helper this test started
    began = time.monotonic()
    left = wait_gone(server, GONE_WITHIN_S)
    return left, time.monotonic() - began


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_dies_with_its_gateway_killed_by_sigkill(backend: Backend) -> None:
    skip_without(backend)
    with project({}) as (folder, _):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
        with holding([], folder, backend, env) as (helper, server):
            left, took = kill_gateway_and_wait(helper, server)
        assert left == [], "the watchdog ends the server and its daemon with the gateway"
        assert took < pidns.WATCHDOG_GRACE_S, f"at once, by the parent-death signals ({took:.2f} s)"


ROOTLESS_UIDS = range(64080, 64086)
"""Ordinary uids with no account for the rootless servers (not root, not a pool uid, not another test's), one per
test and backend: each test finds its uid's processes its own, tests running side by side."""


def rootless_uid(test: int, backend: Backend) -> int:
    return ROOTLESS_UIDS[2 * test + BACKENDS.index(backend)]


def as_user(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


USER_ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}


def ask_as_user(uid: int, folder: Path, backend: Backend, *codes: str, writable: bool = False) -> dict[str, Any]:
    """server_child.py as the ordinary `uid` (a rootless gateway): the answers, the layers, how the server ended."""
    argv = [*as_user(uid), sys.executable, CHILD, "ask", str(folder / "ws"), str(folder / "scratch"), backend]
    argv += ["--writable", *codes] if writable else list(codes)
    done = subprocess.run(argv, capture_output=True, text=True, env=USER_ENV, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    assert outcome["rootless"] is True
    return outcome


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_server_is_confined_and_stopped(backend: Backend) -> None:
    uid = rootless_uid(0, backend)
    with users_project({"a.txt": "a\n"}, uid) as folder, socket.create_server(("127.0.0.1", 0)) as listener:
        outside, state = folder / "outside" / "x", folder / "state"
        state.mkdir(mode=0o700)
        (state / "secret").write_text("s3cret")
        os.chown(state, uid, uid)  # the gateway's own: only `hidden` keeps a server of its uid out
        os.chown(state / "secret", uid, uid)
        code = f"OUTSIDE = {str(outside)!r}\nPORT = {listener.getsockname()[1]}\nSTATE = {str(state / 'secret')!r}\n"
        code += CONFINED
        seen = ask_as_user(uid, folder, backend, "answer = 6 * 7", code)
        if backend == "bubblewrap" and Layer.MOUNT_TREE not in seen["layers"]:
            pytest.skip("bubblewrap does not run here for an ordinary user")
        assert seen["answers"][0] == 42
        answer = seen["answers"][1]
        assert answer["cwd"] == str(folder / "ws") and answer["read"] == "a\n"
        assert answer["scratch"] == "ok", answer
        assert all(answer[name] != "ok" for name in REFUSED_BY_CONFINEMENT), answer
        assert not outside.exists() and (folder / "ws" / "a.txt").read_text() == "a\n"
        assert Layer.USER_NAMESPACE in seen["layers"] and Layer.PID_NAMESPACE in seen["layers"]
        assert seen["ended_by"] == "stopped"
        assert owned_by(uid) == [], "nothing of the server is left"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_server_dies_with_it(backend: Backend) -> None:
    uid = rootless_uid(1, backend)
    with users_project({}, uid) as folder, holding(as_user(uid), folder, backend, USER_ENV) as (helper, server):
        left, took = kill_gateway_and_wait(helper, server)
        assert left == [], "the watchdog ends the server and its daemon with the gateway"
        assert took < pidns.WATCHDOG_GRACE_S, f"at once, by the parent-death signals ({took:.2f} s)"
        assert wait_gone([p.pid for p in owned_by(uid)], GONE_WITHIN_S) == []


def git(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git as root on a test's repository (the gateway's side), whoever owns it."""
    argv = ["git", "-c", "safe.directory=*", "-c", "user.name=dev", "-c", "user.email=dev@example.invalid", *args]
    return subprocess.run(argv, cwd=ws, capture_output=True, text=True, timeout=60, check=False)


def make_repository(ws: Path, uid: int | None = None) -> None:
    """A real git repository with one commit, made as root, then world-readable (or the ordinary `uid`'s)."""
    for step in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "first"]):
        assert git(ws, *step).returncode == 0, step
    for path in (ws, *ws.rglob("*")):
        if uid is not None:
            os.chown(path, uid, uid)
        else:
            path.chmod(0o755 if path.is_dir() else 0o644)


def git_log(ws: Path) -> list[str]:
    return git(ws, "log", "--format=%s").stdout.split()


COMMIT = """
open("a.txt", "w").write("changed by the agent\\n")
done = subprocess.run(["sh", "-c", "git add a.txt && git commit -q -m agent && git status --porcelain"],
                      capture_output=True, text=True)
answer = [done.returncode, done.stdout, done.stderr]
"""
PROTECTED = """
import pathlib
def attempt(name, action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
def write(path, text="x"):
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(text)
answer = {
    "hook": attempt("hook", lambda: write(".git/hooks/pre-commit", "#!/bin/sh\\nevil\\n")),
    "config": attempt("config", lambda: write(".git/config", "[core]\\nfsmonitor = evil\\n")),
    "tasks": attempt("tasks", lambda: write(".vscode/tasks.json", "{}")),
    "envrc": attempt("envrc", lambda: write(".envrc", "evil")),
    "nested": attempt("nested", lambda: write("sub/.claude/settings.json", "{}")),
    "link": attempt("link", lambda: os.symlink("/etc/passwd", "link")),
    "outside": attempt("outside", lambda: write(OUTSIDE, "escaped")),
    "plain": attempt("plain", lambda: write("notes/plain.txt", "fine\\n")),
}
"""
REFUSED = {
    ".git/hooks/pre-commit": Refusal.PROTECTED,
    ".git/config": Refusal.PROTECTED,
    ".vscode": Refusal.PROTECTED,
    ".vscode/tasks.json": Refusal.PROTECTED,
    ".envrc": Refusal.PROTECTED,
    "sub/.claude": Refusal.PROTECTED,
    "sub/.claude/settings.json": Refusal.PROTECTED,
    "link": Refusal.SYMLINK,
}


def check_protected(
    ws: Path, answer: dict[str, str], refused: dict[str, str], written: list[str], outside: Path
) -> None:
    assert answer["outside"] != "ok" and not outside.exists(), "never outside the workspace"
    assert refused == REFUSED, refused
    assert (ws / "notes/plain.txt").read_text() == "fine\n" and "notes/plain.txt" in written
    assert (ws / ".git/config").read_text().startswith("[core]") and "evil" not in (ws / ".git/config").read_text()
    for absent in (".git/hooks/pre-commit", ".vscode", ".envrc", "sub/.claude", "link"):
        assert not (ws / absent).exists() and not (ws / absent).is_symlink(), absent


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_writable_server_commits_into_a_real_repository(backend: Backend) -> None:
    skip_without(backend)
    with project({"a.txt": "first\n"}) as (folder, ws):
        make_repository(ws.path)

        async def main() -> tuple[Any, list[str], bool]:
            async with serving(folder, ws, backend, writable=True) as (server, talk):
                answer = await talk.ask(COMMIT)
                synced = await server.sync()
                again = await server.sync()
                assert again.changes.changes == (), "a second sync has nothing new"
                return answer, list(synced.applied.written), synced.applied.applied

        answer, written, applied = anyio.run(main)
        assert answer[0] == 0, answer
        assert applied, written
        assert git_log(ws.path) == ["agent", "first"], "the commit reached the repository"
        assert (ws.path / "a.txt").read_text() == "changed by the agent\n"
        assert {".git/index", ".git/refs/heads/main", ".git/logs/HEAD"} <= set(written)
        assert any(path.startswith(".git/objects/") for path in written)
        assert git(ws.path, "status", "--porcelain").stdout == "", "the workspace, index and HEAD agree"
        assert git(ws.path, "fsck", "--strict").returncode == 0


GIT_ATTEMPTS = """
import pathlib, shutil
git = pathlib.Path(".git")
run = f'touch {MARKER}; false'
with (git / "config").open("a") as config:
    config.write(f'\\tfsmonitor = "{run}"\\n')
(git / "hooks" / "post-checkout").write_text(f"#!/bin/sh\\n{run}\\n")
(git / "hooks" / "post-checkout").chmod(0o755)
(git / "commondir").write_text("../evil\\n")
(git / "objects" / "info").mkdir(exist_ok=True)
(git / "objects" / "info" / "alternates").write_text("/tmp\\n")
(git / "refs" / "heads" / "evil").write_text("../../evil\\n")
(git / "refs" / "heads" / "link").symlink_to("/etc/passwd")
(git / "hooks2").write_text(run)
(git / "packed-refs").write_text(f"[core]\\n\\tfsmonitor = {run}\\n")
pathlib.Path(".GIT/objects").mkdir(parents=True)
shutil.copytree(".git", "sub/.git", symlinks=True)
(git / "HEAD").write_text("ref: ../../x\\n")
answer = "tried"
"""
"""Run in a writable server after its commit: each a way git on the host would run MARKER's command or leave the repository."""
GIT_REFUSED = {
    ".git/config": Refusal.PROTECTED,
    ".git/hooks/post-checkout": Refusal.PROTECTED,
    ".git/commondir": Refusal.PROTECTED,
    ".git/objects/info/alternates": Refusal.PROTECTED,
    ".git/refs/heads/evil": Refusal.PROTECTED,
    ".git/refs/heads/link": Refusal.SYMLINK,
    ".git/hooks2": Refusal.PROTECTED,
    ".git/packed-refs": Refusal.PROTECTED,
    ".GIT": Refusal.PROTECTED,
    ".GIT/objects": Refusal.PROTECTED,
    ".git/HEAD": Refusal.PROTECTED,
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_writable_servers_commit_lands_and_nothing_it_wrote_in_git_runs_on_the_host(backend: Backend) -> None:
    """A real `git commit` in the confined server, then writes to git's config, hooks, commondir, alternates,
    refs, packed-refs, HEAD and a nested repository: the commit lands; the host's git status runs nothing."""
    skip_without(backend)
    with project({"a.txt": "first\n"}) as (folder, ws):
        make_repository(ws.path)
        marker = folder / "ran"

        async def main() -> tuple[list[Any], Any]:
            async with serving(folder, ws, backend, writable=True) as (server, talk):
                answers = [await talk.ask(COMMIT), await talk.ask(f"MARKER = {str(marker)!r}\n{GIT_ATTEMPTS}")]
                return answers, await server.sync()

        answers, synced = anyio.run(main)
        assert answers[0][0] == 0 and answers[1] == "tried", answers
        assert synced.applied.applied, synced.applied
        refused = {entry.path: entry.why for entry in synced.changes.refused}
        assert GIT_REFUSED.items() <= refused.items(), refused
        assert all(path.startswith("sub/.git") for path in refused.keys() - GIT_REFUSED.keys()), refused
        written = set(synced.applied.written)
        assert {".git/index", ".git/refs/heads/main", ".git/logs/HEAD", "a.txt"} <= written, written
        assert all(path.startswith((".git/objects/", ".git/logs/", ".git/refs/heads/main", "sub")) or path in (
            ".git/index", ".git/COMMIT_EDITMSG", "a.txt") for path in written), written  # fmt: skip
        home = folder / "home"
        home.mkdir()
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}
        for at in (ws.path, ws.path / "sub"):  # the developer's own git, no -c, in the workspace
            subprocess.run(["git", "status"], cwd=at, env=env, capture_output=True, timeout=60, check=False)
        assert not marker.exists(), "git on the host ran a command the server wrote"
        assert git_log(ws.path) == ["agent", "first"]
        assert git(ws.path, "status", "--porcelain").stdout == "", "the workspace, index and HEAD agree"
        fsck = git(ws.path, "fsck", "--strict")
        assert fsck.returncode == 0, fsck.stderr
        assert (ws.path / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
        assert "fsmonitor" not in (ws.path / ".git" / "config").read_text()
        for absent in ("commondir", "hooks2", "hooks/post-checkout", "objects/info/alternates", "refs/heads/evil"):
            assert not (ws.path / ".git" / absent).exists(), absent


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_writable_server_never_writes_protected_paths_nor_outside(backend: Backend) -> None:
    skip_without(backend)
    with project({"a.txt": "a\n", ".git/hooks/README": "hooks\n", ".git/config": "[core]\n"}) as (folder, ws):
        outside = folder / "outside.txt"

        async def main() -> tuple[Any, dict[str, str], list[str]]:
            async with serving(folder, ws, backend, writable=True) as (server, talk):
                answer = await talk.ask(f"OUTSIDE = {str(outside)!r}\n{PROTECTED}")
                await server.stop()  # the copy is kept until the context ends: a stopped server's changes still sync
                synced = await server.sync()
                refused = {entry.path: str(entry.why) for entry in synced.changes.refused}
                return answer, refused, list(synced.applied.written)

        answer, refused, written = anyio.run(main)
        check_protected(ws.path, answer, refused, written, outside)


def test_a_read_only_server_has_nothing_to_sync() -> None:
    with project({}) as (folder, ws):

        async def main() -> None:
            async with serving(folder, ws, "native") as (server, _):
                with pytest.raises(ValueError, match="only a writable server"):
                    await server.sync()

        anyio.run(main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_writable_server_commits_and_keeps_protected_paths(backend: Backend) -> None:
    uid = rootless_uid(2, backend)
    with users_project({"a.txt": "first\n", ".git/hooks/README": "hooks\n"}, uid) as folder:
        ws = folder / "ws"
        make_repository(ws, uid)
        outside = folder / "outside" / "x"
        seen = ask_as_user(uid, folder, backend, COMMIT, f"OUTSIDE = {str(outside)!r}\n{PROTECTED}", writable=True)
        if backend == "bubblewrap" and Layer.MOUNT_TREE not in seen["layers"]:
            pytest.skip("bubblewrap does not run here for an ordinary user")
        assert seen["answers"][0][0] == 0, seen
        assert seen["applied"] is True, seen
        assert git_log(ws) == ["agent", "first"]
        check_protected(ws, seen["answers"][1], seen["refused"], seen["written"], outside)


def test_a_cancelled_context_leaves_nothing_even_while_a_send_is_stuck() -> None:
    """A server that stops reading: the gateway's send blocks on the full pipe; cancelling the context still ends it all."""
    with project({}) as (folder, ws):

        async def main() -> list[int]:
            started: list[int] = []
            with anyio.CancelScope(deadline=anyio.current_time() + scaled(30)) as scope:  # bounds the start-up too
                async with serving(folder, ws, "native") as (server, talk):
                    await talk.ask(f"exec({DAEMONIZE!r}.replace('print(', 'answer = ('))")
                    started = family(server.pid)
                    await server.stdin.send(json.dumps("import time; time.sleep(3600)").encode() + b"\n")
                    # 4 MiB into a pipe of 64 KiB that nobody reads blocks within microseconds: the context is
                    # cancelled a second later, long after the send is stuck.
                    scope.deadline = anyio.current_time() + 1
                    await server.stdin.send(b"x" * (1 << 22))  # blocks: nobody reads
            return started

        started = anyio.run(main)
        assert len(started) >= 3
        assert wait_gone(started, 5.0) == []
