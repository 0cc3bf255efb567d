"""What the egress proxy costs (decision 90): a 50 MB download through it against the same download direct, on loopback.

The origin is a process of its own (so that it never contends with the proxy for this one's GIL) streaming a
fixed body on 127.0.0.1; the proxy is `serve_proxy` on this process's
event loop, as it runs in the gateway; the client is curl (the download) and a plain socket in a worker
thread (the latency of a new connection: one small request per connection, its whole round trip). Each
figure is the median of several rounds, direct and proxied taken alternately, side by side.

    .venv/bin/python bench/proxy_cost.py [--mb 50] [--rounds 5] [--connections 200]
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import socket
import statistics
import subprocess
import sys
import threading
import time
from types import MappingProxyType

import anyio

from gateway.proxy import ProxyLimits, serve_proxy
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


def origin(body_bytes: int) -> tuple[socket.socket, threading.Thread]:
    """An HTTP/1.1 origin on 127.0.0.1 answering every request with `body_bytes` bytes, one thread per connection."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    block = b"x" * CHUNK

    def answer(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
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


async def main(mb: int, rounds: int, count: int) -> None:
    big, big_port = spawn_origin(mb * 1000 * 1000)
    small, small_port = spawn_origin(16)
    loopback = ipaddress.ip_address("127.0.0.1")
    rules = EgressRules(
        allow=(parse_pattern(f"big.test:{big_port}"), parse_pattern(f"small.test:{small_port}")),
        resolve=MappingProxyType({"big.test": loopback, "small.test": loopback}),
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    proxy_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    records: list[object] = []
    limits = ProxyLimits(max_bytes=rounds * 2 * mb * 1000 * 1000, max_connections=rounds * count + rounds * 2 + 10)
    async with anyio.create_task_group() as group:
        group.start_soon(functools.partial(serve_proxy, listener, rules, limits, records.append))
        direct, proxied, direct_conn, proxied_conn = [], [], [], []
        for _ in range(rounds):
            direct.append(await anyio.to_thread.run_sync(download, f"http://127.0.0.1:{big_port}/", None))
            proxied.append(await anyio.to_thread.run_sync(download, f"http://big.test:{big_port}/", proxy_url))
            direct_conn.append(await anyio.to_thread.run_sync(connections, small_port, "small.test", False, count))
            proxied_conn.append(
                await anyio.to_thread.run_sync(
                    connections, listener.getsockname()[1], f"small.test:{small_port}", True, count
                )
            )
        group.cancel_scope.cancel()
    for child in (big, small):
        child.kill()
        child.wait()
    d, p = statistics.median(direct), statistics.median(proxied)
    dc, pc = statistics.median(direct_conn), statistics.median(proxied_conn)
    print(f"download {mb} MB, median of {rounds}: direct {d * 1000:.0f} ms ({mb / d:.0f} MB/s),")
    print(f"  through the proxy {p * 1000:.0f} ms ({mb / p:.0f} MB/s): {p / d:.2f}x (aim <= 1.2x)")
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
