"""Hostile suites run through the real gateway over stdio, judged from outside: the host's files, processes and the audit log.

An `Arena` is one gateway state folder, one `mcp-gateway serve` session that declared
elicitation and answers every consent prompt with `allow_once`, and a workspace the hostile
files are written into. Hostile code reports what it managed through `_kit.report(...)`, which
fails its test with `REPORT {json}`: the gateway runs pytest with `-q -rfE`, so the line lands
in the run's stdout.txt, which `Run.report()` reads back. The report is a lead, not the proof:
every test asserts the absence of the damage itself (the secret's bytes in no artifact, the
file not there, the listener silent, the pid gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from sandbox import probe_host
from sandbox.guarantees import Guarantee
from sandbox.limits import BACKENDS
from tests.harness import GatewayHome, StdioSession, deep_merge, hand_over, reachable_by_everyone

ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}
RUN_UIDS = range(61000, 62000)
CANARY_VAR = "MCP_ADVERSARIAL_CANARY"
_REPORT = re.compile(r"REPORT (\{.*\})")

# Written next to every hostile test file: the one way hostile code reports back.
KIT = '''\
import json

import pytest


def attempt(action):
    """Run one hostile action; say what happened without ever raising."""
    try:
        value = action()
    except BaseException as exc:  # noqa: BLE001
        return "blocked:%s:%s" % (type(exc).__name__, getattr(exc, "errno", None))
    if isinstance(value, bytes):
        return "ok:" + value.hex()
    return "ok:%r" % (value,)


def report(**findings):
    pytest.fail("REPORT " + json.dumps(findings, sort_keys=True, default=repr), pytrace=False)


def capture_fd():
    """pytest keeps the run's real stdout (a pipe the gateway reads) under a dup while it captures: find it.

    /proc is not readable under Landlock, so look for the first pipe by its type instead.
    """
    import os
    import stat

    for fd in range(3, 128):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                return fd
        except OSError:
            continue
    return None
'''

# Loose enough for dozens of runs, tight where the hostile suites need it.
POLICY = {
    "budget": {"attempts_total": 10000, "elapsed_ms_total": 100_000_000},
    "sandbox": {"memory_limit_mb": 512, "max_output_bytes": 1024 * 1024, "max_processes": 64},
}


def answer_allow_once(message: dict[str, Any]) -> dict[str, Any]:
    if message["method"] != "elicitation/create":
        raise AssertionError(message)
    return {"action": "accept", "content": {"decision": "allow_once"}}


def open_to_everyone(path: Path) -> Path:
    """A 0777 folder the run uid may reach: it shows what Landlock (not DAC) stops."""
    path.mkdir(parents=True, exist_ok=True)
    reachable_by_everyone(path)
    path.chmod(0o777)
    return path


def pid_is_ours_and_alive(pid: int, uids: Container[int] = RUN_UIDS) -> bool:
    """True while `pid` is a live, non-zombie process of a run uid (a reused pid is someone else)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and any(u in uids for u in proc.uids())
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float = 5, uids: Container[int] = RUN_UIDS) -> list[int]:
    """The `pids` (host pids, of a run uid in `uids`) still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_is_ours_and_alive(p, uids)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_is_ours_and_alive(p, uids)]
    return alive


@dataclass
class Run:
    response: dict[str, Any]
    run_dir: Path | None
    events: list[dict[str, Any]]
    ended_at: float
    """time.time() when the response arrived."""

    @property
    def run_id(self) -> str | None:
        if "result" in self.response:
            return str(self.response["result"]["structuredContent"]["run_id"])
        data = self.response.get("error", {}).get("data") or {}
        return data.get("run_id")

    @property
    def structured(self) -> dict[str, Any]:
        return dict(self.response["result"]["structuredContent"])

    @property
    def error_code(self) -> int | None:
        code: int | None = self.response.get("error", {}).get("code")
        return code

    def artifact(self, name: str) -> bytes:
        if self.run_dir is None or not (self.run_dir / name).exists():
            return b""
        return (self.run_dir / name).read_bytes()

    @property
    def stdout(self) -> str:
        return self.artifact("stdout.txt").decode("utf-8", errors="replace")

    def sandbox_event(self) -> dict[str, Any]:
        return next(e["detail"] for e in self.events if e["event_type"] == "SANDBOX_EXEC")

    def evidence(self) -> dict[str, Any]:
        return dict(json.loads(self.artifact("evidence.json")))

    def reports(self) -> list[dict[str, Any]]:
        found = []
        for line in self.stdout.splitlines():
            match = _REPORT.search(line)
            if match:
                with contextlib.suppress(ValueError):
                    found.append(json.loads(match.group(1)))
        return found

    def report(self) -> dict[str, Any]:
        """The first complete report; its absence means the hostile code never ran (a test bug)."""
        found = self.reports()
        if not found:
            raise AssertionError(f"no REPORT in stdout.txt:\n{self.stdout[-3000:]}\n{self.response}")
        if os.environ.get("ADVERSARIAL_SHOW_REPORTS"):
            print("REPORT", json.dumps(found[0])[:1500])
        return found[0]

    def everything_seen(self) -> bytes:
        """Every byte the caller can get back: the response and every artifact of the run."""
        blobs = [json.dumps(self.response).encode()]
        if self.run_dir is not None and self.run_dir.exists():
            blobs += [p.read_bytes() for p in sorted(self.run_dir.iterdir())]
        return b"\n".join(blobs)

    def assert_no_secret(self, secret: bytes) -> None:
        seen = self.everything_seen()
        for form in (secret, secret.hex().encode(), repr(secret).encode()[2:-1]):
            if form and form in seen:
                raise AssertionError(f"secret bytes ({form[:16]!r}...) reached the caller")


@dataclass
class Arena:
    gateway: GatewayHome
    session: StdioSession
    token: str
    outside: Path
    """A 0777 folder outside the workspace and the scratch: DAC lets the run uid write here, Landlock must not."""
    secrets: dict[str, bytes] = field(default_factory=dict)
    backend: str = "native"
    """The sandbox backend. Under bubblewrap the run has a PID namespace of its own: pid 1 is
    bubblewrap's reaper, part of the run, and a death by signal N comes back as exit code 128+N."""
    run_uids: Container[int] = RUN_UIDS
    """The kernel uids a run's processes have: the pool (a root gateway), or the gateway's own (rootless)."""

    @property
    def workspace(self) -> Path:
        return self.gateway.workspace

    @property
    def serve_pid(self) -> int:
        return int(self.session.process.pid)

    def write(self, relative: str, text: str, **params: Any) -> Path:
        """Write a hostile file (0644, folders 0755) with `PARAMS` bound to `params`; `_kit.py` goes along."""
        path = self.workspace / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        kit = path.parent / "_kit.py"
        if not kit.exists():
            kit.write_text(KIT)
        header = f"import json as _json\n\nPARAMS = _json.loads({json.dumps(params)!r})\n" if params else ""
        path.write_text(header + text)
        reachable_by_everyone(self.workspace)
        return path

    def run(self, test_path: str, timeout_s: int = 30, **arguments: Any) -> Run:
        response = self.session.call_tool(
            "run_pytest",
            {"test_path": test_path, "timeout_s": timeout_s, **arguments},
            self.token,
            timeout=timeout_s + 60,
        )
        ended_at = time.time()
        run = Run(response, None, [], ended_at)
        if run.run_id:
            run.run_dir = self.gateway.home / "artifacts" / run.run_id
            run.events = self.gateway.events_of(run.run_id)
        return run

    def leftovers(self, marker: str) -> list[int]:
        """Live run-uid processes whose command line mentions `marker` (a hostile file's path)."""
        found = []
        for proc in psutil.process_iter(["cmdline", "uids", "status"]):
            uids, cmdline = proc.info["uids"], proc.info["cmdline"] or []
            if uids is None or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(u in self.run_uids for u in uids) and any(marker in part for part in cmdline):
                found.append(proc.pid)
        return found


