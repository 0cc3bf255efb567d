"""Every refusal of an upstream server's tool, over real `serve`: both protocol eras, with `params.auth` and with the
environment token, as root and as an ordinary user (docs/upstreams.md, docs/error-codes.md).

One gateway and one session per (era, token, who): `serve` and its upstream server start once per cell of
the matrix, and every case below runs against each cell in turn (each cell is a unit of the parallel
suite: tests/conftest.py `CELL_GROUPS`). A case asserts the code and `data.reason`, the call's audit
trail (its entry and terminal event; `UPSTREAM_CALL` only for a refusal after the call reached the
server), whether a person was asked, and whether the server saw the call: the test server
(tests/upstreams/server.py) keeps every call it received, and its `seen` tool hands them over (and
forgets them). Before the first call the policy admits, no server may run at all.

The cells differ in how a call is made, not in what it is refused for:
- era: 2025-11-25 (`initialize`, consent by `elicitation/create`) or 2026-07-28 (the `_meta` envelope on
  each request, consent by an `input_required` round);
- token: `params.auth` (each case a user of its own), or none in the call and the gateway's
  MCP_GATEWAY_TOKEN under `auth.env_token` (one user for the whole cell: what a case needs of the user, a
  role, a workspace, a spent budget, a disabled account, is set in the database for the case and put
  back after it; the gateway reads it at every call, as `user set-role` relies on);
- who: `serve` as root (each server its pool uid), or as an ordinary uid (`MATRIX_UIDS`: a user namespace).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import delete, insert, select, update

from gateway import db
from gateway.clock import SystemClock
from gateway.users import UserStore
from sandbox.guarantees import Guarantee
from tests.deadlines import scaled
from tests.e2e.test_upstreams import install_server, servers_of
from tests.harness import (
    FORM_ELICITATION,
    LEGACY,
    MODERN,
    GatewayHome,
    StdioSession,
    enterable_by_everyone,
    modern_meta,
)

MATRIX_UIDS = {(LEGACY, "params"): 64131, (LEGACY, "env"): 64132, (MODERN, "params"): 64133, (MODERN, "env"): 64134}
"""The ordinary uid of each rootless cell: no account, not a pool uid, not another module's, nor another
cell's (the cells may run side by side: tests/conftest.py `CELL_GROUPS`)."""
TIMEOUT_S = 2
"""`upstreams.up.timeout_s`: the timeout case waits this long; every other call of the test server takes ms."""
CAP = 50_000
"""`upstreams.up.max_output_bytes`."""
ENV_USER = "envuser"
ALLOW = {"action": "accept", "content": {"decision": "allow_once"}}
DENY = {"action": "accept", "content": {"decision": "deny_once"}}
BEFORE = ["MCP_TOOL_CALL", "POLICY_BLOCKED"]
AFTER = ["MCP_TOOL_CALL", "mcp.permission.decision", "TOOL_STARTED", "UPSTREAM_CALL", "TOOL_FINISHED"]

POLICY: dict[str, Any] = {
    "tools": {
        "allowlist": [
            "run_pytest", "up__echo", "up__env_digest", "up__sleep", "up__crash", "up__big", "up__drift", "up__seen",
            "gone__echo",
        ],
    },
    "budget": {"attempts_total": 10_000, "elapsed_ms_total": 100_000_000},
    "sandbox": {"allowed_paths": ["bin"], "max_output_bytes": 200_000},
    "upstreams": {
        "up": {
            "command": ["bin/upstream"],
            "trust": "untrusted",
            "tools": ["echo", "note", "env_digest", "sleep", "crash", "big", "drift", "seen"],  # `note`: not allowlisted
            "timeout_s": TIMEOUT_S,
            "max_output_bytes": CAP,
        },
        # A server that never starts: its environment names a variable the gateway does not have.
        "gone": {"command": ["bin/upstream"], "tools": ["echo", "note"], "env": {"NEEDED": "${MATRIX_NEVER_SET}"}},
    },
}  # fmt: skip


