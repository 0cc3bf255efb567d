"""gateway/upstream_policy.py: `upstreams` read strictly (every mistake with its line), programs pinned, env references kept as names."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from gateway.errors import ConfigError
from gateway.policy import Policy, parse_policy
from gateway.rbac import Permission
from gateway.tools.registry import TOOL_NAMES
from gateway.upstream_policy import EnvValue, UpstreamWorkspace, resolve_env, served_workspace

MARK = "# <-"
HEAD = """\
version: 1
workspaces:
  default: ws
  other: ws2
sandbox:
  allowed_paths: [bin]
  max_output_bytes: 100000
"""
GOOD = (
    HEAD
    + """\
tools:
  allowlist: [run_pytest, git__git_commit, git__git_status]
upstreams:
  git:
    command: [bin/server, --repository, "{workspace}"]
    workspace: write
    network: false
    env: {GIT_AUTHOR_NAME: agent, TOKEN: "${SOME_TOKEN}", COUNT: 3}
    trust: untrusted
    tools: [git_status, git_commit]
    permission: ORCHESTRATION_RUN
    timeout_s: 60
    memory_limit_mb: 256
    max_processes: 16
    relay_elicitation: true
    max_output_bytes: 5000
  plain:
    command: [bin/server]
"""
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("ws", "ws2", "bin"):
        (tmp_path / name).mkdir()
    server = tmp_path / "bin" / "server"
    server.write_text("#!/bin/sh\nexec cat\n")
    server.chmod(0o755)
    inside = tmp_path / "ws" / "server"
    inside.write_text("#!/bin/sh\nexec cat\n")
    inside.chmod(0o755)
    return tmp_path


def parse(text: str, folder: Path) -> Policy:
    return parse_policy(dedent(text), folder / "policy.yaml", TOOL_NAMES)


def marked_line(text: str) -> int:
    marked = [i for i, line in enumerate(dedent(text).splitlines(), start=1) if MARK in line]
    assert len(marked) == 1
    return marked[0]


def test_an_upstream_is_read_with_every_key(folder: Path) -> None:
    policy = parse(GOOD, folder)

    git = policy.upstreams["git"]
    assert git.command == ("bin/server", "--repository", "{workspace}")
    assert git.program.path == folder / "bin" / "server"
    assert git.program.interpreter is not None
    assert git.workspace is UpstreamWorkspace.WRITE
    assert git.network is False
    assert dict(git.env) == {
        "GIT_AUTHOR_NAME": EnvValue(literal="agent"),
        "TOKEN": EnvValue(reference="SOME_TOKEN"),
        "COUNT": EnvValue(literal="3"),
    }
    assert git.trust == "untrusted"
    assert git.tools == ("git_status", "git_commit")
    assert git.permission is Permission.ORCHESTRATION_RUN
    assert (git.timeout_s, git.memory_limit_mb, git.max_processes, git.max_output_bytes) == (60, 256, 16, 5000)
    assert git.relay_elicitation is True
    assert git.offered_name("git_commit") == "git__git_commit"
    assert "git__git_commit" in policy.allowlist


def test_an_upstream_has_defaults_for_every_optional_key(folder: Path) -> None:
    plain = parse(GOOD, folder).upstreams["plain"]
    assert plain.workspace is UpstreamWorkspace.READ_ONLY
    assert (plain.network, plain.trust, plain.tools, plain.relay_elicitation) == (False, "untrusted", (), False)
    assert plain.permission is Permission.ORCHESTRATION_RUN
    # The sandbox's limits where unset.
    assert (plain.timeout_s, plain.memory_limit_mb, plain.max_processes, plain.max_output_bytes) == (
        300, 1024, 64, 100000,
    )  # fmt: skip


def test_env_references_are_read_when_the_server_starts_and_name_only_the_variable(folder: Path) -> None:
    git = parse(GOOD, folder).upstreams["git"]
    assert resolve_env(git, {"SOME_TOKEN": "s3cret"}) == {"GIT_AUTHOR_NAME": "agent", "TOKEN": "s3cret", "COUNT": "3"}
    with pytest.raises(KeyError) as missing:
        resolve_env(git, {})
    assert missing.value.args == ("SOME_TOKEN",)


def test_the_served_workspace_is_the_policys_first(folder: Path) -> None:
    assert served_workspace(parse(GOOD, folder).workspaces) == "default"
    assert served_workspace({}) is None


def upstream(body: str, allowlist: str = "[run_pytest]") -> str:
    return (
        HEAD
        + f"tools:\n  allowlist: {allowlist}\nupstreams:\n"
        + "".join(f"  {line}\n" for line in dedent(body).splitlines())
    )


BAD = {
    "a name with __": (
        upstream("""
        my__git:
          command: [bin/server]  # <-
        """),
        "never '__'",
    ),
    "a name ending in _": (
        upstream("""
        git_:
          command: [bin/server]  # <-
        """),
        "must be a letter",
    ),
    "the name of a built-in tool": (
        upstream("""
        run_pytest:
          command: [bin/server]  # <-
        """),
        "has the name of a tool",
    ),
    "no command": (
        upstream("""
        git:
          trust: trusted  # <-
        """),
        "needs 'command'",
    ),
    "an unknown key": (
        upstream("""
        git:
          command: [bin/server]
          shell: true  # <-
        """),
        "unknown key 'shell'",
    ),
    "another placeholder": (
        upstream("""
        git:
          command: [bin/server, "{path}"]  # <-
        """),
        "only {workspace}",
    ),
    "a placeholder inside an element": (
        upstream("""
        git:
          command: [bin/server, "--repo={workspace}"]  # <-
        """),
        "must be a whole element",
    ),
    "a program not found": (
        upstream("""
        git:
          command: [no-such-program-here]  # <-
        """),
        "not found",
    ),
    "a program inside the workspace": (
        upstream("""
        git:
          command: [ws/server]  # <-
        """),
        "inside workspace",
    ),
    "a workspace mode an upstream has not": (
        upstream("""
        git:
          command: [bin/server]
          workspace: review  # <-
        """),
        "must be one of read_only, write",
    ),
    "an unknown trust": (
        upstream("""
        git:
          command: [bin/server]
          trust: somewhat  # <-
        """),
        "must be one of trusted, untrusted",
    ),
    "a limit over the sandbox's": (
        upstream("""
        git:
          command: [bin/server]
          timeout_s: 301  # <-
        """),
        "over sandbox.timeout_s",
    ),
    "an output cap over the sandbox's": (
        upstream("""
        git:
          command: [bin/server]
          max_output_bytes: 100001  # <-
        """),
        "over sandbox.max_output_bytes",
    ),
    "a partial env reference": (
        upstream("""
        git:
          command: [bin/server]
          env: {TOKEN: "Bearer ${T}"}  # <-
        """),
        "must be the whole value",
    ),
    "the gateway's token by reference": (
        upstream("""
        git:
          command: [bin/server]
          env: {T: "${MCP_GATEWAY_TOKEN}"}  # <-
        """),
        "never reach an upstream",
    ),
    "the gateway's variable by name": (
        upstream("""
        git:
          command: [bin/server]
          env: {MCP_GATEWAY_TOKEN: x}  # <-
        """),
        "never reach an upstream",
    ),
    "a bad variable name": (
        upstream("""
        git:
          command: [bin/server]
          env: {"A-B": x}  # <-
        """),
        "not a variable name",
    ),
    "an env value that is a list": (
        upstream("""
        git:
          command: [bin/server]
          env: {A: [x]}  # <-
        """),
        "must be a single value",
    ),
    "a tool name that is no name": (
        upstream("""
        git:
          command: [bin/server]
          tools: ["a b"]  # <-
        """),
        "is not a tool name",
    ),
    "an allowlisted upstream tool the upstream does not offer": (
        upstream(
            """
            git:
              command: [bin/server]
              tools: [git_status]
            """,
            allowlist="[git__git_commit]  # <-",
        ),
        "unknown tool 'git__git_commit' in tools.allowlist",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_each_mistake_is_refused_with_its_line(case: str, folder: Path) -> None:
    text, expected = BAD[case]
    with pytest.raises(ConfigError) as refused:
        parse(text, folder)
    assert expected in str(refused.value)
    assert refused.value.where == f"{folder / 'policy.yaml'}:{marked_line(text)}"


def test_an_offered_name_that_is_a_declared_tools_is_refused(folder: Path) -> None:
    text = HEAD + dedent("""\
        tools:
          declared:
            git__status:
              description: d
              command: [bin/server]
        upstreams:
          git:
            command: [bin/server]
            tools: [status]
        """)
    with pytest.raises(ConfigError, match="'git__status' is already a tool's name"):
        parse(text, folder)


def test_mistakes_in_two_upstreams_sections_are_both_reported(folder: Path) -> None:
    text = upstream("""
    git:
      command: [bin/server]
      trust: somewhat
    """).replace("allowed_paths: [bin]", "allowed_paths: [bin]\n  timeout_s: -1")
    with pytest.raises(ConfigError) as refused:
        parse(text, folder)
    message = str(refused.value)
    assert "sandbox.timeout_s" in message
    assert "upstreams not read" in message
