"""A tenant swaps their workspace (or an `allowed_paths` entry) for a symlink after the gateway loaded its policy (decision 30).

Each test has an arena of its own, since it renames the arena's folders: the workspace and a
second tenant's workspace (`other`, holding a secret) sit beside the 0644 policy file, in one
world-readable parent, so DAC lets the run uid read all of it and only the pinning stops it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox import probe_host
from sandbox.guarantees import Guarantee
from sandbox.limits import BACKENDS, Backend
from tests.adversarial.conftest import Arena, Run, answer_allow_once, open_arena
from tests.harness import GatewayHome

READER = """
import os
from _kit import attempt, report

def read(path):
    with open(path, "rb") as handle:
        return handle.read()

def test_read_through_the_swap():
    report(
        listing=attempt(lambda: sorted(os.listdir("."))),
        up=attempt(lambda: read("../other/secret.txt")),
        **{name: attempt(lambda path=path: read(path)) for name, path in PARAMS["paths"].items()},
    )
"""


@dataclass
class Tenants:
    arena: Arena
    parent: Path
    """Holds the workspace, `other/secret.txt`, `shared/data.txt` (an allowed path) and policy.yaml."""
    secret: bytes

    @property
    def workspace(self) -> Path:
        return self.arena.workspace

    def write_reader(self) -> None:
        """The hostile suite, in the workspace and mirrored where a link to the parent leads, so that
        a run that followed the link (as before the fix) would still find and execute it."""
        parent = self.parent
        self.arena.write(
            "adv/test_swap.py",
            READER,
            paths={
                "through_workspace": str(self.workspace / "other" / "secret.txt"),
                "through_workspace_to_root": str(self.workspace) + str(parent / "other" / "secret.txt"),
                "policy_through_workspace": str(self.workspace / "policy.yaml"),
                "direct": str(parent / "other" / "secret.txt"),
                "policy": str(parent / "policy.yaml"),
                "shared": str(parent / "shared" / "data.txt"),
                "through_shared": str(parent / "shared" / "secret.txt"),
            },
        )
        shutil.copytree(self.workspace / "adv", parent / "adv")
        for path in (parent / "adv", *(parent / "adv").iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)

    def hostile_path(self, target: str) -> str:
        """`test_path` naming the suite as seen through a link to `target` (to `/`: by its full path)."""
        return "adv/test_swap.py" if target == "parent" else str(self.parent / "adv" / "test_swap.py").lstrip("/")

    def assert_nothing_leaked(self, run: Run) -> None:
        run.assert_no_secret(self.secret)
        for value in self.arena.secrets.values():
            run.assert_no_secret(value)


@contextlib.contextmanager
def tenants(root: Path, backend: Backend) -> Iterator[Tenants]:
    if os.geteuid() != 0:
        pytest.skip("the sandbox confines only when the gateway runs as root (as CI runs it)")
    if backend == "bubblewrap" and not probe_host().mount_tree:
        pytest.fail("bubblewrap does not run here: `make test` installs Debian's bubblewrap")
    secret = f"other-tenant-{secrets.token_hex(16)}".encode()

    def prepare(gateway: GatewayHome) -> None:
        parent = gateway.workspace.parent
        (parent / "other").mkdir()
        (parent / "other" / "secret.txt").write_bytes(secret)
        (parent / "shared").mkdir()
        (parent / "shared" / "data.txt").write_text("shared data")
        for path in (parent, parent / "other", parent / "shared"):
            path.chmod(0o755)
        for path in (parent / "other" / "secret.txt", parent / "shared" / "data.txt", gateway.policy_path):
            path.chmod(0o644)

    policy = {
        "workspaces": {"other": "other"},  # relative to the policy file: beside the workspace
        "sandbox": {
            "backend": backend,
            "require": [g.value for g in Guarantee],
            "allowed_paths": ["shared"],
        },
    }
    with open_arena(root, policy, prepare=prepare) as arena:
        yield Tenants(arena, arena.workspace.parent, secret)


@contextlib.contextmanager
def swapped(path: Path, target: Path | str) -> Iterator[None]:
    """What the tenant does: rename the folder away, put a symlink in its place; restored after."""
    away = path.with_name(path.name + "-away")
    path.rename(away)
    path.symlink_to(target, target_is_directory=True)
    try:
        yield
    finally:
        path.unlink()
        away.rename(path)


def assert_refused(run: Run, reason: str) -> None:
    error = run.response.get("error")
    assert error is not None, f"the run went ahead:\n{run.stdout[-2000:]}"
    assert (error["code"], error["data"]["reason"]) == (-32004, reason), error
    assert "restart the gateway" in error["message"], error["message"]
    kinds = [e["event_type"] for e in run.events]
    assert kinds[0] == "MCP_TOOL_CALL" and kinds[-1] == "POLICY_BLOCKED", kinds
    assert "TOOL_STARTED" not in kinds and "SANDBOX_EXEC" not in kinds, kinds
    assert run.events[-1]["detail"]["blocked_reason"] == reason
    assert run.run_dir is not None and not run.run_dir.exists(), "nothing ran, so no artifact"


def swap_then_allow(
    path: Path, target: Path, stack: contextlib.ExitStack
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A consent responder that swaps `path` while the prompt is open, then allows once."""

    def respond(message: dict[str, Any]) -> dict[str, Any]:
        stack.enter_context(swapped(path, target))
        return answer_allow_once(message)

    return respond