@contextlib.contextmanager
def open_arena(
    root: Path,
    policy: Mapping[str, Any] | None = None,
    serve_env: Mapping[str, str] | None = None,
    keep_sample_config: bool = True,
    prepare: Callable[[GatewayHome], None] | None = None,
    *,
    run_as: int | None = None,
) -> Iterator[Arena]:
    """`prepare` runs after the state folder, workspace and policy are made, before `serve` loads them.

    `run_as`: the ordinary uid `serve` runs as (the rootless mode). The state folder, the
    workspace, the policy and the 0777 `outside` folder are then that user's, as they are on a
    user's machine: DAC lets the run (the same kernel uid) at all of them, only the sandbox not.
    `root` must be enterable by that uid, and outside pytest's temp folder (tests/harness.py)."""
    root.mkdir(parents=True, exist_ok=True)
    gateway = GatewayHome(root, deep_merge(dict(POLICY), policy or {}))
    gateway.add_user("alice", "USER")
    if not keep_sample_config:
        (gateway.workspace / "pyproject.toml").unlink()
    if prepare is not None:
        prepare(gateway)
    env = dict(serve_env or {})
    if run_as is not None:
        gateway.hand_to(run_as)
        env.setdefault("HOME", str(root))
    canary = f"canary-{secrets.token_hex(16)}"
    # Started, not forked: the hostile suites read the gateway's /proc (its environ holds the canary).
    session = StdioSession(gateway, env={CANARY_VAR: canary, **env}, run_as=run_as, forked=False)
    try:
        if "result" not in session.initialize(ELICITATION):
            raise AssertionError(session.stderr_text())
        session.responder = answer_allow_once
        outside = open_to_everyone(Path(tempfile.mkdtemp(prefix="mcp-adv-outside-")))
        if run_as is not None:
            hand_over(run_as, outside)
        backend = str((policy or {}).get("sandbox", {}).get("backend", "native"))
        arena = Arena(gateway, session, gateway.token("alice", ttl_s=3600), outside, backend=backend)
        if run_as is not None:
            arena.run_uids = frozenset({run_as})
        arena.secrets = {
            "signing.key": (gateway.home / "signing.key").read_bytes().strip(),
            "gateway.db": b"SQLite format 3\x00",
            "policy": gateway.policy_path.read_bytes()[:200],
            "canary": canary.encode(),
        }
        try:
            yield arena
        finally:
            shutil.rmtree(outside, ignore_errors=True)
    finally:
        session.close()


