"""gateway/declarations.py and gateway/programs.py: `tools.declared` read strictly (every mistake with its line), programs pinned."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from textwrap import dedent

import pytest

from gateway.declarations import ArgumentType, WorkspaceMode
from gateway.errors import ConfigError
from gateway.policy import DEFAULT_PROTECTED_PATHS, Policy, parse_policy
from gateway.programs import ProgramError, find_program, pin_program, program_change
from gateway.rbac import Permission
from gateway.tools.registry import TOOL_NAMES

MARK = "# <-"
HEAD = """\
version: 1
workspaces:
  default: ws
sandbox:
  allowed_paths: [bin]
"""
GOOD = (
    HEAD
    + """\
tools:
  allowlist: [run_pytest, lint]
  declared:
    lint:
      description: Lint the workspace
      command: [bin/tool, check, --, "{path}"]
      arguments:
        path: {type: path, default: "."}
        select: {type: enum, values: [E, F], flag: --select}
        fix: {type: boolean, flag: --fix}
        jobs: {type: integer, min: 1, max: 8, flag: -j}
        name: {type: string, pattern: "[a-z]+", max_length: 10, flag: --name}
      permission: ORCHESTRATION_RUN
      annotations: {destructiveHint: false, idempotentHint: true, openWorldHint: false}
      timeout_s: 60
      max_processes: 8