@dataclass(frozen=True)
class Cell:
    era: str
    token: str
    """`params` (params.auth) or `env` (MCP_GATEWAY_TOKEN under auth.env_token)."""
    who: str
    """`root` or `rootless`."""

    def __str__(self) -> str:
        return f"{'2025' if self.era == LEGACY else '2026'}-{self.token}-{self.who}"


CELLS = [Cell(*values) for values in itertools.product((LEGACY, MODERN), ("params", "env"), ("root", "rootless"))]


@dataclass
class Bench:
    """One cell's gateway and session, and what the cases need of them."""

    cell: Cell
    gateway: GatewayHome
    session: StdioSession
    users: UserStore
    asked: list[str] = field(default_factory=list)
    """The tools a person was asked about, in order (either era)."""
    names: Iterator[int] = field(default_factory=itertools.count)
    started: bool = False
    """Whether a call the policy admits was made yet: until then no server of the cell may be running."""

    @property
    def env(self) -> bool:
        return self.cell.token == "env"

    def call(
        self, name: str, arguments: Mapping[str, Any], token: str | None, answer: Mapping[str, Any]
    ) -> dict[str, Any]:
        """One tools/call as the cell's client makes it; a person answers `answer` if asked."""
        params: dict[str, Any] = {"name": name, "arguments": dict(arguments)}
        if token is not None:
            params["auth"] = {"token": token}
        if self.cell.era == LEGACY:

            def respond(message: dict[str, Any]) -> dict[str, Any]:
                assert message["method"] == "elicitation/create", message
                self.asked.append(name)
                return dict(answer)

            self.session.responder = respond
            return self.session.request("tools/call", params, timeout=scaled(120))
        params["_meta"] = modern_meta()
        first = self.session.request("tools/call", params, timeout=scaled(120))
        if first.get("result", {}).get("resultType") != "input_required":
            return first
        self.asked.append(name)
        retry = {**params, "inputResponses": {"consent": dict(answer)}, "requestState": first["result"]["requestState"]}
        return self.session.request("tools/call", retry, timeout=scaled(120))

    def listed(self, token: str | None) -> set[str]:
        """The tools tools/list shows the caller (`token`, or the environment token's user)."""
        params: dict[str, Any] = {} if token is None else {"auth": {"token": token}}
        if self.cell.era == MODERN:
            params["_meta"] = modern_meta()
        response = self.session.request("tools/list", params, timeout=scaled(120))
        return {tool["name"] for tool in response["result"]["tools"]}

    @contextlib.contextmanager
    def caller(
        self,
        *,
        role: str = "USER",
        workspaces: tuple[str, ...] = ("default",),
        disabled: bool = False,
        spent: bool = False,
    ) -> Iterator[Caller]:
        """The case's caller, as the database holds it for the case: a user of its own (`params`), or the
        environment token's user set so for the case and put back after it (`env`)."""
        name = ENV_USER if self.env else f"m{next(self.names)}"
        if not self.env:
            self.gateway.add_user(name, "USER")
        token = None if self.env else self.gateway.token(name)
        before = self._state_of(name)
        try:
            self._set(name, role=role, workspaces=workspaces, disabled=disabled, spent=spent)
            yield Caller(name, token)
        finally:
            self._set(name, **before)

    def _state_of(self, name: str) -> dict[str, Any]:
        record = self.users.fetch(name)
        assert record is not None
        return {"role": record.role, "workspaces": record.workspaces, "disabled": record.disabled, "spent": False}

    def _set(self, name: str, *, role: str, workspaces: tuple[str, ...], disabled: bool, spent: bool) -> None:
        with self.gateway.engine.begin() as connection:
            user_id = connection.execute(select(db.users.c.id).where(db.users.c.name == name)).scalar_one()
            connection.execute(update(db.users).where(db.users.c.id == user_id).values(role=role, disabled=disabled))
            connection.execute(delete(db.user_workspaces).where(db.user_workspaces.c.user_id == user_id))
            if workspaces:
                connection.execute(
                    insert(db.user_workspaces), [{"user_id": user_id, "workspace": w} for w in workspaces]
                )
            spend = db.budget_charges.c.run_id == f"matrix-spent-{name}"
            connection.execute(delete(db.budget_charges).where(spend))
            if spent:  # the whole window's run time, taken by one earlier run
                row = {
                    "user_name": name,
                    "ts": time.time(),
                    "elapsed_ms": 100_000_000,
                    "run_id": f"matrix-spent-{name}",
                }
                connection.execute(insert(db.budget_charges), [row])

    def seen(self) -> list[list[Any]]:
        """The calls the test server received since the last `seen` (it forgets them as it answers)."""
        self.started = True
        with self.caller() as caller:
            response = self.call("up__seen", {}, caller.token, ALLOW)
        assert "result" in response, response
        calls: list[list[Any]] = json.loads(response["result"]["content"][0]["text"])
        return calls

    def trail(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        return self.gateway.events_of(run_id_of(response))

    def servers(self) -> list[psutil.Process]:
        return servers_of(self.gateway)


@dataclass(frozen=True)
class Caller:
    name: str
    token: str | None
    """None: the call carries no params.auth (the environment token's cell)."""


def run_id_of(response: dict[str, Any]) -> str:
    if "error" in response:
        return str(response["error"]["data"]["run_id"])
    return str(response["result"]["_meta"]["mcp-write-gateway/run_id"])


@contextlib.contextmanager
def cell_gateway(cell: Cell, run_as: int | None, sandbox: Mapping[str, Any] | None = None) -> Iterator[Bench]:
    """`serve` for `cell` (as `run_as`, an ordinary uid, when given) on POLICY and `sandbox` over its sandbox."""
    # Outside pytest's temp folder, which pytest makes 0700 again at each session start (tests/harness.py).
    root = Path(tempfile.mkdtemp(prefix=f"mcp-matrix-{cell}-"))
    enterable_by_everyone(root)
    policy: dict[str, Any] = {**POLICY, "auth": {"env_token": cell.token == "env"}}
    policy["sandbox"] = {**POLICY["sandbox"], **({} if run_as is None else {"backend": "native"}), **(sandbox or {})}
    gateway = GatewayHome(root, policy)
    try:
        install_server(gateway)
        gateway.add_user(ENV_USER, "USER")
        env = {"HOME": str(root)}
        if cell.token == "env":
            env["MCP_GATEWAY_TOKEN"] = gateway.token(ENV_USER, ttl_s=3600)
        if run_as is not None:
            gateway.hand_to(run_as)
            os.chown(root, run_as, run_as)
        session = StdioSession(gateway, env=env, run_as=run_as)
        try:
            if cell.era == LEGACY:
                assert "result" in session.initialize(FORM_ELICITATION), session.stderr_text()
            yield Bench(cell, gateway, session, UserStore(gateway.engine, SystemClock()))
        finally:
            session.close()
            assert "Traceback" not in session.stderr_text(), session.stderr_text()
    finally:
        gateway.engine.dispose()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=CELLS, ids=str)