@pytest.fixture(scope="session", params=BACKENDS)
def arena(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    """One gateway and one session per sandbox backend, for every hostile suite that needs no special start-up."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox confines only when the gateway runs as root (as CI runs it)")
    backend = request.param
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.fail("bubblewrap does not run here: `make test` installs Debian's bubblewrap")
    policy = {"sandbox": {"backend": backend, "require": [g.value for g in Guarantee]}}
    with open_arena(tmp_path_factory.mktemp(f"arena-{backend}"), policy) as shared:
        yield shared


@dataclass
class Listener:
    """A 127.0.0.1 (or unix) socket this test opened; `received` holds whatever reached it."""

    address: Any
    received: list[bytes] = field(default_factory=list)


def _serve_stream(server: socket.socket, listener: Listener, stop: threading.Event) -> None:
    server.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        with conn:
            conn.settimeout(1)
            listener.received.append(b"<connected>")
            with contextlib.suppress(OSError):
                listener.received.append(conn.recv(4096))


def _serve_datagrams(server: socket.socket, listener: Listener, stop: threading.Event) -> None:
    server.settimeout(0.1)
    while not stop.is_set():
        try:
            listener.received.append(server.recv(4096))
        except TimeoutError:
            continue
        except OSError:
            return


@contextlib.contextmanager
def listening(family: int, kind: int, address: Any) -> Iterator[Listener]:
    server = socket.socket(family, kind)
    stop = threading.Event()
    try:
        server.bind(address)
        if kind == socket.SOCK_STREAM:
            server.listen(8)
        listener = Listener(server.getsockname())
        target = _serve_stream if kind == socket.SOCK_STREAM else _serve_datagrams
        thread = threading.Thread(target=target, args=(server, listener, stop), daemon=True)
        thread.start()
        yield listener
        stop.set()
        thread.join(timeout=5)
    finally:
        server.close()


@pytest.fixture
def tcp_listener() -> Iterator[Listener]:
    with listening(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 0)) as listener:
        yield listener


@pytest.fixture
def udp_listener() -> Iterator[Listener]:
    with listening(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 0)) as listener:
        yield listener
