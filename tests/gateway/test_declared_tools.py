"""gateway/tools/declared.py: a declared tool's schema, its argv for hostile values, its fingerprint, its refusals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from gateway.consent.stage import DECLARATION_META_KEY, consent_profile, tool_fingerprint
from gateway.declarations import WorkspaceMode
from gateway.errors import GatewayError, InvalidParamsError, PolicyBlockedError, Reason, SandboxViolationError
from gateway.policy import Policy, parse_policy
from gateway.policy_warnings import risky_settings
from gateway.preflight import check_run_paths, unreachable_run_paths
from gateway.scope import Caller, check_arguments, check_call
from gateway.tools.declared import after_run, change_rules, declared_tool, read_tail, render_argv
from gateway.tools.registry import TOOL_NAMES, TOOLS, catalogue
from sandbox.reachable import Access
from tests.harness import reachable_by_everyone

POLICY = """\
version: 1
workspaces:
  default: ws
sandbox:
  allowed_paths: [bin]
  timeout_s: 300
tools:
  allowlist: [lint, make]
  declared:
    lint:
      description: Lint the workspace
      command: [bin/tool, check, "{fix}", --, "{path}"]
      arguments:
        path: {type: path, default: "."}
        select: {type: enum, values: [E, F], flag: --select}
        fix: {type: boolean, flag: --fix}
        jobs: {type: integer, min: 1, max: 8, flag: -j}
        name: {type: string, pattern: "[A-Za-z0-9_.= -]+", max_length: 20, flag: --name}
        word: {type: string, pattern: ".+", flag: --word}
      annotations: {destructiveHint: false, idempotentHint: true, openWorldHint: false}
      timeout_s: 60
    make:
      description: Run a make target
      command: [bin/tool, -C, "{workspace}", "{target}"]
      arguments:
        target: {type: enum, values: [test, lint]}
      workspace: review