def bench(request: pytest.FixtureRequest) -> Iterator[Bench]:
    cell: Cell = request.param
    with cell_gateway(cell, MATRIX_UIDS[cell.era, cell.token] if cell.who == "rootless" else None) as bench:
        yield bench


# --- what every case asserts ------------------------------------------------------------------------


def refused(response: dict[str, Any], code: int, reason: str) -> dict[str, Any]:
    assert "error" in response, response
    error: dict[str, Any] = response["error"]
    assert (error["code"], error["data"].get("reason")) == (code, reason), error
    assert len(error["data"]["run_id"]) == 32
    return error


def refused_before_the_call(
    bench: Bench, response: dict[str, Any], code: int, reason: str, *, caller: Caller | None, asked: bool = False
) -> list[dict[str, Any]]:
    """Refused before anything reached the server: the entry, the decision if a person was asked, the
    terminal POLICY_BLOCKED with the code; no UPSTREAM_CALL; the server saw nothing (asked with `seen`), or,
    before any call the policy admits, no server was even started."""
    asked_before = len(bench.asked)
    refused(response, code, reason)
    trail = bench.trail(response)
    kinds = [e["event_type"] for e in trail]
    expected = ["MCP_TOOL_CALL", "mcp.permission.decision", "POLICY_BLOCKED"] if asked else BEFORE
    assert kinds == expected, trail
    assert trail[-1]["code"] == code and trail[-1]["detail"]["blocked_reason"] == reason, trail[-1]
    if caller is not None:
        assert {e["user"] for e in trail} == {caller.name}, trail
    if not bench.started:
        assert bench.servers() == [], "a call the policy refuses started the upstream's server"
        return trail
    assert bench.seen() == [], "the server saw a call that was refused before it"
    assert len(bench.asked) == asked_before + 1, "nobody else was asked: seen's own question"
    return trail


