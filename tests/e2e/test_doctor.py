"""`mcp-gateway doctor` on each way this host can be used: as root, as an ordinary user, as root without CAP_SYS_ADMIN.

Each case runs the real command, which probes the real kernel with throwaway children as the
user it runs as; the tests assert what that user gets here and what the output says about the
rest (the cause and the fix), in text and in JSON, and the exit status a CI gate reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.guarantees import Guarantee
from tests.harness import REPO, enterable_by_everyone

USER_UID = 64071
"""An ordinary uid with no account (CI machines are fresh): not root, not a pool uid."""


def capsh_prefix() -> list[str]:
    return ["capsh", "--drop=cap_sys_admin,cap_net_admin", "--"]


def doctor(
    home: Path, *args: str, policy: Path | None = None, as_uid: int | None = None, capsh: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")} | {"HOME": str(home)}
    command = [sys.executable, "-m", "gateway", "--home", str(home)]
    command += ["--policy", str(policy)] if policy is not None else []
    command += ["doctor", *args]
    if as_uid is not None:
        command = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", "--", *command]
    if capsh:
        command = [*capsh_prefix(), "-c", " ".join(f"'{part}'" for part in command)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False, cwd="/")


@pytest.fixture
def user_home() -> Iterator[Path]:
    """A state folder the ordinary uid owns, under a temp folder it can enter."""
    with tempfile.TemporaryDirectory(prefix="mcp-doctor-") as folder:
        root = Path(folder)
        enterable_by_everyone(root)
        os.chown(root, USER_UID, USER_UID)
        yield root


def guarantees(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {line["name"]: line for line in document["guarantees"]}


def test_as_root_every_guarantee_holds_by_the_root_layers(tmp_path: Path) -> None:
    done = doctor(tmp_path / "state", "--format", "json", policy=REPO / "policy.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    lines = guarantees(document)
    assert document["ok"] is True and document["rootless"] is False
    assert set(lines) == {g.value for g in Guarantee} and all(line["holds"] for line in lines.values())
    assert lines["own_identity"]["layers"] == ["uid_drop"]
    assert lines["memory_total"]["layers"] == ["cgroup"] and lines["memory_total"]["required"] is False
    assert document["paths"] == []


def test_as_an_ordinary_user_the_run_gets_a_user_namespace_and_memory_total_is_explained(user_home: Path) -> None:
    text = doctor(user_home, policy=REPO / "policy.yaml", as_uid=USER_UID)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "mode: rootless: a user namespace per run" in text.stdout
    assert "ok       own_identity       required  by user_namespace" in text.stdout
    assert "ok       process_total      required  by rlimits + user_namespace" in text.stdout
    assert "missing  memory_total       optional  memory and pids are on cgroup v1 here" in text.stdout
    assert "fix: run the gateway as root, or boot with cgroup v2 only" in text.stdout
    assert text.stdout.rstrip().endswith("result: ok, every guarantee the policy requires holds here")

    as_json = json.loads(doctor(user_home, "--format", "json", policy=REPO / "policy.yaml", as_uid=USER_UID).stdout)
    lines = guarantees(as_json)
    assert as_json["rootless"] is True and as_json["user"] == {
        "uid": USER_UID, "root": False, "cap_sys_admin": False, "cap_setuid": False
    }  # fmt: skip
    assert not lines["memory_total"]["holds"] and "cgroup v1" in lines["memory_total"]["why"]
    assert all(line["holds"] for name, line in lines.items() if name != "memory_total")


def test_a_policy_requiring_what_the_user_cannot_have_fails_the_gate_with_the_cause(user_home: Path) -> None:
    strict = user_home / "strict.yaml"
    text = (REPO / "policy.yaml").read_text()
    text = text.replace("default: examples/sample_project", f"default: {REPO / 'examples' / 'sample_project'}")
    strict.write_text(text.replace("require: [own_identity,", "require: [memory_total, own_identity,"))
    strict.chmod(0o644)
    os.chown(strict, USER_UID, USER_UID)
    done = doctor(user_home, policy=strict, as_uid=USER_UID)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISSING  memory_total       required  memory and pids are on cgroup v1 here" in done.stdout
    assert "result: NOT OK (memory_total): write tools would be refused (-32006)" in done.stdout


def test_root_without_cap_sys_admin_drops_to_a_pool_uid_then_uses_a_user_namespace(tmp_path: Path) -> None:
    done = doctor(tmp_path / "state", "--format", "json", policy=REPO / "policy.yaml", capsh=True)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["user"]["root"] is True and document["user"]["cap_sys_admin"] is False
    assert document["mode"].startswith("root without CAP_SYS_ADMIN")
    assert guarantees(document)["own_identity"]["layers"] == ["uid_drop", "user_namespace"]
    assert document["ok"] is True


def test_without_a_policy_the_shipped_default_is_the_yardstick(tmp_path: Path) -> None:
    done = doctor(tmp_path / "nothing-here")
    assert done.returncode == 0, done.stderr
    assert "no policy at" in done.stderr and "judging this host against the shipped default" in done.stderr
    assert "policy: " in done.stdout and "(backend native;" in done.stdout


def test_an_unreachable_workspace_fails_the_gate_naming_the_path(user_home: Path) -> None:
    # The ordinary uid can run the interpreter, but not enter the workspace: preflight would refuse every call.
    closed = user_home / "closed"
    (closed / "ws").mkdir(parents=True)
    closed.chmod(0o700)  # root's, 0700: the user's run cannot search it
    policy = user_home / "p.yaml"
    policy.write_text(
        (REPO / "policy.yaml").read_text().replace("default: examples/sample_project", f"default: {closed / 'ws'}")
    )
    policy.chmod(0o644)
    done = doctor(user_home, policy=policy, as_uid=USER_UID)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot reach workspace 'default' {closed / 'ws'}" in done.stdout
    assert "result: NOT OK (1 unreachable path(s))" in done.stdout
