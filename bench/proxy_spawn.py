"""What a proxied run's network costs a spawn (decision 89), side by side in one run, as root.

`<venv python> -I -c pass` through `sandbox.run_sandboxed` in interleaved rounds, native and bubblewrap:
- offline (`Limits.proxy` False: a network namespace whose `lo` is down);
- proxied (`Limits.proxy` True: the same namespace, `lo` up, `::1` taken off, the listener made and
  sent to the gateway over SCM_RIGHTS, handed to an `on_proxy` that closes it);
the step alone: `/bin/true` by `subprocess.run` with a `preexec_fn` that makes the network namespace, against
one that also makes and sends the listener (received and closed after), interleaved, 10x the rounds;
then the first connection's cost: `<venv python> -I -c` that opens one TCP connection to the proxy's
port and reads its answer, against the same command, offline, that only makes its socket (refused),
the answer written by an `on_proxy` task of the bench at once on accept.
Prints p50/p90 of each side and the ratio of proxied to offline. Exits 1 if a run fails.

    .venv/bin/python bench/proxy_spawn.py [--rounds 30] [--warmup 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandbox import Limits, probe_host, run_sandboxed  # noqa: E402
from sandbox.backends.netns import unshare_network  # noqa: E402
from sandbox.backends.proxy_listener import ProxyListener  # noqa: E402
from sandbox.limits import BACKENDS, Backend  # noqa: E402
from sandbox.proxy_port import PROXY_PORT  # noqa: E402

TRIVIAL = "pass"
CONNECT = (
    "import socket\n"
    "try:\n"
    f"    s = socket.create_connection(('127.0.0.1', {PROXY_PORT}), timeout=5); s.recv(1)\n"
    "except OSError:\n"
    "    pass\n"
)


@dataclass
class Side:
    label: str
    once: Callable[[], Awaitable[None]]
    samples: list[float] = field(default_factory=list)

    def p50(self) -> float:
        return statistics.median(self.samples)

    def p90(self) -> float:
        ordered = sorted(self.samples)
        return ordered[max(0, int(0.9 * len(ordered) + 0.5) - 1)]


async def answer_all(sock: socket.socket) -> None:
    listener = await anyio.abc.SocketListener.from_socket(sock)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.send(b"x")

    async with listener:
        await listener.serve(handle)


def side(
    label: str, folder: Path, backend: Backend, code: str, group: anyio.abc.TaskGroup, *, proxy: bool, serve: bool
) -> Side:
    limits = Limits(20, 256, 16, 100_000, env={"PATH": "/usr/bin:/bin"}, backend=backend, proxy=proxy)

    def on_proxy(listener: socket.socket) -> None:
        if serve:
            group.start_soon(answer_all, listener)
        else:
            listener.close()

    async def once() -> None:
        name = uuid.uuid4().hex
        scratch = folder / name
        scratch.mkdir()
        result = await run_sandboxed(
            [sys.executable, "-I", "-c", code],
            folder,
            limits,
            folder / f"{name}.out",
            folder / f"{name}.err",
            scratch=scratch,
            on_proxy=on_proxy if proxy else None,
        )
        if result.exit_code != 0:
            raise SystemExit(f"{label}: exit {result.exit_code}: {(folder / f'{name}.err').read_text()}")

    return Side(label, once)


def step_alone(rounds: int) -> tuple[Side, Side]:
    """The namespace alone against the namespace, `lo` up and the listener made, sent and received."""

    def offline() -> None:
        subprocess.run(["/bin/true"], preexec_fn=unshare_network, check=True)

    def proxied() -> None:
        listener = ProxyListener()
        try:

            def step() -> None:
                unshare_network()
                listener.apply()

            subprocess.run(["/bin/true"], preexec_fn=step, check=True)
            listener.receive().close()
        finally:
            listener.close()

    sides = (Side("namespace alone, /bin/true", _never), Side("namespace + listener, /bin/true", _never))
    for index in range(rounds + 10):
        pairs = list(zip(sides, (offline, proxied), strict=True))
        for each, call in pairs if index % 2 else pairs[::-1]:
            started = time.perf_counter()
            call()
            if index >= 10:
                each.samples.append((time.perf_counter() - started) * 1000)
    return sides


async def _never() -> None:
    raise AssertionError("measured synchronously")


async def main(rounds: int, warmup: int) -> None:
    backends = [b for b in BACKENDS if b == "native" or probe_host().mount_tree]
    with tempfile.TemporaryDirectory(prefix="mcp-proxy-bench-") as name:
        folder = Path(name)
        folder.chmod(0o755)
        async with anyio.create_task_group() as group:
            pairs = []
            for backend in backends:
                for code, what in ((TRIVIAL, "spawn"), (CONNECT, "first connect")):
                    offline = side(
                        f"{what}, {backend}, offline", folder, backend, code, group, proxy=False, serve=False
                    )
                    proxied = side(f"{what}, {backend}, proxied", folder, backend, code, group, proxy=True, serve=True)
                    pairs.append((offline, proxied))
            sides = [s for pair in pairs for s in pair]
            for index in range(warmup + rounds):
                shift = index % len(sides)
                for each in [*sides[shift:], *sides[:shift]]:
                    started = time.perf_counter()
                    await each.once()
                    if index >= warmup:
                        each.samples.append((time.perf_counter() - started) * 1000)
            group.cancel_scope.cancel()
    alone = step_alone(rounds * 10)
    print(f"{rounds} interleaved rounds ({warmup} warm-up), `python -I -c`, run_sandboxed as root")
    print(f"  {'':<36}{'p50 ms':>8}{'p90 ms':>8}{'p50 ratio':>11}")
    for offline, proxied in pairs:
        print(f"  {offline.label:<36}{offline.p50():>8.1f}{offline.p90():>8.1f}")
        ratio = proxied.p50() / offline.p50()
        print(f"  {proxied.label:<36}{proxied.p50():>8.1f}{proxied.p90():>8.1f}{ratio:>10.2f}x")
    base, step = alone
    print(f"the step alone, {rounds * 10} interleaved rounds")
    print(f"  {base.label:<36}{base.p50():>8.2f}{base.p90():>8.2f}")
    added = step.p50() - base.p50()
    print(f"  {step.label:<36}{step.p50():>8.2f}{step.p90():>8.2f}{step.p50() / base.p50():>10.2f}x  (+{added:.2f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    arguments = parser.parse_args()
    anyio.run(main, arguments.rounds, arguments.warmup)