def refused_after_the_call(
    bench: Bench, response: dict[str, Any], code: int, reason: str, *, caller: Caller, ended: str
) -> list[dict[str, Any]]:
    """Refused once the call had reached the server: allowed by a person, UPSTREAM_CALL with how it
    ended, TOOL_FINISHED with the code."""
    refused(response, code, reason)
    trail = bench.trail(response)
    assert [e["event_type"] for e in trail] == AFTER, trail
    decision, called, finished = trail[1], trail[3], trail[4]
    assert decision["detail"]["decision"] == "ALLOW_ONCE", decision
    assert (called["detail"]["upstream"], called["detail"]["ended"]) == ("up", ended), called
    assert finished["code"] == code, finished
    assert finished["detail"]["status"] == "error" and finished["detail"]["reason"] == reason, finished
    assert {e["user"] for e in trail} == {caller.name}, trail
    return trail


# --- the cases, in the order each cell runs them ------------------------------------------------------


def test_a_call_without_a_usable_identity_is_32001(bench: Bench) -> None:
    with bench.caller(disabled=True) as caller:
        response = bench.call("up__echo", {"text": "disabled"}, caller.token, ALLOW)
    refused_before_the_call(bench, response, -32001, "user_disabled", caller=None)
    if not bench.env:
        response = bench.call("up__echo", {"text": "no token"}, None, ALLOW)
        refused_before_the_call(bench, response, -32001, "token_missing", caller=None)


def test_a_role_without_the_upstreams_permission_is_32003(bench: Bench) -> None:
    with bench.caller(role="VIEWER") as caller:
        listed = bench.listed(caller.token)
        assert "run_pytest" not in listed and not [n for n in listed if "__" in n], listed
        assert bench.servers() == [], "a listing for a caller who may call no upstream tool started a server"
        # The permission is the policy's: refused alike whether the server is not started yet or cannot start.
        for name in ("up__echo", "gone__echo"):
            response = bench.call(name, {"text": "viewer"}, caller.token, ALLOW)
            refused_before_the_call(bench, response, -32003, "missing_permission", caller=caller)


def test_a_tool_the_allowlist_leaves_out_is_32004(bench: Bench) -> None:
    with bench.caller() as caller:
        for name in ("up__note", "gone__note"):
            response = bench.call(name, {"name": "n.txt", "text": "x"}, caller.token, ALLOW)
            refused_before_the_call(bench, response, -32004, "tool_not_allowlisted", caller=caller)


def test_a_caller_without_the_served_workspace_is_32004(bench: Bench) -> None:
    with bench.caller(workspaces=()) as caller:
        for name in ("up__echo", "gone__echo"):
            response = bench.call(name, {"text": "no workspace"}, caller.token, ALLOW)
            refused_before_the_call(bench, response, -32004, "workspace_not_allowed", caller=caller)


