"""`mcp-gateway console`: where it listens and with what, then uvicorn.

Loopback (127.0.0.1, ::1, localhost) by default. Any other interface only when the operator names
it and gives a certificate and key: the session cookie and passwords never cross a network in
clear. On plain HTTP the console answers only requests whose Host header is its own loopback address
(DNS rebinding); under TLS the certificate binds the name.
"""

from __future__ import annotations

import ipaddress
import logging
import sys

from gateway.calls import CallStore
from gateway.clock import SystemClock
from gateway.console.app import Console, build_app
from gateway.console.sessions import SessionBook, SignInLimit, StreamSlots
from gateway.console.views import ChainWatch
from gateway.errors import CommandError
from gateway.policy_trust import policy_for
from gateway.services import open_stores
from gateway.settings import Settings
from gateway.tools.registry import TOOL_NAMES

log = logging.getLogger("gateway.console")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, tls_cert: str | None, tls_key: str | None) -> None:
    """Refuse a non-loopback interface without TLS, and half a TLS pair."""
    if (tls_cert is None) != (tls_key is None):
        raise CommandError("--tls-cert and --tls-key go together: give both or neither")
    if not is_loopback(host) and tls_cert is None:
        raise CommandError(
            f"refusing to serve the console on {host!r} without TLS: passwords and session cookies would cross "
            "the network in clear; give --tls-cert and --tls-key, or keep the default --host 127.0.0.1 "
            "(and reach it through an SSH tunnel)"
        )


def host_names(host: str, port: int) -> frozenset[str]:
    """The Host header values a browser sends for this console."""
    names = {host, "localhost", "127.0.0.1", "[::1]"} if is_loopback(host) else {host}
    shown = {f"[{n}]" if ":" in n and not n.startswith("[") else n for n in names}
    return frozenset({*(f"{n}:{port}" for n in shown), *shown} if port in (80, 443) else {f"{n}:{port}" for n in shown})


def open_console(settings: Settings, *, tls: bool, hosts: frozenset[str] | None) -> Console:
    """What the console's routes need: the policy, the stores and the console's own state. Its chain
    check is started; `console.chain.stop()` ends it (for a caller that outlives the database: a test)."""
    clock = SystemClock()
    policy = policy_for(settings, TOOL_NAMES)
    stores = open_stores(settings, clock)
    chain = ChainWatch(stores)
    chain.start()
    return Console(
        stores=stores,
        policy=policy,
        sessions=SessionBook(clock),
        limit=SignInLimit(clock),
        streams=StreamSlots(),
        calls=CallStore(stores.engine),
        chain=chain,
        tls=tls,
        hosts=hosts,
    )


def run_console(settings: Settings, host: str, port: int, tls_cert: str | None, tls_key: str | None) -> int:
    import uvicorn  # noqa: PLC0415

    check_listen(host, tls_cert, tls_key)
    console = open_console(
        settings,
        tls=tls_cert is not None,
        # Plain HTTP (loopback): only our own names, against DNS rebinding. Under TLS a page of another
        # name cannot reach us without a certificate for that name, and the console may be reached by
        # any name its certificate holds (a wildcard --host has no single name to check).
        hosts=None if tls_cert else host_names(host, port),
    )
    scheme = "https" if tls_cert else "http"
    shown = f"[{host}]" if ":" in host else host
    print(f"mcp-gateway console: {scheme}://{shown}:{port}/ (Ctrl-C to stop)", file=sys.stderr, flush=True)
    uvicorn.run(
        build_app(console),
        host=host,
        port=port,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
        log_level="warning",
        access_log=False,
        server_header=False,
        proxy_headers=False,
    )
    return 0
