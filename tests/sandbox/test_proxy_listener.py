"""A proxied run's network (decision 89): its own namespace, the gateway's listener at 127.0.0.1:3128, nothing else.

Real runs, root and rootless, both backends: a responder of the test's answers on the listener `on_proxy`
got; Python's urllib and curl inside the run reach it through HTTP_PROXY; every other address, port, DNS,
UDP, raw and packet sockets fail; the run cannot take the proxy's address; the next run's listener is its own.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sandbox import Limits, probe_host, run_sandboxed
from sandbox.backends.proxy_listener import ProxyListener
from sandbox.change_set import DEFAULT_PROTECTED
from sandbox.errors import SandboxStartError
from sandbox.guarantees import Guarantee
from sandbox.layers import Layer
from sandbox.limits import BACKENDS, Backend
from sandbox.pinned import pin
from sandbox.proxy_port import PROXY_PORT, PROXY_URL, PROXY_VARIABLES, proxy_environment
from sandbox.server import ServerSpec, start_server
from tests.harness import REPO, enterable_by_everyone
from tests.sandbox.confined_child import leased_identity, requires_root
from tests.sandbox.proxy_child import PROXIED, Seen, answers, proxy_limits, respond, run_proxied
from tests.sandbox.server_child import LINE_SERVER, PYTHON, Talk, server_limits

pytestmark = requires_root

CHILD = str(REPO / "tests" / "sandbox" / "proxy_child.py")
ROOTLESS_UIDS = {"native": 64090, "bubblewrap": 64091}
"""Ordinary uids with no account (not root, not a pool uid, not another suite's), one per backend."""
CURL = shutil.which("curl")

PROBE = r"""
import errno, json, os, socket, subprocess, time, urllib.request

def attempt(action):
    try:
        return ["ok", action()]
    except OSError as exc:
        return ["refused", errno.errorcode.get(exc.errno or 0, str(exc.errno)), type(exc).__name__]
    except Exception as exc:
        return ["error", type(exc).__name__, str(exc)[:200]]

def connect(host, port, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect((host, port))
    return "connected"

def take_port(address, option):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if option:
            s.setsockopt(socket.SOL_SOCKET, option, 1)
        s.bind((address, PORT))
        s.listen(1)
    return "bound"

PORT = @PORT@
out = {"env": {k: v for k, v in os.environ.items() if k.lower().endswith("_proxy")}}
out["urllib"] = attempt(lambda: urllib.request.urlopen("http://pypi.example/simple/", timeout=10).read().decode())
if os.path.exists("/usr/bin/curl"):
    out["curl"] = attempt(lambda: subprocess.run(
        ["/usr/bin/curl", "-sS", "--max-time", "10", "http://files.example/x"],
        capture_output=True, text=True, timeout=20, env=dict(os.environ),
    ).stdout)
# HTTPS goes through the proxy too, as CONNECT (the test's responder answers it with a plain 200, so TLS then fails)
attempt(lambda: urllib.request.urlopen("https://secure.example/", timeout=10).read())
if os.path.exists("/usr/bin/curl"):
    attempt(lambda: subprocess.run(
        ["/usr/bin/curl", "-sS", "--max-time", "10", "https://curl-secure.example/"],
        capture_output=True, text=True, timeout=20, env=dict(os.environ),
    ))
out["other_port"] = attempt(lambda: connect("127.0.0.1", 8080))
out["other_address"] = attempt(lambda: connect("10.1.2.3", 80))
out["metadata"] = attempt(lambda: connect("169.254.169.254", 80))
out["proxy_port_elsewhere"] = attempt(lambda: connect("10.1.2.3", PORT))
out["v6_loopback"] = attempt(lambda: connect("::1", PORT, socket.AF_INET6))
started = time.monotonic()
out["dns"] = attempt(lambda: socket.getaddrinfo("pypi.org", 443))
out["dns_s"] = time.monotonic() - started
out["udp"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
out["udp6"] = attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close())
out["raw"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())
out["packet"] = attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close())
out["sctp"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132).close())
out["netlink"] = attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
out["unix"] = attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close())
out["take_port"] = {
    f"{address}/{option}": attempt(lambda: take_port(address, option))
    for address in ("127.0.0.1", "0.0.0.0", "::", "::1")
    for option in (0, socket.SO_REUSEADDR, socket.SO_REUSEPORT)
}
def loopback(flags):
    import fcntl, struct
    with socket.socket() as s:
        fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", flags))  # SIOCSIFFLAGS
    return "changed"

out["lo_down"] = attempt(lambda: loopback(0x8))  # IFF_LOOPBACK alone: down
out["urllib_after"] = attempt(lambda: urllib.request.urlopen("http://after.example/", timeout=10).read().decode())
print(json.dumps(out))
""".replace("@PORT@", str(PROXY_PORT))
"""What a proxied run tries from inside; it prints one JSON object."""

REFUSED_INSIDE = ("lo_down", "other_port", "other_address", "metadata", "proxy_port_elsewhere", "v6_loopback", "dns")
SOCKETS_REFUSED = ("udp", "udp6", "raw", "packet", "sctp", "netlink", "unix")


@pytest.fixture
def folder() -> Iterator[Path]:
    """A workspace and a scratch folder any uid can enter (pytest's own temp folders are 0700 root's)."""
    path = Path(tempfile.mkdtemp(prefix="mcp-proxy-"))
    try:
        for sub in ("ws", "scratch"):
            (path / sub).mkdir()
        enterable_by_everyone(path)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def skip_without(backend: Backend) -> None:
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.skip("bubblewrap does not run here")


def check_probe(found: dict[str, Any], seen: dict[str, Any], layers: list[str]) -> None:
    """What every proxied run must show, whatever the backend and whoever the gateway is."""
    assert found["env"] == dict.fromkeys(PROXY_VARIABLES, PROXY_URL), "the proxy named, no exemption"
    assert found["urllib"] == ["ok", PROXIED], found
    assert found["urllib_after"] == ["ok", PROXIED], "the listener survives every attempt to take its port"
    if "curl" in found:
        assert found["curl"] == ["ok", PROXIED], found
    for name in REFUSED_INSIDE:
        assert found[name][0] == "refused", (name, found[name])
    assert found["dns_s"] < 3, "DNS fails fast: no resolver, no UDP"
    for name in SOCKETS_REFUSED:
        assert found[name][:2] in (["refused", "EPERM"], ["refused", "EACCES"]), (name, found[name])
    assert all(verdict[0] == "refused" for verdict in found["take_port"].values()), json.dumps(found["take_port"])
    requests = seen["requests"]
    assert "GET http://pypi.example/simple/ HTTP/1.1" in requests
    assert "GET http://after.example/ HTTP/1.1" in requests
    assert "CONNECT secure.example:443 HTTP/1.0" in requests  # http.client tunnels with HTTP/1.0
    if "curl" in found:
        assert "GET http://files.example/x HTTP/1.1" in requests
        assert "CONNECT curl-secure.example:443 HTTP/1.1" in requests
    assert len(requests) == 3 + 2 * ("curl" in found), "nothing else reached the proxy"
    assert seen["handed"] == 1
    listening = {"address": ["127.0.0.1", PROXY_PORT], "blocking": False, "accepting": 1, "inheritable": False}
    assert seen["listener"] == listening, "a non-blocking listener at the proxy's address, no later spawn inherits"
    assert seen["holders"] == [], "no process of the run holds the listener"
    assert Layer.NETWORK_NAMESPACE in layers and Layer.SECCOMP in layers


def check_namespace(namespace: dict[str, str]) -> None:
    """The run's namespace at the hand-over: only `lo`, no route, one TCP socket (listening, 127.0.0.1:3128)."""
    interfaces = [line.split(":")[0].strip() for line in namespace["dev"].splitlines()[2:]]
    assert interfaces == ["lo"]
    assert namespace["route"].splitlines()[1:] == [], "no route in the main table"
    sockets = [line.split() for line in namespace["tcp"].splitlines()[1:]]
    assert [(local, state) for _, local, _, state, *_ in sockets] == [(f"0100007F:{PROXY_PORT:04X}", "0A")]
    assert namespace["tcp6"].splitlines()[1:] == [] and namespace["udp"].splitlines()[1:] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_proxied_run_reaches_the_proxy_and_nothing_else(folder: Path, backend: Backend) -> None:
    skip_without(backend)
    outcome, seen = anyio.run(lambda: run_proxied(PROBE, folder / "ws", folder / "scratch", backend))
    assert outcome["exit_code"] == 0, outcome["stderr"]
    found = answers(outcome)
    check_probe(found, seen.__dict__, outcome["layers"])
    check_namespace(seen.namespace)
    if CURL is not None:
        assert "curl" in found


FETCH = "import urllib.request\nanswer = urllib.request.urlopen(URL, timeout=10).read().decode()"
"""A line server's question: fetch URL (set before it) through the proxy its environment names."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_proxied_server_reaches_the_proxy_all_its_life(folder: Path, backend: Backend) -> None:
    """A long-lived server (start_server) gets its listener once, before it is yielded, and keeps it until stopped."""
    skip_without(backend)
    seen = Seen()
    workspace = pin(folder / "ws")

    async def main() -> None:
        limits = server_limits(folder / "scratch", backend, proxy=True)
        spec = ServerSpec((PYTHON, "-I", "-c", LINE_SERVER), workspace, False, DEFAULT_PROTECTED, limits)
        async with anyio.create_task_group() as group:

            def on_proxy(listener: socket.socket) -> None:
                seen.handed += 1
                group.start_soon(respond, listener, seen)

            async with start_server(spec, scratch=folder / "scratch", on_proxy=on_proxy) as server:
                assert seen.handed == 1, "handed over before the server is yielded"
                talk = Talk(server)
                assert await talk.ask("URL = 'http://first.example/'\n" + FETCH) == PROXIED
                await anyio.sleep(1.5)  # past the limits' timeout_s: a server's listener has no deadline either
                assert await talk.ask("URL = 'http://second.example/'\n" + FETCH) == PROXIED
                refused = await talk.ask(
                    "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    answer = 'udp'\n"
                    "except OSError as exc:\n    answer = exc.errno"
                )
                assert refused == 1, "EPERM: no UDP for a proxied server either"
                assert Layer.NETWORK_NAMESPACE in server.layers
            group.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        workspace.close()
    assert seen.requests == ["GET http://first.example/ HTTP/1.1", "GET http://second.example/ HTTP/1.1"]
    assert seen.holders == []


def test_landlock_leaves_a_native_run_no_bind_and_no_other_port(folder: Path) -> None:
    """Natively (Landlock ABI >= 4) even a port of the run's own loopback is refused: connect to 3128 only, no bind."""
    if probe_host().landlock < 4:
        pytest.skip("Landlock here has no TCP rules (ABI < 4)")
    code = (
        "import json, socket\n"
        "def attempt(action):\n"
        "    try:\n        return ['ok', action()]\n"
        "    except OSError as exc:\n        return ['refused', exc.errno]\n"
        "def listen():\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); return s.getsockname()[1]\n"
        "def connect(port):\n"
        "    socket.create_connection(('127.0.0.1', port), timeout=3).close()\n"
        "print(json.dumps([attempt(listen), attempt(lambda: connect(8080)), attempt(lambda: connect(3128))]))\n"
    )
    outcome, seen = anyio.run(lambda: run_proxied(code, folder / "ws", folder / "scratch", "native"))
    # EACCES from Landlock's rules: no bind, and a connect elsewhere than 3128 refused before any route is looked at
    assert answers(outcome) == [["refused", 13], ["refused", 13], ["ok", None]], outcome
    assert seen.requests == [""], "the one connection the rules let through reached the test's responder"


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_run_has_its_own_listener_whatever_the_last_run_did(folder: Path, backend: Backend) -> None:
    """A run that fills the backlog, holds connections and tries to take the port leaves the next run untouched."""
    skip_without(backend)
    hostile = (
        "import socket\n"
        "held = []\n"
        "for _ in range(200):\n"
        "    s = socket.socket(); s.setblocking(False); s.connect_ex(('127.0.0.1', @PORT@)); held.append(s)\n"
        "for option in (socket.SO_REUSEADDR, socket.SO_REUSEPORT):\n"
        "    try:\n"
        "        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, option, 1); s.bind(('127.0.0.1', @PORT@))\n"
        "        print('took it')\n"
        "    except OSError:\n"
        "        pass\n"
        "print('done')\n"
    ).replace("@PORT@", str(PROXY_PORT))
    first, seen_first = anyio.run(lambda: run_proxied(hostile, folder / "ws", folder / "scratch", backend, serve=False))
    assert first["stdout"].split() == ["done"], first["stderr"]
    assert seen_first.handed == 1
    fetch = "import urllib.request; print(urllib.request.urlopen('http://next.example/', timeout=10).read().decode())"
    second, seen = anyio.run(lambda: run_proxied(fetch, folder / "ws", folder / "scratch", backend))
    assert second["stdout"].strip() == PROXIED, second["stderr"]
    assert seen.requests == ["GET http://next.example/ HTTP/1.1"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ten_thousand_connects_are_bounded_by_the_runs_open_files(folder: Path, backend: Backend) -> None:
    """The run's RLIMIT_NOFILE (rlimits.DEFAULT_OPEN_FILES) stops it long before 10,000; the gateway accepts none here
    (the proxy's own cap is the proxy's), and the run still ends by itself, in time."""
    skip_without(backend)
    code = (
        "import errno, json, socket\n"
        "held, error = [], None\n"
        "for _ in range(10_000):\n"
        "    try:\n"
        "        s = socket.socket(); s.setblocking(False); s.connect_ex(('127.0.0.1', @PORT@)); held.append(s)\n"
        "    except OSError as exc:\n"
        "        error = errno.errorcode[exc.errno]; break\n"
        "print(json.dumps([len(held), error]))\n"
    ).replace("@PORT@", str(PROXY_PORT))
    started = time.monotonic()
    outcome, seen = anyio.run(lambda: run_proxied(code, folder / "ws", folder / "scratch", backend, serve=False))
    opened, error = answers(outcome)
    assert error == "EMFILE" and opened < 256, (opened, error)
    assert outcome["killed_by"] is None and time.monotonic() - started < 30
    assert seen.handed == 1


def test_a_run_without_the_proxy_is_unchanged(folder: Path) -> None:
    """proxy=False: no listener, no variable set or removed, the loopback down (the no-network tests hold too)."""
    code = (
        "import json, os, socket\n"
        "try:\n    socket.create_connection(('127.0.0.1', @PORT@), timeout=2); verdict = 'connected'\n"
        "except OSError as exc:\n    verdict = exc.strerror\n"
        "print(json.dumps([verdict, sorted(k for k in os.environ if k.lower().endswith('_proxy'))]))\n"
    ).replace("@PORT@", str(PROXY_PORT))
    env = {"NO_PROXY": "*", "http_proxy": "http://elsewhere.example:8080"}
    limits = proxy_limits(folder / "scratch", "native", proxy=False, env=env)

    async def main() -> None:
        result = await run_sandboxed(
            [sys.executable, "-I", "-c", code],
            folder / "ws",
            limits,
            folder / "out.txt",
            folder / "err.txt",
            scratch=folder / "scratch",
        )
        assert result.exit_code == 0, (folder / "err.txt").read_text()

    anyio.run(main)
    verdict, names = json.loads((folder / "out.txt").read_text())
    assert verdict == "Operation not permitted"  # seccomp: no socket at all without network
    assert names == ["NO_PROXY", "http_proxy"]


def test_proxy_without_on_proxy_or_with_the_network_is_refused(folder: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        Limits(1, 64, 8, 1024, network=True, proxy=True)

    async def main() -> None:
        await run_sandboxed(
            [sys.executable, "-c", "pass"],
            folder / "ws",
            proxy_limits(folder / "scratch", "native"),
            folder / "out.txt",
            folder / "err.txt",
            scratch=folder / "scratch",
        )

    with pytest.raises(ValueError, match="needs on_proxy"):
        anyio.run(main)
    assert not (folder / "out.txt").exists(), "nothing was spawned"


def test_a_callee_that_fails_leaves_nothing_running(folder: Path) -> None:
    """on_proxy raising: the run is killed at once, the error is the caller's, the listener closed."""
    handed: list[socket.socket] = []

    def on_proxy(listener: socket.socket) -> None:
        handed.append(listener)
        raise RuntimeError("the proxy could not start")

    async def main() -> None:
        await run_sandboxed(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            folder / "ws",
            proxy_limits(folder / "scratch", "native"),
            folder / "out.txt",
            folder / "err.txt",
            scratch=folder / "scratch",
            on_proxy=on_proxy,
        )

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="could not start"):
        anyio.run(main)
    assert time.monotonic() - started < 20
    assert len(handed) == 1 and handed[0].fileno() == -1


def test_a_listener_that_cannot_be_made_names_its_step() -> None:
    """Outside a namespace of its own, as a pool uid, the child may not bring `lo` up: the step and errno come back."""
    listener = ProxyListener()
    try:
        with leased_identity() as who:

            def step() -> None:
                os.setgroups([])
                os.setresgid(who.gid, who.gid, who.gid)
                os.setresuid(who.uid, who.uid, who.uid)
                listener.apply()

            with pytest.raises(subprocess.SubprocessError):
                subprocess.run(["/bin/true"], preexec_fn=step, check=False, close_fds=True)
        assert listener.failure() == "network_proxy:loopback_up:EPERM"
        with pytest.raises(SandboxStartError, match="network_proxy:not_received"):
            listener.receive()
    finally:
        listener.close()


def test_the_environment_names_the_proxy_and_nothing_goes_around_it() -> None:
    env = {"PATH": "/bin", "No_Proxy": "*", "NO_PROXY": "*", "HTTPS_PROXY": "http://evil.example", "ftp_proxy": "x"}
    assert proxy_environment(env) == {"PATH": "/bin"} | dict.fromkeys(PROXY_VARIABLES, PROXY_URL)


def test_a_proxied_run_requires_network_through_proxy_in_place_of_no_network() -> None:
    proxied = Limits(1, 64, 8, 1024, proxy=True)
    assert Guarantee.NETWORK_THROUGH_PROXY in proxied.required and Guarantee.NO_NETWORK not in proxied.required
    waived = Limits(1, 64, 8, 1024, proxy=True, require=frozenset({Guarantee.OWN_IDENTITY}))
    assert Guarantee.NETWORK_THROUGH_PROXY in waived.required, "no policy waives it: without it, the host's network"
    plain = Limits(1, 64, 8, 1024, require=frozenset(Guarantee))
    assert Guarantee.NETWORK_THROUGH_PROXY not in plain.required and Guarantee.NO_NETWORK in plain.required


def test_root_without_cap_sys_admin_gets_the_same_network(folder: Path) -> None:
    """Root in a default container (no CAP_SYS_ADMIN, no CAP_NET_ADMIN): a pool uid, then the run's own user namespace,
    where the child still may bring its loopback up and make the listener."""
    code = [sys.executable, CHILD, PROBE, str(folder / "ws"), str(folder / "scratch"), "native"]
    shell = " ".join(shlex.quote(part) for part in code)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    argv = ["capsh", "--drop=cap_sys_admin,cap_net_admin", "--", "-c", shell]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    outcome = report["outcome"]
    assert outcome["exit_code"] == 0, outcome["stderr"]
    assert {Layer.UID_DROP, Layer.USER_NAMESPACE} <= set(outcome["layers"])
    check_probe(answers(outcome), report["seen"], outcome["layers"])


def test_a_gateway_that_may_not_configure_the_namespace_refuses_the_run_naming_the_step(folder: Path) -> None:
    """Root with CAP_SYS_ADMIN but without CAP_NET_ADMIN makes the namespace and cannot bring `lo` up: the spawn fails
    with `network_proxy:loopback_up:EPERM`, and the command never ran (fail closed, the step named)."""
    code = [sys.executable, CHILD, "print('ran')", str(folder / "ws"), str(folder / "scratch"), "native"]
    shell = " ".join(shlex.quote(part) for part in code)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    argv = ["capsh", "--drop=cap_net_admin", "--", "-c", shell]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False, cwd="/")
    assert done.returncode != 0
    assert "SandboxStartError: network_proxy:loopback_up:EPERM" in done.stderr, done.stderr
    assert all("ran" not in out.read_text() for out in folder.glob("out-*.txt")), "nothing ran"


def rootless(folder: Path, backend: Backend, code: str, *way: str) -> dict[str, Any]:
    uid = ROOTLESS_UIDS[backend]
    for path in (folder, folder / "ws", folder / "scratch"):
        os.chown(path, uid, uid)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/"}
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", sys.executable, CHILD]
    argv += [code, str(folder / "ws"), str(folder / "scratch"), backend, *way]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["outcome"]["rootless"] is True
    return report


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_proxied_run_reaches_the_proxy_and_nothing_else(folder: Path, backend: Backend) -> None:
    report = rootless(folder, backend, PROBE)
    outcome, seen = report["outcome"], report["seen"]
    if backend == "bubblewrap" and Layer.MOUNT_TREE not in outcome["layers"]:
        pytest.skip("bubblewrap does not run here for an ordinary user")
    assert outcome["exit_code"] == 0, outcome["stderr"]
    assert Layer.USER_NAMESPACE in outcome["layers"]
    check_probe(answers(outcome), seen, outcome["layers"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rootless_gateways_proxied_server_reaches_the_proxy(folder: Path, backend: Backend) -> None:
    code = "URL = 'http://served.example/'\n" + FETCH
    report = rootless(folder, backend, code, "server")
    outcome, seen = report["outcome"], report["seen"]
    if backend == "bubblewrap" and Layer.MOUNT_TREE not in outcome["layers"]:
        pytest.skip("bubblewrap does not run here for an ordinary user")
    assert outcome["answer"] == PROXIED
    assert Layer.USER_NAMESPACE in outcome["layers"] and Layer.NETWORK_NAMESPACE in outcome["layers"]
    assert seen["handed"] == 1 and seen["requests"] == ["GET http://served.example/ HTTP/1.1"]