@pytest.mark.parametrize("target", ["parent", "/"], ids=["link-to-parent", "link-to-root"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_workspace_swapped_for_a_link_after_start_is_refused(
    tmp_path_factory: pytest.TempPathFactory, backend: Backend, target: str
) -> None:
    with tenants(tmp_path_factory.mktemp(f"swap-{backend}"), backend) as t:
        t.write_reader()
        with swapped(t.workspace, t.parent if target == "parent" else "/"):
            run = t.arena.run(t.hostile_path(target))
        t.assert_nothing_leaked(run)
        assert_refused(run, "workspace_changed")
        assert "workspace 'default'" in run.response["error"]["message"]
        # Restored at its path, the same folder is accepted again: the run is confined to it.
        restored = t.arena.run("adv/test_swap.py")
        t.assert_nothing_leaked(restored)
        found = restored.report()
        listing = found.pop("listing")
        assert listing.startswith("ok:") and "'adv'" in listing and "'other'" not in listing, listing
        assert found.pop("shared") == "ok:" + b"shared data".hex(), "the allowed path is readable"
        assert all(outcome.startswith("blocked:") for outcome in found.values()), found


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_workspace_swapped_while_consent_is_pending_is_refused(
    tmp_path_factory: pytest.TempPathFactory, backend: Backend
) -> None:
    # Stage 4 passed before the prompt; the swap comes while a person reads it, long before the spawn.
    with tenants(tmp_path_factory.mktemp(f"swap-consent-{backend}"), backend) as t, contextlib.ExitStack() as stack:
        t.write_reader()
        t.arena.session.responder = swap_then_allow(t.workspace, t.parent, stack)
        run = t.arena.run("adv/test_swap.py")
        assert t.workspace.is_symlink(), "the swap happened during the call"
        t.assert_nothing_leaked(run)
        assert_refused(run, "workspace_changed")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_allowed_path_swapped_for_a_link_is_refused_after_start_and_during_consent(
    tmp_path_factory: pytest.TempPathFactory, backend: Backend
) -> None:
    with tenants(tmp_path_factory.mktemp(f"swap-allowed-{backend}"), backend) as t:
        t.write_reader()
        shared = t.parent / "shared"
        with swapped(shared, t.parent / "other"):
            after_start = t.arena.run("adv/test_swap.py")
        t.assert_nothing_leaked(after_start)
        assert_refused(after_start, "allowed_path_changed")
        with contextlib.ExitStack() as stack:
            t.arena.session.responder = swap_then_allow(shared, t.parent / "other", stack)
            during_consent = t.arena.run("adv/test_swap.py")
            assert shared.is_symlink(), "the swap happened during the call"
        t.assert_nothing_leaked(during_consent)
        assert_refused(during_consent, "allowed_path_changed")


def test_a_workspace_missing_at_load_refuses_calls_and_the_cli_still_works(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    def remove_workspace(gateway: GatewayHome) -> None:
        gateway.workspace.rename(gateway.workspace.with_name("not-yet"))

    if os.geteuid() != 0:
        pytest.skip("the sandbox confines only when the gateway runs as root (as CI runs it)")
    with open_arena(tmp_path_factory.mktemp("missing"), prepare=remove_workspace) as arena:
        missing = arena.run("tests")
        assert missing.response["error"]["code"] == -32004, missing.response
        assert missing.response["error"]["data"]["reason"] == "workspace_not_found"
        # Created after the load: still refused (it was never pinned) until the gateway restarts.
        arena.workspace.with_name("not-yet").rename(arena.workspace)
        created = arena.run("tests")
        assert created.response["error"]["data"]["reason"] == "workspace_not_found"
        listed = arena.session.call_tool("list_artifacts", {}, arena.token)
        assert "result" in listed, "read tools do not need the folder"
        arena.workspace.rename(arena.workspace.with_name("not-yet"))
        check = arena.gateway.cli("policy", "check")
        assert check.returncode == 0 and "Traceback" not in check.stderr, check.stderr
        assert "which is not a directory" in check.stderr
        arguments = '{"test_path": "tests"}'
        explain = arena.gateway.cli("policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", arguments)
        assert "workspace_not_found" in explain.stdout and "Traceback" not in explain.stderr, explain
        arena.workspace.with_name("not-yet").rename(arena.workspace)
