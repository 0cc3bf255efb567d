"""@modelcontextprotocol/server-filesystem (npm, `make upstream-servers`) behind the gateway, started with the whole
disk (`/`) as its allowed folder (docs/upstreams/filesystem.md).

Two layers keep it in the workspace. The gateway's roots come first: the server asks for them and narrows itself
to the workspace, so a path outside is refused in the server's own words. The sandbox is beneath: the same server
made to ignore the roots it is given (examples/upstream-servers/ignore-roots.mjs, as an untrusted server may) still
writes nothing outside the workspace, even into a folder every uid may write, and reads nothing of the gateway's
state folder; the kernel refuses (EACCES, or EROFS where the sandbox mounts a path read-only; under
bubblewrap, ENOENT: the path is not in the server's tree). Inside the workspace a write lands only after a person allows it, and
its UPSTREAM_CALL holds the result's hash and the file's; with `workspace: read_only` nothing is written at all.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.canonical import canonical_json, sha256_hex
from sandbox.limits import BACKENDS
from tests.harness import FORM_ELICITATION, GatewayHome, StdioSession, enterable_by_everyone
from tests.upstreams.npm_servers import FILESYSTEM, NODE, NODE_MEMORY_MB, NODE_READS, NPM_FOLDER, require_installed

SessionFactory = Callable[..., StdioSession]
GatewayFactory = Callable[..., GatewayHome]

pytestmark = require_installed(FILESYSTEM)

TOOLS = ("write_file", "read_text_file", "list_allowed_directories")
IGNORE_ROOTS = NPM_FOLDER / "ignore-roots.mjs"
CALL_S = 120.0
KEPT = "the test's own file\n"
REFUSED_BY_THE_KERNEL = ("EACCES: permission denied", "EROFS: read-only file system")
"""How the server words the sandbox's refusals (Node's errno names): Landlock's, or a read-only mount's."""
NOT_IN_ITS_TREE = ("ENOENT: no such file or directory", *REFUSED_BY_THE_KERNEL)
"""Under bubblewrap a path outside the tree built for the server is not there at all."""


def filesystem_policy(workspace: str, *, ignore_roots: bool = False, backend: str = "native") -> dict[str, Any]:
    server = [str(FILESYSTEM), "/"]
    if ignore_roots:
        server = [NODE, "--import", str(IGNORE_ROOTS), str(FILESYSTEM.resolve()), "/"]
    return {
        "tools": {"allowlist": ["run_pytest", *(f"fs__{tool}" for tool in TOOLS)]},
        "sandbox": {
            "allowed_paths": [str(NPM_FOLDER), *NODE_READS],
            "memory_limit_mb": NODE_MEMORY_MB,
            "backend": backend,
        },
        "upstreams": {
            "fs": {
                "command": server,
                "workspace": workspace,
                "tools": list(TOOLS),
                "timeout_s": 60,
                "memory_limit_mb": NODE_MEMORY_MB,
            }
        },
    }


@pytest.fixture
def make_filesystem(make_gateway: GatewayFactory) -> Callable[..., GatewayHome]:
    def make(workspace: str, *, ignore_roots: bool = False, backend: str = "native") -> GatewayHome:
        gw = make_gateway()
        gw.write_policy(filesystem_policy(workspace, ignore_roots=ignore_roots, backend=backend))
        gw.add_user("alice", "USER")
        return gw

    return make


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder of the test's outside the workspace that every uid may write into, holding a file every uid may
    write: file modes stop no one there, only the sandbox can."""
    folder = tmp_path / "outside"
    folder.mkdir()
    enterable_by_everyone(folder)
    folder.chmod(0o777)
    kept = folder / "kept.txt"
    kept.write_text(KEPT)
    kept.chmod(0o666)
    return folder