def test_a_spent_budget_is_32005(bench: Bench) -> None:
    with bench.caller(spent=True) as caller:
        response = bench.call("up__echo", {"text": "spent"}, caller.token, ALLOW)
    refused_before_the_call(bench, response, -32005, "elapsed_exhausted", caller=caller)
    assert response["error"]["data"]["retry_after_s"] >= 1


def test_a_call_allowed_reaches_the_server_and_is_audited(bench: Bench) -> None:
    assert bench.servers() == [], "no server before the first call the policy admits"
    bench.started = True
    with bench.caller() as caller:
        response = bench.call("up__echo", {"text": "hello"}, caller.token, ALLOW)
    assert response["result"]["content"] == [{"type": "text", "text": "hello"}], response
    assert [e["event_type"] for e in bench.trail(response)] == AFTER
    assert bench.asked[-1] == "up__echo"
    assert bench.seen() == [["echo", {"text": "hello"}]]


def test_the_server_never_sees_the_gateways_token(bench: Bench) -> None:
    """In the environment token's cells the gateway has MCP_GATEWAY_TOKEN: its server never does."""
    with bench.caller() as caller:
        response = bench.call("up__env_digest", {"name": "MCP_GATEWAY_TOKEN"}, caller.token, ALLOW)
    assert response["result"]["content"][0]["text"] == "absent", response
    assert bench.seen() == [["env_digest", {"name": "MCP_GATEWAY_TOKEN"}]]


def test_a_definition_changed_since_it_was_pinned_is_32004(bench: Bench) -> None:
    with bench.caller() as caller:
        drifted = bench.call("up__drift", {}, caller.token, ALLOW)
        assert drifted["result"]["content"][0]["text"] == "drifted to version 1", drifted
        response = bench.call("up__drift", {}, caller.token, ALLOW)
    error = refused(response, -32004, "tool_definition_changed")
    assert "mcp-gateway upstream accept up drift" in error["message"], error
    listed = bench.listed(caller.token)
    assert "up__drift" not in listed and {"up__echo", "up__seen"} <= listed, "withheld, and that tool alone"
    trail = bench.trail(response)
    assert [e["event_type"] for e in trail] == BEFORE, trail
    assert bench.seen() == [["drift", {}]], "the server saw the first call only"


def test_arguments_off_the_schema_and_unknown_tools_are_32602(bench: Bench) -> None:
    with bench.caller() as caller:
        for name, arguments, reason in (
            ("up__echo", {"text": "x", "more": 1}, "invalid_arguments"),
            ("up__echo", {"text": 3}, "invalid_arguments"),
            ("up__nothing", {"text": "x"}, "unknown_tool"),
        ):
            response = bench.call(name, arguments, caller.token, ALLOW)
            refused_before_the_call(bench, response, -32602, reason, caller=caller)


def test_a_person_who_denies_is_32008(bench: Bench) -> None:
    with bench.caller() as caller:
        response = bench.call("up__echo", {"text": "denied"}, caller.token, DENY)
    assert bench.asked[-1] == "up__echo"
    trail = refused_before_the_call(bench, response, -32008, "consent_denied", caller=caller, asked=True)
    assert trail[1]["detail"]["decision"] == "DENY_ONCE"
    if bench.cell.era == MODERN:  # an answer that belongs to no question asked: nothing is allowed by it
        forged = {"name": "up__echo", "arguments": {"text": "forged"}, "_meta": modern_meta()}
        forged |= {"inputResponses": {"consent": ALLOW}, "requestState": "0" * 32}
        with bench.caller() as caller:
            if caller.token is not None:
                forged["auth"] = {"token": caller.token}
            response = bench.session.request("tools/call", forged, timeout=scaled(120))
        refused(response, -32008, "consent_state_invalid")
        kinds = [e["event_type"] for e in bench.trail(response)]
        assert kinds[0] == "MCP_TOOL_CALL" and kinds[-1] == "POLICY_BLOCKED" and "TOOL_STARTED" not in kinds, kinds
        assert bench.seen() == []


