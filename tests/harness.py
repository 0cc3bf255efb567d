"""A gateway state folder and a real stdio JSON-RPC client, for the end-to-end tests.

`GatewayHome` builds a state folder the way `mcp-gateway init` does (through the same
functions), with a policy derived from the shipped default. `StdioSession` starts
`python -m gateway serve` as a subprocess and speaks newline-delimited JSON-RPC to it.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import Engine, text

from gateway.audit import AuditLog, verify_chain
from gateway.auth import ensure_keys, issue_token, load_keyring
from gateway.clock import Clock, SystemClock, new_token_id
from gateway.consent.store import ConsentStore
from gateway.db import make_engine
from gateway.settings import Settings
from gateway.users import UserStore
from tests import forked_gateway
from tests.deadlines import scaled
from tests.sqlite_template import copy_migrated, migrated

REPO = Path(__file__).resolve().parents[1]
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's safe loader and dumper when PyYAML has them (the same documents, about 10 times less CPU):
every state folder writes its policy and reads it back, and every `token` reads it again."""
DEFAULT_POLICY: dict[str, Any] = yaml.load((REPO / "policy.yaml").read_text(), Loader=YAML_LOADER)  # noqa: S506  # a safe loader
SAMPLE_PROJECT = REPO / "examples" / "sample_project"
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
FORM_ELICITATION: dict[str, Any] = {"elicitation": {"form": {}}}
START_S = 60.0
"""How long a gateway may take to answer `initialize` (TEST_TIME_SCALE times it): about 1 s on a quiet
machine, most of it importing the MCP SDK."""


def modern_meta(capabilities: Mapping[str, Any] = FORM_ELICITATION) -> dict[str, Any]:
    """The `_meta` envelope every 2026-07-28 request carries (no `initialize` on that era)."""
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": dict(capabilities),
    }


if TYPE_CHECKING:
    import pexpect


@dataclass(frozen=True)
class ConsentDesk:
    """The real stores a consent action writes to (gateway/consent/actions.py `ConsentStores`), on a
    test's engine and clock."""

    consent_store: ConsentStore
    audit: AuditLog
    clock: Clock

    @classmethod
    def on(cls, engine: Engine, clock: Clock) -> ConsentDesk:
        return cls(ConsentStore(engine), AuditLog(engine, clock), clock)


PERSONS_ACTS = frozenset({"APPROVER_DECISION", "CONSOLE_DECISION"})
"""A person's decision through a front end (gateway/consent/actions.py): filed under the call's run_id, but
written by the approver or the console, in no fixed order with the call's own events."""


def without_acts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A call's own events: its trail without the acts of the people who answered it (`PERSONS_ACTS`)."""
    return [e for e in events if e["event_type"] not in PERSONS_ACTS]


