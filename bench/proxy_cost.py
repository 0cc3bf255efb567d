"""What the egress proxy costs (decisions 90, 97): a 50 MB download through it against the same download direct, on loopback.

The origin is a process of its own (so that it never contends with the proxy for this one's GIL) streaming a
fixed body on 127.0.0.1; the proxy is `serve_proxy` on this process's event loop, as it runs in the gateway,
twice: bodies relayed by splice (as it runs) and copied through the streams (`splice=False`, the path before
decision 97). Two floors beside them: a bare splice relay (a thread per connection, no check at all: what
relaying costs on this machine) and socat, if installed (a plain TCP forwarder in C). The client is curl (the
download) and a plain socket in a worker thread (the latency of a new connection: one small request per
connection, its whole round trip). Each figure is the median of several rounds, every way taken in turn in
each round, side by side; the proxy's CPU time per download is this process's (the proxy's threads too).

    .venv/bin/python bench/proxy_cost.py [--mb 50] [--rounds 5] [--connections 200]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from types import MappingProxyType

import anyio

from gateway.proxy import ConnectionLog, ProxyLimits, serve_proxy
from gateway.rules.egress import EgressRules, parse_pattern

CHUNK = 1024 * 1024


def spawn_origin(body_bytes: int) -> tuple[subprocess.Popen[str], int]:
    """`origin` in a child process; its port, read from its first line."""
    child = subprocess.Popen([sys.executable, __file__, "--origin", str(body_bytes)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def serve_origin(body_bytes: int) -> None:
    listener, thread = origin(body_bytes)
    print(listener.getsockname()[1], flush=True)
    thread.join()


def read_head(conn: socket.socket) -> bytes | None:
    """A request's head (and whatever came with it), or None if the client closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return None
        data += more
    return data


def origin(body_bytes: int) -> tuple[socket.socket, threading.Thread]:
    """An HTTP/1.1 origin on 127.0.0.1 answering every request with `body_bytes` bytes, one thread per connection."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    block = b"x" * CHUNK

    def answer(conn: socket.socket) -> None:
        with conn:
            if read_head(conn) is None:
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body_bytes)
            left = body_bytes
            while left:
                n = min(left, CHUNK)
                conn.sendall(block[:n])
                left -= n

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return listener, thread


def bare_relay(origin_port: int) -> int:
    """The floor: a relay with no check at all, the request head passed on and the answer spliced back by a
    blocking loop, one thread per connection. Its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)

    def relay(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", origin_port)) as origin:
            head = read_head(client)
            if head is None:
                return
            origin.sendall(head)
            read_end, write_end = os.pipe()
            try:
                while True:
                    n = os.splice(origin.fileno(), write_end, CHUNK)
                    if not n:
                        return
                    while n:
                        n -= os.splice(read_end, client.fileno(), n)
            finally:
                os.close(read_end)
                os.close(write_end)

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def download(url: str, proxy: str | None) -> float:
    argv = ["curl", "-sS", "-o", "/dev/null", "--max-time", "120", *(["-x", proxy] if proxy else []), url]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def connections(port: int, host: str, proxied: bool, n: int) -> float:
    """The median time of one small request on a new connection, from connect to the origin's close."""
    target = f"http://{host}/" if proxied else "/"
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(request)
            while conn.recv(65536):
                pass
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def timed(run: functools.partial[float]) -> tuple[float, float]:
    """`run`'s wall time and this process's CPU time over it."""
    cpu = time.process_time()
    wall = run()
    return wall, time.process_time() - cpu


async def main(mb: int, rounds: int, count: int) -> None:
    big, big_port = spawn_origin(mb * 1000 * 1000)
    small, small_port = spawn_origin(16)
    bare_port = bare_relay(big_port)
    socat = None
    if shutil.which("socat"):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        socat_port = probe.getsockname()[1]
        probe.close()
        socat = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{socat_port},bind=127.0.0.1,fork,reuseaddr", f"TCP:127.0.0.1:{big_port}"]
        )
        time.sleep(0.5)
    loopback = ipaddress.ip_address("127.0.0.1")
    rules = EgressRules(
        allow=(parse_pattern(f"big.test:{big_port}"), parse_pattern(f"small.test:{small_port}")),
        resolve=MappingProxyType({"big.test": loopback, "small.test": loopback}),
    )
    limits = ProxyLimits(max_bytes=rounds * 2 * mb * 1000 * 1000, max_connections=rounds * count + rounds * 2 + 10)
    listeners = {way: socket.socket() for way in ("splice", "copy")}
    for listener in listeners.values():
        listener.bind(("127.0.0.1", 0))
        listener.listen(256)
    urls = {way: f"http://127.0.0.1:{listener.getsockname()[1]}" for way, listener in listeners.items()}
    big_url = f"http://big.test:{big_port}/"
    ways = {
        "direct": functools.partial(download, f"http://127.0.0.1:{big_port}/", None),
        **({"socat": functools.partial(download, f"http://127.0.0.1:{socat_port}/", None)} if socat else {}),
        "bare splice relay": functools.partial(download, big_url, f"http://127.0.0.1:{bare_port}"),
        "proxy, copied": functools.partial(download, big_url, urls["copy"]),
        "proxy, spliced": functools.partial(download, big_url, urls["splice"]),
    }
    walls: dict[str, list[float]] = {way: [] for way in ways}
    cpus: dict[str, list[float]] = {way: [] for way in ways}
    direct_conn, proxied_conn = [], []
    async with anyio.create_task_group() as group:
        for way, listener in listeners.items():
            log = (
                ConnectionLog()
            )  # as a run's: each connection's record, and told of it while it is open (decision 102)
            serve = functools.partial(
                serve_proxy, listener, rules, limits, log.add, splice=way == "splice", opened=log.opened
            )
            group.start_soon(serve)
        for _ in range(rounds):
            for way, run in ways.items():
                wall, cpu = await anyio.to_thread.run_sync(timed, run)
                walls[way].append(wall)
                cpus[way].append(cpu)
            direct_conn.append(await anyio.to_thread.run_sync(connections, small_port, "small.test", False, count))
            proxied_conn.append(
                await anyio.to_thread.run_sync(
                    connections, listeners["splice"].getsockname()[1], f"small.test:{small_port}", True, count
                )
            )
        group.cancel_scope.cancel()
    for child in (big, small, socat):
        if child is not None:
            child.kill()
            child.wait()
    with contextlib.suppress(OSError):
        print(f"load (uptime): {os.getloadavg()[0]:.2f}")
    d = statistics.median(walls["direct"])
    print(f"download {mb} MB, median of {rounds} (wall; this process's CPU):")
    for way in ways:
        w, c = statistics.median(walls[way]), statistics.median(cpus[way])
        print(f"  {way:18} {w * 1000:5.0f} ms ({mb / w:5.0f} MB/s) {w / d:5.2f}x direct; CPU {c * 1000:4.0f} ms")
    print("  (aim: the spliced proxy <= 1.2x direct)")
    dc, pc = statistics.median(direct_conn), statistics.median(proxied_conn)
    print(f"a new connection, median of {rounds} x {count}: direct {dc * 1e6:.0f} us,")
    print(f"  through the proxy {pc * 1e6:.0f} us: +{(pc - dc) * 1e6:.0f} us per connection")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--origin", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.origin is not None:
        serve_origin(args.origin)
    else:
        anyio.run(main, args.mb, args.rounds, args.connections)