def test_an_answer_over_the_cap_is_32006_and_the_server_goes_on(bench: Bench) -> None:
    with bench.caller() as caller:
        response = bench.call("up__big", {"bytes": CAP + 10_000}, caller.token, ALLOW)
        trail = refused_after_the_call(bench, response, -32006, "output_limit", caller=caller, ended="output_limit")
    assert trail[3]["detail"]["result_bytes"] > CAP
    assert bench.seen() == [["big", {"bytes": CAP + 10_000}]]


def test_a_server_that_cannot_start_is_32603_before_the_call(bench: Bench) -> None:
    with bench.caller() as caller:
        response = bench.call("gone__echo", {"text": "x"}, caller.token, ALLOW)
    error = refused(response, -32603, "upstream_unavailable")
    assert error["data"]["step"] == "env" and "MATRIX_NEVER_SET" in error["message"], error
    refused_before_the_call(bench, response, -32603, "upstream_unavailable", caller=caller)


def test_a_server_that_ends_during_the_call_is_32603_and_starts_again(bench: Bench) -> None:
    (before,) = bench.servers()
    with bench.caller() as caller:
        response = bench.call("up__crash", {}, caller.token, ALLOW)
        refused_after_the_call(bench, response, -32603, "upstream_unavailable", caller=caller, ended="unavailable")
    message = response["error"]["message"]
    assert "crashing on purpose" in message, "the server ran the call: its last words"
    assert "exit 3" in message and "fix:" in message, message
    assert bench.seen() == [], "a new server"
    (after,) = bench.servers()
    assert after.pid != before.pid


def test_a_call_past_its_time_is_32007_and_the_server_starts_again(bench: Bench) -> None:
    (before,) = bench.servers()
    with bench.caller() as caller:
        started = time.monotonic()
        response = bench.call("up__sleep", {"seconds": 60}, caller.token, ALLOW)
        took = time.monotonic() - started
        trail = refused_after_the_call(bench, response, -32007, "timeout", caller=caller, ended="timeout")
    assert trail[3]["detail"]["duration_ms"] >= TIMEOUT_S * 1000, "the server had the call for its whole time"
    assert took < scaled(60), "not the server's 60 s"
    assert bench.seen() == [], "a new server"
    (after,) = bench.servers()
    assert after.pid != before.pid