"""
CALLER = Caller(("default",), None, False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "ws" / "src").mkdir(parents=True)
    (tmp_path / "ws" / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "ws" / "escape").symlink_to(tmp_path / "outside")
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "tool"
    tool.write_text('#!/bin/sh\necho tool "$@"\n')
    tool.chmod(0o755)
    (tmp_path / "policy.yaml").write_text(POLICY)
    return tmp_path


def load(folder: Path, text: str = POLICY) -> Policy:
    return parse_policy(dedent(text), folder / "policy.yaml", TOOL_NAMES)


def test_the_catalogue_is_the_built_ins_and_the_declared_tools(folder: Path) -> None:
    tools = catalogue(load(folder))
    assert list(tools) == [*TOOLS, "lint", "make"]
    assert tools["run_pytest"] is TOOLS["run_pytest"]
    assert tools["lint"].sandboxed
    assert tools["lint"].path_arguments == ("path",)
    assert tools["lint"].max_timeout_s == 60


def test_the_input_schema_comes_from_the_declaration(folder: Path) -> None:
    schema = declared_tool(load(folder).declared["lint"]).input_schema
    assert schema["required"] == []
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["path"]["default"] == "."
    assert props["select"] == {"type": "string", "enum": ["E", "F"]}
    assert props["fix"] == {"type": "boolean"}
    assert props["jobs"] == {"type": "integer", "minimum": 1, "maximum": 8}
    assert props["name"]["pattern"] == "^(?:[A-Za-z0-9_.= -]+)$"
    assert props["name"]["maxLength"] == 20
    assert props["timeout_s"] == {"type": "integer", "minimum": 1, "maximum": 60}
    assert "workspace" in props
    make = declared_tool(load(folder).declared["make"])
    assert make.input_schema["required"] == ["target"]
    assert make.annotations == {"title": "Run a make target", "readOnlyHint": False}
    assert make.title == "Run a make target"


def argv(folder: Path, arguments: dict[str, Any], tool: str = "lint") -> list[str]:
    return render_argv(load(folder).declared[tool], arguments, folder / "ws")


def test_each_placeholder_is_one_whole_element(folder: Path) -> None:
    program = str(folder / "bin" / "tool")
    assert argv(folder, {}) == [program, "check", "--", "./."]
    assert argv(folder, {"path": "src", "fix": True, "select": "E", "jobs": 3, "name": "a b=c"}) == [
        program, "check", "--fix", "--select", "E", "-j", "3", "--name", "a b=c", "--", "./src",
    ]  # fmt: skip
    assert argv(folder, {"fix": False}) == [program, "check", "--", "./."]
    assert argv(folder, {"jobs": 3.0}) == [program, "check", "-j", "3", "--", "./."]  # stage 5 lets 3.0 through
    assert argv(folder, {"target": "test"}, "make") == [program, "-C", str(folder / "ws"), "test"]


def test_braces_that_name_no_argument_are_literals(folder: Path) -> None:
    text = POLICY.replace(
        'command: [bin/tool, -C, "{workspace}", "{target}"]', 'command: [bin/tool, "{}", "{a b}", "{target}"]'
    )
    assert text != POLICY
    (folder / "policy.yaml").write_text(text)
    make = load(folder, text).declared["make"]
    assert render_argv(make, {"target": "lint"}, folder / "ws")[1:] == ["{}", "{a b}", "lint"]


HOSTILE_STRINGS = ["-rf", "@file", "--x=y", "-", "@", "a\nb", "a\x00b", "a\rb", "\u2028", "a\x7fb"]


@pytest.mark.parametrize("value", HOSTILE_STRINGS)
@pytest.mark.parametrize("argument", ["word", "name", "path"])
def test_a_value_that_could_read_as_an_option_is_refused_at_every_layer(
    folder: Path, argument: str, value: str
) -> None:
    spec = declared_tool(load(folder).declared["lint"])
    with pytest.raises(InvalidParamsError):
        check_arguments(spec, {argument: value})  # stage 5
    with pytest.raises(InvalidParamsError) as caught:
        argv(folder, {argument: value})  # and the renderer, whatever let it through
    assert caught.value.reason is Reason.INVALID_ARGUMENTS


@pytest.mark.parametrize("value", ["ünïcode", "ok value", "a=b", "x-y", "x@y"])
def test_a_plain_value_passes_whole_after_its_flag(folder: Path, value: str) -> None:
    assert argv(folder, {"word": value})[2:4] == ["--word", value]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("../outside", Reason.PATH_OUTSIDE_WORKSPACE),
        ("src/../../outside", Reason.PATH_OUTSIDE_WORKSPACE),
        ("/etc/passwd", Reason.PATH_OUTSIDE_WORKSPACE),
        ("escape", Reason.PATH_OUTSIDE_WORKSPACE),  # a symlink out of the workspace
        ("escape/x", Reason.PATH_OUTSIDE_WORKSPACE),
        ("-rf", Reason.PATH_LOOKS_LIKE_OPTION),
        ("@opts", Reason.PATH_LOOKS_LIKE_OPTION),
        ("a\nb", Reason.PATH_INVALID),
        ("a\x00b", Reason.PATH_INVALID),
    ],
)
def test_a_path_outside_the_workspace_is_refused_at_stage_4(folder: Path, value: str, reason: Reason) -> None:
    policy = load(folder)
    spec = catalogue(policy)["lint"]
    with pytest.raises(PolicyBlockedError) as caught:
        check_call(policy, spec, {"path": value}, CALLER)
    assert caught.value.reason is reason


def test_a_path_inside_passes_and_is_given_after_dot_slash(folder: Path) -> None:
    policy = load(folder)
    scope = check_call(policy, catalogue(policy)["lint"], {"path": "src/a.py"}, CALLER)
    assert scope.timeout_s == 60  # the tool's own limit, not the sandbox's 300
    assert argv(folder, {"path": "src/a.py"})[-1] == "./src/a.py"


def test_a_timeout_over_the_tools_own_is_refused(folder: Path) -> None:
    policy = load(folder)
    with pytest.raises(PolicyBlockedError) as caught:
        check_call(policy, catalogue(policy)["lint"], {"timeout_s": 61}, CALLER)
    assert caught.value.reason is Reason.TIMEOUT_OVER_POLICY
    assert "at most 60" in caught.value.public_message()


def test_a_replaced_program_is_refused_at_stage_4(folder: Path) -> None:
    policy = load(folder)
    spec = catalogue(policy)["lint"]
    check_call(policy, spec, {}, CALLER)
    tool = folder / "bin" / "tool"
    replacement = folder / "bin" / "new"
    replacement.write_text(tool.read_text())
    replacement.chmod(0o755)
    replacement.replace(tool)
    with pytest.raises(PolicyBlockedError) as caught:
        check_call(policy, spec, {}, CALLER)
    assert caught.value.reason is Reason.PROGRAM_CHANGED
    assert str(tool) in caught.value.public_message()
    assert "restart the gateway" in caught.value.public_message()


def fingerprint(folder: Path, text: str) -> str:
    (folder / "policy.yaml").write_text(text)
    return consent_profile(catalogue(load(folder, text))["lint"]).fingerprint


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('check, "{fix}", --', 'check, --unsafe-fixes, "{fix}", --'),  # the template
        ("max: 8, flag: -j", "max: 9, flag: -j"),  # an argument
        ("timeout_s: 60", "timeout_s: 61"),  # a limit
        ("timeout_s: 60", "timeout_s: 60\n      memory_limit_mb: 512"),
        ("Lint the workspace\n", "Lint the workspace\n      workspace: write\n"),  # the workspace mode
        ("description: Lint the workspace", "description: Lint it"),
    ],
)
def test_the_fingerprint_covers_the_whole_declaration(folder: Path, old: str, new: str) -> None:
    assert old in POLICY
    assert fingerprint(folder, POLICY) != fingerprint(folder, POLICY.replace(old, new, 1))


def test_the_fingerprint_covers_the_programs_content(folder: Path) -> None:
    before = fingerprint(folder, POLICY)
    assert fingerprint(folder, POLICY) == before  # loaded again, unchanged: the same
    with (folder / "bin" / "tool").open("a") as handle:
        handle.write("# another version\n")
    assert fingerprint(folder, POLICY) != before


def test_a_built_in_tools_fingerprint_is_unchanged_by_declarations() -> None:
    spec = TOOLS["run_pytest"]
    assert DECLARATION_META_KEY not in spec.meta
    assert consent_profile(spec).fingerprint == tool_fingerprint(spec.name, spec.input_schema, spec.annotations)


def test_risk_follows_the_annotations(folder: Path) -> None:
    tools = catalogue(load(folder))
    assert consent_profile(tools["lint"]).risk == "medium"  # idempotent, with side effects
    assert consent_profile(tools["make"]).risk == "high"  # no hints: destructive by MCP's defaults
    assert consent_profile(tools["make"]).destructive


def test_review_and_write_runs_get_the_policys_change_rules(folder: Path) -> None:
    policy = load(folder)
    declared = policy.declared
    sandbox = replace(policy.sandbox, protected_paths=(".envrc",), max_change_files=7, max_change_bytes=99)
    assert change_rules(declared["lint"], sandbox) is None  # read_only: no copy, no change set
    rules = change_rules(declared["make"], sandbox)
    assert rules is not None
    assert (rules.protected, rules.max_files, rules.max_bytes) == ((".envrc",), 7, 99)
    assert after_run(declared["lint"]) == ""
    assert "shown to a person, allow once or deny once" in after_run(declared["make"])
    assert "applied beneath the workspace at once" in after_run(
        replace(declared["make"], workspace=WorkspaceMode.WRITE)
    )


def test_the_preview_shows_the_argv_or_the_refusal(folder: Path) -> None:
    spec = catalogue(load(folder))["lint"]
    assert spec.preview is not None
    assert spec.preview({"path": "src", "fix": True}, folder / "ws").endswith("check --fix -- ./src")
    assert spec.preview({"word": "-rf"}, folder / "ws").startswith(
        "would refuse: Invalid params: word: must not start with"
    )


def test_the_output_tail_is_bounded_and_escaped(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    out.write_bytes(b"first\n\x1b[31mred\x00\nlast\xff\n")
    assert read_tail(out, 100) == "first\n\\u001b[31mred\\u0000\nlast\ufffd"
    out.write_bytes(b"x" * 200_000 + b"\nend\n")
    tail = read_tail(out, 50)
    assert tail.startswith("…")
    assert tail.endswith("\nend")
    assert len(tail) <= 51
    assert read_tail(tmp_path / "missing.txt", 10) == ""


def test_a_gateway_error_from_rendering_is_a_gateway_error(folder: Path) -> None:
    with pytest.raises(GatewayError):
        argv(folder, {"jobs": 99})


def test_a_program_the_runs_uid_cannot_execute_is_refused_at_preflight(folder: Path) -> None:
    policy = load(folder)
    spec = catalogue(policy)["lint"]
    assert spec.programs == (folder / "bin" / "tool", Path("/bin/sh").resolve())
    pool_uid = Access(61000, 61000)
    reachable_by_everyone(folder)  # pytest's tmp_path is 0700
    check_run_paths(("default", folder / "ws"), (), pool_uid, spec.programs)  # 0755: reachable
    (folder / "bin" / "tool").chmod(0o700)
    with pytest.raises(SandboxViolationError) as caught:
        check_run_paths(("default", folder / "ws"), (), pool_uid, spec.programs)
    assert caught.value.reason is Reason.RUN_PATH_UNREACHABLE
    assert f"the declared program {folder / 'bin' / 'tool'}" in caught.value.public_message()
    assert [f.what.label for f in unreachable_run_paths(policy, pool_uid)] == ["the declared program"]


def test_policy_check_warns_about_a_program_others_could_swap(folder: Path) -> None:
    def warnings() -> list[str]:
        return [w.message for w in risky_settings(load(folder), None) if "tools.declared" in w.message]

    assert warnings() == [
        "tools.declared has workspace: review or write: such calls are refused (-32006) in this version"
    ]
    (folder / "bin").chmod(0o777)
    assert warnings()[0] == (
        f"tools.declared.lint: {folder / 'bin'} is writable by others: whoever can write it can replace"
        f" {folder / 'bin' / 'tool'} (a replaced program is refused, but not one swapped between the check and exec)"
    )
    (folder / "bin").chmod(0o1777)  # sticky, as /tmp: others cannot rename the owner's file
    assert len(warnings()) == 1
    (folder / "bin" / "tool").chmod(0o757)
    assert f"{folder / 'bin' / 'tool'} is writable by others" in warnings()[0]