def wipe_postgres(url: str) -> None:
    """Empty the PostgreSQL database at `url` (MCP_GATEWAY_TEST_PG_URL names one the tests may wipe)."""
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(text("DROP SCHEMA public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    engine.dispose()


def enterable_by_everyone(folder: Path) -> None:
    """o+rx on `folder` and its parents up to the temp dir, not on anything inside it."""
    base = Path(tempfile.gettempdir()).resolve()
    for parent in (folder, *folder.parents):
        if parent == base or base not in parent.parents:
            break
        parent.chmod(parent.stat().st_mode | 0o055)


def reachable_by_everyone(folder: Path) -> None:
    """Let the sandbox's unprivileged run uid read a workspace the (root) test created.

    pytest's tmp_path folders are 0700; only folders this test session created are opened up.
    """
    enterable_by_everyone(folder)
    for path in folder.rglob("*"):
        path.chmod(path.stat().st_mode | (0o055 if path.is_dir() else 0o044))


def venv_beside(folder: Path) -> Path:
    """A venv in `folder` on the tests' interpreter and site-packages (links): sys.prefix is `folder/venv`."""
    venv = folder / "venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copyfile(Path(sysconfig.get_paths()["data"]) / "pyvenv.cfg", venv / "pyvenv.cfg")
    (venv / "bin" / "python").symlink_to(os.path.realpath(sysconfig.get_config_var("BINDIR") + "/python3"))
    purelib = Path(sysconfig.get_paths()["purelib"])
    (venv / purelib.relative_to(sysconfig.get_paths()["data"])).parent.mkdir(parents=True)
    (venv / purelib.relative_to(sysconfig.get_paths()["data"])).symlink_to(purelib)
    for path in (venv, *venv.rglob("*")):
        if not path.is_symlink():
            path.chmod(0o755)
    return venv / "bin" / "python"


def as_uid_argv(uid: int, argv: list[str]) -> list[str]:
    """`argv` run as the ordinary `uid` (gid the same, no supplementary groups): how a user's client starts it."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]


def hand_over(uid: int, *paths: Path) -> None:
    """Give `paths` (each with everything beneath it, links themselves not followed) to `uid`:`uid`."""
    for top in paths:
        os.chown(top, uid, uid, follow_symlinks=False)
        if top.is_dir() and not top.is_symlink():
            for path in top.rglob("*"):
                os.chown(path, uid, uid, follow_symlinks=False)


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


RSA_KEY_FILE = "signing-rs256.pem"
"""Where `ensure_keys` keeps the RS256 key (gateway/auth.py)."""


@functools.cache
def rsa_key_pem() -> bytes:
    """One RS256 key per process, as `ensure_keys` makes it (3072 bits, PKCS8 PEM), for every state folder
    whose policy allows RS256: generating one costs 0.1 to 1 s of CPU. Only this key is shared; the HMAC
    secret, which every token of the default policy is signed with, stays each folder's own."""
    key = rsa.generate_private_key(65537, 3072)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class GatewayHome:
    root: Path
    policy_overrides: Mapping[str, Any] = field(default_factory=dict)
    db_url: str | None = None

    def __post_init__(self) -> None:
        self.home = self.root / "state"
        # Outside pytest's own temp folder: pytest resets /tmp/pytest-of-<user> to 0700 whenever a
        # session starts, and a concurrent session would then lock the run uid out of this workspace.
        # Named with the run's token: a process left working in it is the run's. Imported here: the
        # module is a pytest plugin, which conftest.py's import of this module must not import first.
        from tests.leftover_processes import run_folder_prefix

        outside = Path(tempfile.mkdtemp(prefix=run_folder_prefix()))
        weakref.finalize(self, shutil.rmtree, outside, True)
        self.workspace = outside / "workspace"
        shutil.copytree(SAMPLE_PROJECT, self.workspace, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        reachable_by_everyone(self.workspace)
        self.policy_path = outside / "policy.yaml"  # world-readable beside the workspace: Landlock alone stops it
        self.write_policy(self.policy_overrides)
        self.home.mkdir(mode=0o700)
        (self.home / "artifacts").mkdir(mode=0o700)
        policy = yaml.load(self.policy_path.read_text(), Loader=YAML_LOADER)  # noqa: S506  # a safe loader
        if "RS256" in policy["auth"]["algorithms"]:
            # Written as `ensure_keys` writes a key (a new 0600 file), which then keeps it.
            descriptor = os.open(self.home / RSA_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(descriptor, "wb") as out:
                out.write(rsa_key_pem())
        ensure_keys(self.home, tuple(policy["auth"]["algorithms"]))
        self.url = self.db_url or f"sqlite:///{self.home / 'gateway.db'}"
        copy_migrated(self.url)  # a new SQLite file starts as the process's migrated template
        self.engine = make_engine(self.url)
        migrated(self.engine)
        self.users = UserStore(self.engine, SystemClock())

    @property
    def settings(self) -> Settings:
        return Settings(self.home, self.url, self.policy_path)

    def write_policy(self, overrides: Mapping[str, Any]) -> None:
        policy = deep_merge(DEFAULT_POLICY, {"workspaces": {"default": str(self.workspace)}})
        policy = deep_merge(policy, overrides)
        self.policy_path.write_text(yaml.dump(policy, Dumper=YAML_DUMPER, sort_keys=False))
        self.policy_path.chmod(0o644)  # whatever the umask: `serve` refuses a policy others could write

    def add_user(self, name: str, role: str = "USER", workspaces: tuple[str, ...] = ("default",)) -> None:
        self.users.add(name, role, workspaces)

    def token(self, user: str, ttl_s: int = 600, now: float | None = None, workspace: str | None = None) -> str:
        policy = yaml.load(self.policy_path.read_text(), Loader=YAML_LOADER)  # noqa: S506  # a safe loader
        from gateway.policy import AuthPolicy

        auth = AuthPolicy(
            issuer=policy["auth"]["issuer"],
            audience=policy["auth"]["audience"],
            algorithms=tuple(policy["auth"]["algorithms"]),
            leeway_s=policy["auth"]["leeway_s"],
            max_ttl_s=policy["auth"]["max_ttl_s"],
        )
        issued_at = SystemClock().now() if now is None else now
        return issue_token(
            load_keyring(self.home), auth, user, now=issued_at, ttl_s=ttl_s, jti=new_token_id(), workspace=workspace
        )

    def hand_to(self, uid: int) -> None:
        """Make the state folder, the workspace and the policy `uid`'s, as `mcp-gateway init` run by that user leaves them.

        The harness builds them as root, in process (faster than the CLI as `uid`); a gateway
        started as `uid` (StdioSession(run_as=uid)) then owns everything it reads and writes,
        the database's WAL files included (SQLite, when root opens the database later, gives the
        files it makes the database file's owner)."""
        hand_over(uid, self.home, self.workspace, self.policy_path)

    def cli_argv(self, *args: str) -> list[str]:
        """`mcp-gateway` with this state folder, database and policy, then `args`."""
        return [
            sys.executable, "-m", "gateway",
            "--home", str(self.home), "--db", self.url, "--policy", str(self.policy_path),
            *args,
        ]  # fmt: skip

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`mcp-gateway ... ARGS` (`cli_argv`) in a process of its own, forked (tests/forked_gateway.py)."""
        return forked_gateway.run(self.cli_argv(*args)[3:], input=stdin, timeout=60)

    def audit_events(self) -> list[dict[str, Any]]:
        result = self.cli("audit", "export")
        if result.returncode != 0:
            raise AssertionError(result.stderr)
        return [json.loads(line) for line in result.stdout.splitlines()]

    def all_events(self) -> list[dict[str, Any]]:
        """Every event as `audit export` prints them, read in process: `audit_events` without a CLI's
        start-up (about 0.5 s of CPU), for a test whose subject is not the command."""
        return [e.to_json() for e in AuditLog(self.engine, SystemClock()).events()]

    def events_of(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events as `audit export` prints them (read in process: no CLI start-up per call)."""
        return [e.to_json() for e in AuditLog(self.engine, SystemClock()).events(run_id=run_id)]

    def chain_ok(self) -> bool:
        log = AuditLog(self.engine, SystemClock())
        return verify_chain(log.events(), log.head()).ok


class StdioSession:
    """`mcp-gateway serve` in a subprocess, driven line by line."""

    def __init__(
        self,
        gateway: GatewayHome,
        extra_args: tuple[str, ...] = (),
        db_url: str | None = None,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        *,
        run_as: int | None = None,
        forked: bool = True,
    ) -> None:
        """`env` adds to the environment `serve` inherits, which never carries the tests' MCP_GATEWAY_TOKEN;
        `python` is the interpreter `serve` runs on (and so the one its runs execute); `run_as`, an
        ordinary uid `serve` runs as (setpriv), as a user's MCP client starts it: the rootless mode.
        Its state folder must be that uid's (GatewayHome.hand_to), and `env` should give it a HOME it owns.
        `forked` False: started as `python -m gateway` even where it could be forked (tests/forked_gateway.py),
        for a test that reads the gateway's process from outside (its /proc environ and command line are
        the helper's start's when forked)."""
        environment = {k: v for k, v in os.environ.items() if k != "MCP_GATEWAY_TOKEN"} | dict(env or {})
        self.stderr_path = gateway.root / f"serve-stderr-{id(self)}.log"
        self._stderr = self.stderr_path.open("wb")
        url = db_url or gateway.url
        argv = [
            python, "-m", "gateway",
            "--home", str(gateway.home), "--db", url, "--policy", str(gateway.policy_path),
            *extra_args, "serve",
        ]  # fmt: skip
        self.run_as = run_as
        self.process: subprocess.Popen[bytes] | forked_gateway.ForkedProcess
        if forked and run_as is None and python == sys.executable:
            # Forked from a helper with the gateway imported (tests/forked_gateway.py): the same process
            # on the same pipes, without the 0.75 s of CPU its imports cost.
            self.process = forked_gateway.start(argv[3:], env=environment, stderr=self._stderr)
        else:
            self.process = subprocess.Popen(
                argv if run_as is None else as_uid_argv(run_as, argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=environment,
            )
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._pending: dict[Any, dict[str, Any]] = {}
        self.unsolicited: list[dict[str, Any]] = []
        self.responder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        """Answers server-to-client requests (e.g. elicitation/create): message -> result."""
        self._next_id = 0
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(b"")

    def send_raw(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message: Mapping[str, Any]) -> None:
        self.send_raw(json.dumps(message).encode() + b"\n")

    def read_message(self, timeout: float = 30) -> dict[str, Any]:
        line = self._lines.get(timeout=timeout)
        if not line:
            raise EOFError("the gateway closed its stdout")
        message: dict[str, Any] = json.loads(line)
        return message

    def wait_response(self, request_id: Any, timeout: float = 60) -> dict[str, Any]:
        if request_id in self._pending:
            return self._pending.pop(request_id)
        while True:
            message = self.read_message(timeout)
            if self._handled(message):
                continue
            if message.get("id") == request_id:
                return message
            self._pending[message.get("id")] = message

    def pump(self, timeout: float = 0.1) -> None:
        """Handle what arrives within `timeout`, if anything: answer the gateway's requests, keep responses for
        `wait_response`. For a test that waits on something else (a run's processes) while calls are in flight."""
        try:
            message = self.read_message(timeout)
        except queue.Empty:
            return
        if not self._handled(message):
            self._pending[message.get("id")] = message

    def _handled(self, message: dict[str, Any]) -> bool:
        """A message from the gateway that is not a response: noted, and answered when it is a request."""
        if "method" not in message:
            return False
        self.unsolicited.append(message)
        if "id" in message and self.responder is not None:
            self.send({"jsonrpc": "2.0", "id": message["id"], "result": self.responder(message)})
        return True

    def request(self, method: str, params: Mapping[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = dict(params)
        self.send(message)
        return self.wait_response(self._next_id, timeout)

    def initialize(
        self, capabilities: Mapping[str, Any] | None = None, version: str = LEGACY, timeout: float = START_S
    ) -> dict[str, Any]:
        """The gateway's answer to `initialize`, waited for `timeout` s (TEST_TIME_SCALE times): its start-up."""
        response = self.request(
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": dict(capabilities or {}),
                "clientInfo": {"name": "tests", "version": "1"},
            },
            scaled(timeout),
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response

    def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, token: str | None = None, timeout: float = 60
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
        if token is not None:
            params["auth"] = {"token": token}
        return self.request("tools/call", params, timeout)

    def send_call(self, name: str, arguments: Mapping[str, Any] | None = None, token: str | None = None) -> int:
        """Send a tools/call without waiting, so that several are in flight; `wait_response(id)` collects each."""
        self._next_id += 1
        params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
        if token is not None:
            params["auth"] = {"token": token}
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": "tools/call", "params": params})
        return self._next_id

    def answered(self) -> dict[Any, dict[str, Any]]:
        """The responses read but not yet collected by `wait_response` (by request id)."""
        return dict(self._pending)

    def stderr_text(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> int:
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            code = self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=20)
        if self.process.stdout:
            self.process.stdout.close()
        self._stderr.close()
        return code


class Approver(Protocol):
    """`mcp-gateway approvals` in a pty: a `pexpect.spawn` made with an encoding, read after a match.

    pexpect types `before` and `match` for every moment of a child's life (None before the first
    match, the EOF or TIMEOUT class after one of those); the tests read them only after `expect`
    found a pattern, when they are text and a match: `as_approver` states that once.
    """

    before: str
    match: re.Match[str]

    def expect(self, pattern: Any, timeout: float | None = -1) -> int: ...
    def send(self, s: str) -> int: ...
    def terminate(self, force: bool = False) -> bool: ...


def as_approver(child: pexpect.spawn[str]) -> Approver:
    """A `pexpect.spawn(..., encoding="utf-8")` running `mcp-gateway approvals`, typed as the tests read it."""
    return cast(Approver, child)  # see Approver: what pexpect's union types cover that the tests never read


def shows_request(approver: Approver) -> str:
    """Wait for the next question on an approver's screen (a pexpect child); returns its id."""
    approver.expect(r"consent request (\w+) ---")
    request_id = str(approver.match.group(1))
    approver.expect(r"\[q\] quit")
    return request_id