def test_a_program_changed_since_load_is_32004(bench: Bench) -> None:
    """Last in each cell: the program stays changed for the rest of the gateway's life."""
    program = bench.gateway.policy_path.parent / "bin" / "upstream"
    stat = program.stat()
    os.utime(program, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    (server,) = bench.servers()
    with bench.caller() as caller:
        response = bench.call("up__echo", {"text": "changed"}, caller.token, ALLOW)
    error = refused(response, -32004, "program_changed")
    assert str(program) in error["message"], error
    trail = bench.trail(response)
    assert [e["event_type"] for e in trail] == BEFORE, trail
    assert trail[-1]["detail"]["blocked_reason"] == "program_changed"
    # The server cannot be asked what it saw (every tool of it is refused now): it is the same process,
    # and nothing of the call is in the trail past its refusal.
    assert [p.pid for p in bench.servers()] == [server.pid]


# --- a policy whose sandbox cannot confine a server -------------------------------------------------


def test_with_the_sandbox_off_no_server_starts_and_a_call_is_32006(
    make_gateway: Callable[..., GatewayHome], open_session: Callable[..., StdioSession]
) -> None:
    """A server is someone else's code: it runs confined or not at all. Not a cell: a policy of its own."""
    gateway = make_gateway({**POLICY, "auth": {"env_token": True}, "sandbox": {**POLICY["sandbox"], "enabled": False}})
    install_server(gateway)
    gateway.add_user(ENV_USER, "USER")
    session = open_session(gateway, env={"MCP_GATEWAY_TOKEN": gateway.token(ENV_USER)})
    bench = Bench(Cell(LEGACY, "env", "root"), gateway, session, UserStore(gateway.engine, SystemClock()))

    assert not [name for name in bench.listed(None) if "__" in name], "listed without any server"
    for token in (gateway.token(ENV_USER), None):  # params.auth, then the environment token
        for name in ("up__echo", "gone__echo"):
            response = bench.call(name, {"text": "off"}, token, ALLOW)
            refused_before_the_call(bench, response, -32006, "sandbox_disabled", caller=Caller(ENV_USER, token))
    assert bench.asked == []


def test_a_program_changed_before_its_server_started_never_runs(
    make_gateway: Callable[..., GatewayHome], open_session: Callable[..., StdioSession]
) -> None:
    """A file put in the pinned program's place after load is not started: not by a listing anyone may ask
    for, not by a call (refused -32004 before any server is asked for). Each cell changes it once its
    server runs (the last case); this gateway, before."""
    gateway = make_gateway(POLICY)
    install_server(gateway)
    gateway.add_user(ENV_USER, "USER")
    session = open_session(gateway, capabilities=FORM_ELICITATION)
    bench = Bench(Cell(LEGACY, "params", "root"), gateway, session, UserStore(gateway.engine, SystemClock()))
    program = gateway.policy_path.parent / "bin" / "upstream"
    program.write_text(program.read_text() + "# another program now\n")

    assert not [name for name in bench.listed(None) if name.startswith("up__")], "listed from a changed program"
    assert bench.servers() == []
    caller = Caller(ENV_USER, gateway.token(ENV_USER))
    response = bench.call("up__echo", {"text": "changed"}, caller.token, ALLOW)
    assert str(program) in refused(response, -32004, "program_changed")["message"]
    refused_before_the_call(bench, response, -32004, "program_changed", caller=caller)
    assert bench.asked == []
    session.close()
    assert "its server is not started: step program: upstreams.up's program changed" in session.stderr_text()


def test_a_database_out_of_reach_is_32603_and_starts_no_server(
    make_gateway: Callable[..., GatewayHome], open_session: Callable[..., StdioSession]
) -> None:
    """The -32603 reasons of the gateway's own storage, for an upstream's tool: nothing is started or sent."""
    gateway = make_gateway(POLICY)
    install_server(gateway)
    gateway.add_user(ENV_USER, "USER")
    missing = gateway.root / "no-such-folder" / "gateway.db"
    session = open_session(gateway, capabilities=FORM_ELICITATION, db_url=f"sqlite:///{missing}")
    bench = Bench(Cell(LEGACY, "params", "root"), gateway, session, UserStore(gateway.engine, SystemClock()))

    for name in ("up__echo", "gone__echo"):
        response = bench.call(name, {"text": "x"}, gateway.token(ENV_USER), ALLOW)
        assert response["error"]["code"] == -32603, response
        assert response["error"]["data"]["reason"] in ("audit_unavailable", "database_unavailable"), response
    assert bench.servers() == [] and bench.asked == []
    assert not missing.exists()
    assert "result" in session.request("ping"), "the gateway goes on answering"


LAYER_UID = 64135
"""The ordinary uid of the test below (not a cell's: it may run beside them)."""


def test_a_guarantee_the_host_cannot_keep_is_32006_and_starts_no_server() -> None:
    """As an ordinary user no cgroup keeps a memory total on this host (tests/rootless/): a policy that
    requires every guarantee refuses the call at stage 7, as run_pytest's, and no server is started."""
    required = {"require": [guarantee.value for guarantee in Guarantee]}
    with cell_gateway(Cell(LEGACY, "params", "rootless"), LAYER_UID, required) as bench:
        caller = Caller(ENV_USER, bench.gateway.token(ENV_USER))
        response = bench.call("up__echo", {"text": "x"}, caller.token, ALLOW)
        assert "memory_total" in refused(response, -32006, "sandbox_layer_missing")["message"]
        refused_before_the_call(bench, response, -32006, "sandbox_layer_missing", caller=caller)
        assert bench.asked == []