"""
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "tool"
    tool.write_text('#!/bin/sh\necho tool "$@"\n')
    tool.chmod(0o755)
    return tmp_path


def parse(text: str, folder: Path) -> Policy:
    return parse_policy(dedent(text), folder / "policy.yaml", TOOL_NAMES)


def marked_line(text: str) -> int:
    marked = [i for i, line in enumerate(dedent(text).splitlines(), start=1) if MARK in line]
    assert len(marked) == 1
    return marked[0]


def test_a_declaration_is_read_with_every_key(folder: Path) -> None:
    policy = parse(GOOD, folder)

    assert policy.allowlist == ("run_pytest", "lint")
    lint = policy.declared["lint"]
    assert lint.command == ("bin/tool", "check", "--", "{path}")
    assert [(a.name, a.type, a.flag, a.default, a.required) for a in lint.arguments] == [
        ("path", ArgumentType.PATH, None, ".", False),
        ("select", ArgumentType.ENUM, "--select", None, False),
        ("fix", ArgumentType.BOOLEAN, "--fix", None, False),
        ("jobs", ArgumentType.INTEGER, "-j", None, False),
        ("name", ArgumentType.STRING, "--name", None, False),
    ]
    assert lint.argument("jobs") is not None
    assert (lint.timeout_s, lint.memory_limit_mb, lint.max_processes) == (60, 1024, 8)  # the sandbox's where unset
    assert lint.workspace is WorkspaceMode.READ_ONLY
    assert lint.permission is Permission.ORCHESTRATION_RUN
    assert dict(lint.annotations) == {
        "title": "Lint the workspace",
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    program = lint.program
    assert program.path == folder / "bin" / "tool"
    assert program.interpreter is not None
    assert program.interpreter.path == Path("/bin/sh")
    assert program.identity()["sha256"] == program.sha256


def test_the_sandbox_change_caps_and_protected_paths_have_their_defaults(folder: Path) -> None:
    sandbox = parse(HEAD, folder).sandbox
    assert sandbox.protected_paths == DEFAULT_PROTECTED_PATHS
    assert sandbox.protected_paths == (
        ".git/hooks",
        ".git/config",
        ".mcp.json",
        ".vscode",
        ".claude",
        ".cursor",
        ".envrc",
    )
    assert (sandbox.max_change_files, sandbox.max_change_bytes) == (1000, 16 * 1024 * 1024)
    policy = parse(
        HEAD + "  protected_paths: [.git, ./secrets/]\n  max_change_files: 10\n  max_change_bytes: 4096\n", folder
    )
    assert policy.sandbox.protected_paths == (".git", "secrets")
    assert (policy.sandbox.max_change_files, policy.sandbox.max_change_bytes) == (10, 4096)


def declared(body: str) -> str:
    return HEAD + "tools:\n  declared:\n" + "".join(f"    {line}\n" for line in dedent(body).splitlines())


BAD = {
    "unknown type": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{x}"]
          arguments:
            x: {type: float}  # <-
        """),
        "must be one of path, string, integer, boolean, enum",
    ),
    "placeholder without argument": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{nothing}"]  # <-
        """),
        "placeholder {nothing} has no argument",
    ),
    "argument never used": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          arguments:
            x: {type: path}  # <-
        """),
        "tools.declared.t.arguments.x is never used",
    ),
    "program not found": (
        declared("""
        t:
          description: d
          command: [no-such-program-3c1f]  # <-
        """),
        "program 'no-such-program-3c1f' not found on the gateway's PATH",
    ),
    "a built-in's name": (
        declared("""
        run_pytest:
          description: d  # <-
          command: [bin/tool]
        """),
        "has the name of a built-in tool",
    ),
    "check_permission's name": (
        declared("""
        check_permission:
          description: d  # <-
          command: [bin/tool]
        """),
        "has the name of a built-in tool",
    ),
    "a limit over the sandbox's": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          timeout_s: 301  # <-
        """),
        "tools.declared.t.timeout_s is 301, over sandbox.timeout_s (300)",
    ),
    "memory over the sandbox's": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          memory_limit_mb: 4096  # <-
        """),
        "over sandbox.memory_limit_mb (1024)",
    ),
    "an unknown key": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          shell: true  # <-
        """),
        "unknown key 'shell' in tools.declared.t",
    ),
    "a key of another type": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{n}"]
          arguments:
            n: {type: integer, pattern: "[0-9]+"}  # <-
        """),
        "unknown key 'pattern' in tools.declared.t.arguments.n",
    ),
    "a placeholder inside an element": (
        declared("""
        t:
          description: d
          command: [bin/tool, "--out={path}"]  # <-
          arguments:
            path: {type: path}
        """),
        "a placeholder must be a whole element",
    ),
    "a placeholder as the program": (
        declared("""
        t:
          description: d
          command: ["{path}"]  # <-
          arguments:
            path: {type: path}
        """),
        "must start with the program",
    ),
    "a placeholder twice": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{path}", "{path}"]  # <-
          arguments:
            path: {type: path}
        """),
        "uses {path} twice",
    ),
    "a boolean without a flag": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{b}"]
          arguments:
            b: {type: boolean}  # <-
        """),
        "a boolean needs a flag",
    ),
    "a string without a pattern": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{s}"]
          arguments:
            s: {type: string}  # <-
        """),
        "a string needs a pattern",
    ),
    "a bad regex": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{s}"]
          arguments:
            s:
              type: string
              pattern: "[a-"  # <-
        """),
        "is not a valid regex",
    ),
    "a negative minimum": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{n}"]
          arguments:
            n:
              type: integer
              min: -5  # <-
        """),
        "must be at least 0",
    ),
    "an option among enum values": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{e}"]
          arguments:
            e:
              type: enum
              values: [ok, -rf]  # <-
        """),
        "'-rf' would read as an option",
    ),
    "a flag that is no option": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          arguments:
            e:
              type: path
              flag: --out=x  # <-
        """),
        "flag must be an option",
    ),
    "a default outside its argument": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{p}"]
          arguments:
            p:
              type: path
              default: /etc  # <-
        """),
        "must be relative to the workspace",
    ),
    "a default that is an option": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{s}"]
          arguments:
            s:
              type: string
              pattern: ".*"
              default: --all  # <-
        """),
        "must not start with '-' or '@'",
    ),
    "a reserved argument name": (
        declared("""
        t:
          description: d
          command: [bin/tool, "{workspace}"]
          arguments:
            workspace: {type: path}  # <-
        """),
        "argument name 'workspace' in tools.declared.t.arguments is reserved",
    ),
    "read-only hint on a writing tool": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          workspace: review
          annotations: {readOnlyHint: true}  # <-
        """),
        "it is not read-only",
    ),
    "an unknown workspace mode": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          workspace: writable  # <-
        """),
        "must be one of read_only, review, write",
    ),
    "an unknown permission": (
        declared("""
        t:
          description: d
          command: [bin/tool]
          permission: ROOT  # <-
        """),
        "permission must be one of",
    ),
    "no description": (
        declared("""
        t:
          command: [bin/tool]  # <-
        """),
        "tools.declared.t needs 'description'",
    ),
    "a program in the workspace": (
        declared("""
        t:
          description: d
          command: [ws/tool]  # <-
        """),
        "is inside workspace",
    ),
    "a program the run cannot read": (
        declared("""
        t:
          description: d
          command: [hidden/tool]  # <-
        """),
        "is outside what a run may read: add its folder to sandbox.allowed_paths",
    ),
    "a script without an absolute interpreter": (
        declared("""
        t:
          description: d
          command: [bin/relative]  # <-
        """),
        "names no absolute interpreter",
    ),
    "a file that is not executable": (
        declared("""
        t:
          description: d
          command: [bin/plain]  # <-
        """),
        "is not executable",
    ),
    "a name that is no name": (
        declared("""
        "t t":
          description: d  # <-
          command: [bin/tool]
        """),
        "declared tool name 't t' must be a letter",
    ),
    "an allowlisted name nobody declared": (
        HEAD + "tools:\n  allowlist: [run_pytest, lint]  # <-\n",
        "unknown tool 'lint' in tools.allowlist",
    ),
    "a protected path outside the workspace": (
        HEAD + "  protected_paths: [../x]  # <-\n",
        "must be relative to the workspace, without '..'",
    ),
}


@pytest.mark.parametrize(("text", "message"), list(BAD.values()), ids=list(BAD))
def test_every_mistake_is_an_error_at_its_line(text: str, message: str, folder: Path) -> None:
    for name in ("tool", "relative", "plain"):
        for where in ("ws", "hidden", "bin"):
            (folder / where).mkdir(exist_ok=True)
            script = folder / where / name
            script.write_text("#!sh\n" if name == "relative" else "#!/bin/sh\n")
            script.chmod(0o644 if name == "plain" else 0o755)

    with pytest.raises(ConfigError) as caught:
        parse(text, folder)

    assert message in caught.value.bare_message
    assert caught.value.where == f"{folder / 'policy.yaml'}:{marked_line(text)}"


def test_a_bare_name_is_found_on_the_gateways_path_and_pinned(folder: Path) -> None:
    policy = parse(declared('t:\n  description: d\n  command: [sh, -c, "exit 0"]\n'), folder)
    program = policy.declared["t"].program
    assert program.path == Path(shutil.which("sh") or "")
    assert program.real == program.path.resolve()


def test_find_program_skips_relative_path_entries(tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    with pytest.raises(ProgramError, match="not found"):
        find_program("tool", tmp_path, f".{os.pathsep}{os.pathsep}relative")
    assert find_program("tool", Path("/"), str(tmp_path)) == tmp_path / "tool"
    assert find_program("./tool", tmp_path, "") == tmp_path / "tool"
    assert find_program("sub/../tool", tmp_path, "") == tmp_path / "tool"


def test_a_program_replaced_edited_or_relinked_is_no_longer_the_pinned_one(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text("#!/bin/sh\nexit 0\n")
    real.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    program = pin_program(link)
    assert program_change(program) is None

    other = tmp_path / "other"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    link.unlink()
    link.symlink_to(other)
    assert "now leads to" in (program_change(program) or "")

    link.unlink()
    link.symlink_to(real)
    assert program_change(program) is None
    with real.open("a") as handle:
        handle.write("# appended\n")
    assert "replaced or changed" in (program_change(program) or "")

    program = pin_program(real)
    replacement = tmp_path / "replacement"
    replacement.write_text(real.read_text())
    replacement.chmod(0o755)
    replacement.replace(real)  # same path, same content, another inode
    assert "replaced or changed" in (program_change(program) or "")

    real.unlink()
    assert "cannot be reached" in (program_change(program) or "")


def test_a_scripts_interpreter_is_pinned_too(tmp_path: Path) -> None:
    interpreter = tmp_path / "interp"
    shutil.copy("/bin/true", interpreter)
    script = tmp_path / "script"
    script.write_text(f"#!{interpreter} -x\n")
    script.chmod(0o755)
    program = pin_program(script)
    assert program.interpreter is not None
    assert program.interpreter.path == interpreter
    interpreter.chmod(0o700)  # ctime moves
    assert program_change(program) is not None


def test_an_interpreter_that_is_a_script_is_refused(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.write_text("#!/bin/sh\n")
    inner.chmod(0o755)
    outer = tmp_path / "outer"
    outer.write_text(f"#!{inner}\n")
    outer.chmod(0o755)
    with pytest.raises(ProgramError, match="is itself a '#!' script"):
        pin_program(outer)
