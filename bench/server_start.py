"""What starting a confined server costs (decision 83), side by side in one run, as root.

Each side starts a small Python line server (tests/sandbox/server_child.py LINE_SERVER, on
/usr/bin/python3) and times it until its first answer is read over the pipes, then stops it:
- bare: `anyio.open_process`, no confinement;
- `sandbox.server.start_server`, read-only, native and bubblewrap;
- the same as an ordinary user's gateway starts it (rootless: this script again under setpriv);
- writable (native): a copy of a generated repository of `--files` files is made first;
then, for the writable server, one `git commit` of one changed file inside it and the `sync()`
that brings it back (its own time). Interleaved rounds after unmeasured warm-up ones; prints
p50/p90 in ms and each side's p50 over bare.

    .venv/bin/python bench/server_start.py [--rounds 20] [--files 2000] [--rootless-uid 64091]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sandbox import probe_host  # noqa: E402  (after the path: the repository's own packages)
from sandbox.change_set import DEFAULT_PROTECTED  # noqa: E402
from sandbox.limits import Backend  # noqa: E402
from sandbox.pinned import Pinned, pin  # noqa: E402
from sandbox.server import ServerSpec, start_server  # noqa: E402
from tests.sandbox.server_child import LINE_SERVER, PYTHON, server_limits  # noqa: E402

Side = Callable[[], Awaitable[float]]


async def first_answer(send: Callable[[bytes], Awaitable[None]], lines: BufferedByteReceiveStream) -> None:
    await send(json.dumps("answer = 1").encode() + b"\n")
    if json.loads(await lines.receive_until(b"\n", 4096)) != 1:
        raise SystemExit("the server answered wrong")


async def bare(folder: Path) -> float:
    began = time.perf_counter()
    async with await anyio.open_process([PYTHON, "-I", "-c", LINE_SERVER], cwd=folder / "ws") as process:
        if process.stdin is None or process.stdout is None:
            raise SystemExit("no pipes")
        await first_answer(process.stdin.send, BufferedByteReceiveStream(process.stdout))
        took = time.perf_counter() - began
        process.kill()
    return took


async def confined(folder: Path, ws: Pinned, backend: Backend, *, writable: bool = False) -> float:
    spec = ServerSpec(
        (PYTHON, "-I", "-c", LINE_SERVER), ws, writable, DEFAULT_PROTECTED, server_limits(folder / "scratch", backend)
    )
    began = time.perf_counter()
    async with start_server(spec, scratch=folder / "scratch") as server:
        await first_answer(server.stdin.send, BufferedByteReceiveStream(server.stdout))
        return time.perf_counter() - began


async def commit_and_sync(folder: Path, ws: Pinned) -> tuple[float, float]:
    spec = ServerSpec(
        (PYTHON, "-I", "-c", LINE_SERVER), ws, True, DEFAULT_PROTECTED, server_limits(folder / "scratch", "native")
    )
    code = (
        "open('f0.py', 'a').write('# more\\n')\n"
        "answer = subprocess.run(['git', 'commit', '-qam', 'bench'], capture_output=True).returncode"
    )
    async with start_server(spec, scratch=folder / "scratch") as server:
        lines = BufferedByteReceiveStream(server.stdout)
        began = time.perf_counter()
        await server.stdin.send(json.dumps(code).encode() + b"\n")
        if json.loads(await lines.receive_until(b"\n", 4096)) != 0:
            raise SystemExit("git commit failed in the server")
        committed = time.perf_counter()
        synced = await server.sync()
        if not synced.applied.applied:
            raise SystemExit(f"sync did not apply: {synced.applied}")
        return committed - began, time.perf_counter() - committed


def make_folder(files: int) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="bench-server-"))
    ws = folder / "ws"
    (ws / "pkg").mkdir(parents=True)
    (folder / "scratch").mkdir()
    for index in range(files):
        (ws / ("pkg" if index % 2 else "") / f"f{index}.py").write_text(f"VALUE = {index}\n" * 20)
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@example.invalid"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run([*git, *step], cwd=ws, check=True, capture_output=True)
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def report(name: str, samples: list[float], base: float | None) -> None:
    ms = sorted(s * 1000 for s in samples)
    p50, p90 = statistics.median(ms), ms[int(len(ms) * 0.9) - 1]
    ratio = f"{p50 / base:5.1f}x" if base else "     "
    print(f"{name:38} p50 {p50:8.1f} ms  p90 {p90:8.1f} ms  {ratio}")


async def measure(rounds: int, warmup: int, files: int) -> dict[str, list[float]]:
    folder = make_folder(files)
    ws = pin(folder / "ws")
    sides: dict[str, Side] = {
        "bare (open_process)": lambda: bare(folder),
        "start_server native": lambda: confined(folder, ws, "native"),
        f"start_server native, writable ({files} files)": lambda: confined(folder, ws, "native", writable=True),
    }
    if probe_host().mount_tree:
        sides["start_server bubblewrap"] = lambda: confined(folder, ws, "bubblewrap")
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for index in range(warmup + rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            took = await sides[name]()
            if index >= warmup:
                samples[name].append(took)
    commits, syncs = [], []
    for _ in range(max(3, rounds // 4)):
        commit, sync = await commit_and_sync(folder, ws)
        commits.append(commit)
        syncs.append(sync)
    samples["git commit in the writable server"] = commits
    samples["sync() of that commit"] = syncs
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rootless-uid", type=int, default=64091)
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    samples = anyio.run(measure, args.rounds, args.warmup, args.files)
    if args.as_worker:
        print(json.dumps(samples))
        return
    print(f"root gateway ({args.rounds} rounds)")
    base = statistics.median(samples["bare (open_process)"]) * 1000
    for name, values in samples.items():
        report(name, values, base if name.startswith(("bare", "start_server")) else None)
    user = args.rootless_uid
    argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--", sys.executable, __file__]
    argv += ["--as-worker", "--rounds", str(args.rounds), "--files", str(args.files)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/", check=False, env={"PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        print(f"rootless: not measured ({done.stderr.strip().splitlines()[-1:]})")
        return
    print(f"rootless gateway (uid {user})")
    rootless = json.loads(done.stdout)
    base = statistics.median(rootless["bare (open_process)"]) * 1000
    for name, values in rootless.items():
        report(name, values, base if name.startswith(("bare", "start_server")) else None)


if __name__ == "__main__":
    main()
