"""Which policy `serve` loads (decision 42), as an MCP client starts it: `--home` only, in the
agent's project. It never reads `./policy.yaml`, nor a policy another user or the agent could have
written; `init` writes `<home>/policy.yaml`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import REPO, SAMPLE_PROJECT

NOGROUP = 65534
# An agent's own policy in its project: every Bash command allowed, Claude Code's tool offered.
AGENTS_POLICY = "version: 1\npermission_prompt:\n  enabled: true\n  allow: [Bash]\n"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another group (needs root)")


def gw(home: Path, *args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`mcp-gateway --home HOME ARGS` in `cwd`, with no MCP_GATEWAY_* from the tests' environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "gateway", "--home", str(home), *args]
    return subprocess.run(
        command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def _listed_tools(home: Path, *, cwd: Path) -> tuple[dict[str, Any], str]:
    """`serve`'s answer to tools/list, and its stderr. Stdin stays open until the answer is read:
    closing it cancels whatever is still in flight, as a client that leaves does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "gateway", "--home", str(home), "serve"]
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as served:
        assert served.stdin is not None and served.stdout is not None
        served.stdin.write(f"{INITIALIZE}\n{LIST}\n")
        served.stdin.flush()
        answers = [json.loads(served.stdout.readline()) for _ in range(2)]
        _out, stderr = served.communicate(timeout=60)
    (listed,) = [answer for answer in answers if answer.get("id") == json.loads(LIST)["id"]]
    return listed, stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The agent's project, where Claude Code starts the gateway, holding a policy the agent wrote."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "policy.yaml").write_text(AGENTS_POLICY)
    return folder


INITIALIZE = json.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
)  # fmt: skip
LIST = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})


def test_serve_without_a_home_policy_refuses_to_start_and_never_reads_the_working_folders(
    tmp_path: Path, project: Path
) -> None:
    home = tmp_path / "state"
    assert gw(home, "--policy", str(REPO / "policy.yaml"), "init", cwd=tmp_path).returncode == 0
    assert not (home / "policy.yaml").exists(), "a named policy: init writes none"

    served = gw(home, "serve", cwd=project, stdin=INITIALIZE + "\n")

    assert served.returncode == 1 and served.stdout == "", "no answer to any request"
    (line,) = served.stderr.strip().splitlines()
    assert line.startswith(f"mcp-gateway: {home / 'policy.yaml'}: no policy found; looked at {home / 'policy.yaml'}")
    assert "--policy and MCP_GATEWAY_POLICY are not set" in line, "every place looked, named"
    assert "the working folder is never read" in line and f"--home {home} init" in line and "--policy FILE" in line


def test_serve_with_the_home_policy_init_wrote_ignores_the_agents_policy(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "state"
    made = gw(home, "init", cwd=project)
    assert made.returncode == 0, made.stderr
    assert f"wrote {home / 'policy.yaml'}" in made.stderr

    listed, stderr = _listed_tools(home, cwd=project)

    assert f"serving on stdio (policy {home / 'policy.yaml'})" in stderr
    names = [tool["name"] for tool in listed["result"]["tools"]]
    assert "run_pytest" in names and "check_permission" not in names, "the agent's permission_prompt is not read"


def test_init_writes_the_home_policy_once_with_an_absolute_workspace(tmp_path: Path) -> None:
    home, workspace = tmp_path / "state", tmp_path / "code"
    workspace.mkdir()
    made = gw(home, "init", "--workspace", "code", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    written = home / "policy.yaml"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    text = written.read_text()
    assert yaml.safe_load(text)["workspaces"] == {"default": str(workspace)}
    shipped = (REPO / "policy.yaml").read_text()
    assert text == shipped.replace("default: examples/sample_project", f"default: {workspace}"), "comments kept"
    assert gw(home, "policy", "check", cwd=tmp_path).returncode == 0

    again = gw(home, "init", "--workspace", str(SAMPLE_PROJECT), cwd=tmp_path)
    assert again.returncode == 0 and "kept" in again.stderr
    assert written.read_text() == text, "never overwritten"

    plain = tmp_path / "plain"
    assert gw(plain, "init", cwd=tmp_path).returncode == 0
    default = yaml.safe_load((plain / "policy.yaml").read_text())["workspaces"]["default"]
    assert default == str(SAMPLE_PROJECT), "the shipped workspace, made absolute"


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("--workspace", "missing"), "--workspace missing: not a folder", 2),  # a usage error
        (("--workspace", "."), "holds the state folder", 1),  # a refusal
    ],
)
def test_init_refuses_a_workspace_it_cannot_use(tmp_path: Path, args: tuple[str, ...], message: str, code: int) -> None:
    made = gw(tmp_path / "state", "init", *args, cwd=tmp_path)
    assert made.returncode == code and message in made.stderr
    assert not (tmp_path / "state" / "policy.yaml").exists()