def answering(decision: str, asked: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def respond(message: dict[str, Any]) -> dict[str, Any]:
        asked.append(message["params"]["message"])
        return {"action": "accept", "content": {"decision": decision}}

    return respond


def text_of(response: dict[str, Any]) -> str:
    assert "result" in response, response
    return "\n".join(block.get("text", "") for block in response["result"]["content"])


def upstream_call(gateway: GatewayHome, response: dict[str, Any]) -> dict[str, Any]:
    run_id = response["result"]["_meta"]["mcp-write-gateway/run_id"]
    [event] = [e for e in gateway.events_of(run_id) if e["event_type"] == "UPSTREAM_CALL"]
    detail: dict[str, Any] = event["detail"]
    return detail


def test_a_write_in_the_workspace_lands_after_allow_audited_with_its_hashes_and_nothing_after_deny(
    make_filesystem: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_filesystem("write")
    target = gateway.workspace / "AGENT.md"
    session = open_session(gateway, capabilities=FORM_ELICITATION)
    token = gateway.token("alice")
    asked: list[str] = []

    session.responder = answering("deny_once", asked)
    denied = session.call_tool("fs__write_file", {"path": str(target), "content": "denied\n"}, token, timeout=CALL_S)
    assert (denied["error"]["code"], denied["error"]["data"]["reason"]) == (-32008, "consent_denied")
    assert not target.exists()

    session.responder = answering("allow_once", asked)
    written = session.call_tool("fs__write_file", {"path": str(target), "content": "allowed\n"}, token, timeout=CALL_S)
    assert text_of(written) == f"Successfully wrote to {target}"
    assert target.read_text() == "allowed\n"
    assert len(asked) == 2
    assert "Upstream server: fs (untrusted)" in asked[1]
    assert "destructiveHint: true" in asked[1]

    detail = upstream_call(gateway, written)
    document = {key: written["result"][key] for key in ("content", "structuredContent", "isError")}
    assert detail["result_sha256"] == sha256_hex(canonical_json(document))
    changes = detail["changes"]
    assert [(f["path"], f["action"]) for f in changes["files"]] == [("AGENT.md", "added")]
    assert changes["files"][0]["sha256_after"] == hashlib.sha256(b"allowed\n").hexdigest()
    assert (changes["applied"], changes["refused"]) == (True, [])


def test_the_gateways_root_narrows_the_server_to_the_workspace(
    make_filesystem: Callable[..., GatewayHome], open_session: SessionFactory, outside: Path
) -> None:
    gateway = make_filesystem("write")
    session = open_session(gateway, capabilities=FORM_ELICITATION)
    session.responder = answering("allow_once", [])
    token = gateway.token("alice")
    allowed = session.call_tool("fs__list_allowed_directories", {}, token, timeout=CALL_S)
    assert text_of(allowed) == f"Allowed directories:\n{gateway.workspace}"

    written = session.call_tool(
        "fs__write_file", {"path": str(outside / "new.txt"), "content": "x"}, token, timeout=CALL_S
    )
    assert written["result"]["isError"] is True
    assert text_of(written).startswith("Access denied - path outside allowed directories")
    assert not (outside / "new.txt").exists()


def check_kept_in_the_workspace(
    session: StdioSession, token: str, gateway: GatewayHome, outside: Path, refusals: tuple[str, ...], *states: Path
) -> dict[str, Any]:
    """The server that ignores its root believes the whole disk is its own; its writes into `outside` (holding
    `kept.txt`) and its reads of `states` fail as `refusals` say, its overwrite of a workspace file lands (the
    answer to that call is returned)."""
    allowed = session.call_tool("fs__list_allowed_directories", {}, token, timeout=CALL_S)
    assert text_of(allowed) == "Allowed directories:\n/"

    kept, new = outside / "kept.txt", outside / "new.txt"
    for path in (kept, new):
        refused = session.call_tool("fs__write_file", {"path": str(path), "content": "x"}, token, timeout=CALL_S)
        assert refused["result"]["isError"] is True, refused
        assert text_of(refused).startswith(refusals), (path, text_of(refused))
    assert kept.read_text() == KEPT
    assert sorted(p.name for p in outside.iterdir()) == ["kept.txt"]

    for state in states:
        assert state.is_file()  # there to be read, by anyone but the server
        read = session.call_tool("fs__read_text_file", {"path": str(state)}, token, timeout=CALL_S)
        assert read["result"]["isError"] is True, (state, read)
        assert text_of(read).startswith(refusals), (state, text_of(read))
        assert state.read_bytes()[:15].decode(errors="replace") not in text_of(read)

    # The workspace itself is the server's to write (through its copy, brought back after the call).
    project = gateway.workspace / "pyproject.toml"
    written = session.call_tool(
        "fs__write_file", {"path": str(project), "content": "# the agent's\n"}, token, timeout=CALL_S
    )
    assert text_of(written) == f"Successfully wrote to {project}"
    assert project.read_text() == "# the agent's\n"
    return written


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_that_ignores_its_root_is_kept_in_the_workspace_by_the_sandbox(
    make_filesystem: Callable[..., GatewayHome], open_session: SessionFactory, outside: Path, backend: str
) -> None:
    if backend == "bubblewrap" and shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is not installed: `make test` installs Debian's bubblewrap")
    gateway = make_filesystem("write", ignore_roots=True, backend=backend)
    session = open_session(gateway, capabilities=FORM_ELICITATION)
    session.responder = answering("allow_once", [])
    refusals = NOT_IN_ITS_TREE if backend == "bubblewrap" else REFUSED_BY_THE_KERNEL
    state = (gateway.home / "gateway.db", gateway.policy_path)
    written = check_kept_in_the_workspace(session, gateway.token("alice"), gateway, outside, refusals, *state)
    assert [(f["path"], f["action"]) for f in upstream_call(gateway, written)["changes"]["files"]] == [
        ("pyproject.toml", "modified")
    ]


def test_a_read_only_server_reads_the_workspace_and_writes_nothing(
    make_filesystem: Callable[..., GatewayHome], open_session: SessionFactory
) -> None:
    gateway = make_filesystem("read_only")
    session = open_session(gateway, capabilities=FORM_ELICITATION)
    session.responder = answering("allow_once", [])
    token = gateway.token("alice")
    project = gateway.workspace / "pyproject.toml"
    before = project.read_text()

    read = session.call_tool("fs__read_text_file", {"path": str(project)}, token, timeout=CALL_S)
    assert text_of(read) == before
    for path in (project, gateway.workspace / "new.txt"):
        refused = session.call_tool("fs__write_file", {"path": str(path), "content": "x"}, token, timeout=CALL_S)
        assert refused["result"]["isError"] is True, path
        assert text_of(refused).startswith(REFUSED_BY_THE_KERNEL), (path, text_of(refused))
        assert "changes" not in upstream_call(gateway, refused)
    assert project.read_text() == before
    assert not (gateway.workspace / "new.txt").exists()