def policy_at(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "policy.yaml"
    path.write_text((REPO / "policy.yaml").read_text().replace("examples/sample_project", str(SAMPLE_PROJECT)))
    path.chmod(0o644)
    return path


def refused_serve(tmp_path: Path, policy: Path | str) -> str:
    home = tmp_path / "state"
    assert gw(home, "init", cwd=tmp_path).returncode == 0
    served = gw(home, "--policy", str(policy), "serve", cwd=tmp_path, stdin=INITIALIZE + "\n")
    assert served.returncode == 1 and served.stdout == ""
    (line,) = served.stderr.strip().splitlines()
    return line


def test_a_world_writable_policy_is_refused(tmp_path: Path) -> None:
    policy = policy_at(tmp_path / "etc")
    policy.chmod(0o646)
    line = refused_serve(tmp_path, policy)
    assert f"{policy} is writable by every user" in line and f"chmod go-w {policy}" in line


def test_a_group_writable_folder_on_the_way_is_refused(tmp_path: Path) -> None:
    policy = policy_at(tmp_path / "shared" / "etc")
    os.chown(tmp_path / "shared", 0, NOGROUP)
    (tmp_path / "shared").chmod(0o775)
    line = refused_serve(tmp_path, policy)
    assert f"{tmp_path / 'shared'} is writable by group nogroup" in line and "chmod go-w" in line


def test_a_policy_of_another_user_is_refused(tmp_path: Path) -> None:
    policy = policy_at(tmp_path / "etc")
    os.chown(policy, NOGROUP, NOGROUP)
    line = refused_serve(tmp_path, policy)
    assert "belongs to nobody" in line and f"chown root {policy}" in line


def test_a_policy_inside_a_workspace_it_names_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    policy = policy_at(project)
    policy.write_text(policy.read_text().replace(str(SAMPLE_PROJECT), str(project)))
    line = refused_serve(tmp_path, policy)
    assert f"inside workspace 'default' ({project})" in line and "mcp-gateway init" in line


def test_a_relative_policy_path_is_refused_by_serve(tmp_path: Path, project: Path) -> None:
    home = tmp_path / "state"
    assert gw(home, "init", cwd=tmp_path).returncode == 0
    served = gw(home, "--policy", "policy.yaml", "serve", cwd=project, stdin=INITIALIZE + "\n")
    assert served.returncode == 1 and served.stdout == ""
    assert "serve takes an absolute policy path" in served.stderr and str(project) in served.stderr


def test_policy_check_fails_on_the_policy_in_effect_and_warns_on_a_named_draft(tmp_path: Path) -> None:
    home = tmp_path / "state"
    assert gw(home, "init", cwd=tmp_path).returncode == 0
    (home / "policy.yaml").chmod(0o666)
    in_effect = gw(home, "policy", "check", cwd=tmp_path)
    assert in_effect.returncode == 1 and "is writable by every user" in in_effect.stderr
    draft = gw(home, "policy", "check", str(home / "policy.yaml"), cwd=tmp_path)
    assert draft.returncode == 0 and "warning: serve would refuse this file" in draft.stderr
