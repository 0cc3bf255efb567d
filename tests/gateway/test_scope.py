"""gateway/scope.py: stage 4 (check_call: allowlist, workspace, paths, timeout) and stage 5 (the schema)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import InvalidParamsError, PolicyBlockedError
from gateway.policy import Policy, parse_policy
from gateway.scope import (
    Caller,
    CallScope,
    check_arguments,
    check_call,
    check_pins_intact,
    matches_pattern,
    visible_workspaces,
)
from gateway.tools.registry import TOOL_NAMES, TOOLS
from gateway.tools.schemas import PATTERN_HINTS

RUN_PYTEST = TOOLS["run_pytest"]
LIST_ARTIFACTS = TOOLS["list_artifacts"]
GET_EVIDENCE = TOOLS["get_evidence"]
GET_CONTENT = TOOLS["get_artifact_content"]

ALICE = Caller(workspaces=("a", "b"), token_workspace=None, is_admin=False)
ADMIN = Caller(workspaces=(), token_workspace=None, is_admin=True)


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    for name in ("a", "b", "c"):
        (tmp_path / name / "tests").mkdir(parents=True)
    (tmp_path / "policy.yaml").write_text(
        "version: 1\n"
        "workspaces: {a: a, b: b, c: c}\n"
        "tools:\n  allowlist: [run_pytest, list_artifacts, get_evidence, get_artifact_content]\n"
        "sandbox:\n  timeout_s: 300\n",
        encoding="utf-8",
    )
    return parse_policy((tmp_path / "policy.yaml").read_text(), tmp_path / "policy.yaml", TOOL_NAMES)


def blocked(policy: Policy, arguments: dict[str, Any], caller: Caller = ALICE, spec: Any = RUN_PYTEST) -> str:
    with pytest.raises(PolicyBlockedError) as caught:
        check_call(policy, spec, arguments, caller)
    assert caught.value.code == -32004
    return caught.value.reason


# --- allowlist -----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", list(TOOLS.values()), ids=list(TOOLS))
def test_empty_allowlist_blocks_every_tool(policy: Policy, spec: Any) -> None:
    empty = dataclasses.replace(policy, allowlist=())

    assert blocked(empty, {"test_path": "tests"}, spec=spec) == "allowlist_empty"


def test_tool_not_in_the_allowlist_is_blocked(policy: Policy) -> None:
    reads_only = dataclasses.replace(policy, allowlist=("list_artifacts", "get_evidence"))

    assert blocked(reads_only, {"test_path": "tests"}) == "tool_not_allowlisted"
    check_call(reads_only, LIST_ARTIFACTS, {}, ALICE)


# --- timeout -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "effective"),
    [(None, 300), (1, 1), (299, 299), (300, 300), (True, 300), ("10", 300), (0, 300)],
)
def test_timeout_within_the_policy(policy: Policy, requested: object, effective: int) -> None:
    arguments: dict[str, Any] = {"test_path": "tests"}
    if requested is not None:
        arguments["timeout_s"] = requested

    assert check_call(policy, RUN_PYTEST, arguments, ALICE).timeout_s == effective


@pytest.mark.parametrize("requested", [301, 86400, 10**9])
def test_timeout_over_the_policy_is_blocked(policy: Policy, requested: int) -> None:
    assert blocked(policy, {"test_path": "tests", "timeout_s": requested}) == "timeout_over_policy"


# --- workspace selection -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "requested", "chosen"),
    [
        pytest.param(ALICE, None, "a", id="user-default-is-first"),
        pytest.param(ALICE, "b", "b", id="user-picks-own"),
        pytest.param(Caller(("a", "b"), "b", False), None, "b", id="token-workspace"),
        pytest.param(Caller(("a", "b"), "b", False), "b", "b", id="token-workspace-named"),
        pytest.param(ADMIN, "c", "c", id="admin-any-policy-workspace"),
        pytest.param(Caller(("a",), None, True), None, "a", id="admin-default"),
        pytest.param(Caller((), "c", True), None, "c", id="admin-token-workspace"),
    ],
)
def test_workspace_is_chosen(policy: Policy, caller: Caller, requested: str | None, chosen: str) -> None:
    arguments: dict[str, Any] = {"test_path": "tests"}
    if requested is not None:
        arguments["workspace"] = requested

    scope = check_call(policy, RUN_PYTEST, arguments, caller)

    assert scope == CallScope(chosen, policy.workspaces[chosen], (chosen,), 300)


@pytest.mark.parametrize(
    ("caller", "requested"),
    [
        pytest.param(ALICE, "c", id="other-users-workspace"),
        pytest.param(ALICE, "nope", id="unknown-workspace"),
        pytest.param(Caller(("a", "b"), "b", False), "a", id="token-limited-to-another"),
        pytest.param(Caller(("a", "b"), "c", False), None, id="token-workspace-not-the-users"),
        pytest.param(Caller((), None, False), None, id="user-without-workspaces"),
        pytest.param(Caller(("ghost",), None, False), None, id="user-workspace-not-in-policy"),
        pytest.param(ADMIN, "nope", id="admin-unknown-workspace"),
        pytest.param(Caller((), "a", True), "c", id="admin-token-limited-to-another"),
    ],
)
def test_workspace_not_allowed(policy: Policy, caller: Caller, requested: str | None) -> None:
    arguments: dict[str, Any] = {"test_path": "tests"}
    if requested is not None:
        arguments["workspace"] = requested

    assert blocked(policy, arguments, caller) == "workspace_not_allowed"


def test_unknown_and_not_yours_read_the_same(policy: Policy) -> None:
    with pytest.raises(PolicyBlockedError) as other:
        check_call(policy, RUN_PYTEST, {"test_path": "tests", "workspace": "c"}, ALICE)
    with pytest.raises(PolicyBlockedError) as unknown:
        check_call(policy, RUN_PYTEST, {"test_path": "tests", "workspace": "nope"}, ALICE)

    assert (other.value.reason, other.value.detail) == (unknown.value.reason, unknown.value.detail)


def test_non_string_workspace_is_left_to_the_schema(policy: Policy) -> None:
    scope = check_call(policy, RUN_PYTEST, {"test_path": "../x", "workspace": 5}, ALICE)

    assert scope.workspace is None
    with pytest.raises(InvalidParamsError):
        check_arguments(RUN_PYTEST, {"test_path": "../x", "workspace": 5})


# --- paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("test_path", "reason"),
    [
        ("../b/tests", "path_outside_workspace"),
        ("/etc", "path_outside_workspace"),
        ("-x", "path_looks_like_option"),
        ("tests\x00", "path_invalid"),
    ],
)
def test_test_path_must_stay_in_the_workspace(policy: Policy, test_path: str, reason: str) -> None:
    assert blocked(policy, {"test_path": test_path}) == reason


def test_test_path_is_checked_against_the_chosen_workspace(policy: Policy, tmp_path: Path) -> None:
    (tmp_path / "b" / "link").symlink_to(tmp_path / "a", target_is_directory=True)

    assert blocked(policy, {"test_path": "link/tests", "workspace": "b"}) == "path_outside_workspace"
    check_call(policy, RUN_PYTEST, {"test_path": "tests", "workspace": "b"}, ALICE)


# --- read tools ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("caller", "visible"),
    [
        (ALICE, ("a", "b")),
        (Caller(("a", "b"), "b", False), ("b",)),
        (ADMIN, None),
        (Caller(("a",), "a", True), ("a",)),
    ],
)
def test_run_id_tools_see_the_callers_workspaces(
    policy: Policy, caller: Caller, visible: tuple[str, ...] | None
) -> None:
    scope = check_call(policy, GET_EVIDENCE, {"run_id": "0" * 32}, caller)

    assert scope == CallScope(None, None, visible, 300)
    assert visible_workspaces(caller) == visible


def test_list_artifacts_lists_one_workspace(policy: Policy) -> None:
    assert check_call(policy, LIST_ARTIFACTS, {"workspace": "b"}, ALICE).visible_workspaces == ("b",)
    assert blocked(policy, {"workspace": "c"}, ALICE, LIST_ARTIFACTS) == "workspace_not_allowed"


# --- check_arguments -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "arguments"),
    [
        pytest.param(RUN_PYTEST, {"test_path": "tests"}, id="minimal"),
        pytest.param(
            RUN_PYTEST,
            {
                "test_path": "tests/test_a.py",
                "workspace": "a",
                "keyword": "fast and not slow",
                "markers": "unit",
                "max_failures": 1,
                "timeout_s": 1,
            },
            id="every-argument",
        ),
        pytest.param(LIST_ARTIFACTS, {}, id="list-no-arguments"),
        pytest.param(LIST_ARTIFACTS, {"limit": 200}, id="list-limit-max"),
        pytest.param(GET_EVIDENCE, {"run_id": "0123456789abcdef" * 2}, id="evidence"),
        pytest.param(GET_CONTENT, {"run_id": "f" * 32, "name": "junit.xml", "max_bytes": 1}, id="content"),
    ],
)
def test_arguments_matching_the_schema_pass(spec: Any, arguments: dict[str, Any]) -> None:
    check_arguments(spec, arguments)


@pytest.mark.parametrize(
    ("spec", "arguments", "where"),
    [
        pytest.param(RUN_PYTEST, {}, "arguments", id="missing-test-path"),
        pytest.param(RUN_PYTEST, {"workspace": "a"}, "arguments", id="only-workspace"),
        pytest.param(RUN_PYTEST, {"test_path": 5}, "test_path", id="test-path-int"),
        pytest.param(RUN_PYTEST, {"test_path": ["tests"]}, "test_path", id="test-path-list"),
        pytest.param(RUN_PYTEST, {"test_path": ""}, "test_path", id="test-path-empty"),
        pytest.param(RUN_PYTEST, {"test_path": "-x"}, "test_path", id="test-path-option"),
        pytest.param(RUN_PYTEST, {"test_path": "--co"}, "test_path", id="test-path-long-option"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "args": ["-x"]}, "arguments", id="extra-property"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "keyword": "-k"}, "keyword", id="keyword-option"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "markers": "-m"}, "markers", id="markers-option"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "max_failures": 0}, "max_failures", id="maxfail-0"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "timeout_s": 0}, "timeout_s", id="timeout-0"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "timeout_s": "10"}, "timeout_s", id="timeout-string"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "timeout_s": True}, "timeout_s", id="timeout-bool"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "timeout_s": 1.5}, "timeout_s", id="timeout-float"),
        pytest.param(RUN_PYTEST, {"test_path": "tests", "workspace": ""}, "workspace", id="workspace-empty"),
        pytest.param(LIST_ARTIFACTS, {"limit": 201}, "limit", id="list-limit-over"),
        pytest.param(GET_EVIDENCE, {"run_id": "F" * 32}, "run_id", id="run-id-uppercase"),
        pytest.param(GET_EVIDENCE, {"run_id": "0" * 31}, "run_id", id="run-id-short"),
        pytest.param(GET_CONTENT, {"run_id": "0" * 32, "name": "../x"}, "name", id="artifact-name-escape"),
        pytest.param(GET_CONTENT, {"run_id": "0" * 32, "name": ".env"}, "name", id="artifact-name-dotfile"),
    ],
)
def test_arguments_not_matching_the_schema_are_invalid(spec: Any, arguments: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidParamsError) as caught:
        check_arguments(spec, arguments)

    assert caught.value.code == -32602
    assert caught.value.reason == "invalid_arguments"
    assert caught.value.detail is not None
    assert caught.value.detail.startswith(f"{where}: ")


def test_long_schema_messages_are_cut(policy: Policy) -> None:
    with pytest.raises(InvalidParamsError) as caught:
        check_arguments(RUN_PYTEST, {"test_path": "-" + "x" * 1000})

    assert caught.value.detail is not None
    assert len(caught.value.detail) <= len("test_path: ") + 201


# --- a token's `ws` never widens what the user may see today ------------------


@pytest.mark.parametrize(
    ("caller", "visible"),
    [
        pytest.param(Caller(("default",), "other", False), (), id="admin-token-after-demotion-to-user"),
        pytest.param(Caller((), "other", False), (), id="user-without-workspaces"),
        pytest.param(Caller(("a",), "b", False), (), id="workspace-taken-from-the-user"),
        pytest.param(Caller(("a", "b"), "b", False), ("b",), id="user-still-has-it"),
        pytest.param(Caller((), "other", True), ("other",), id="admin-any-workspace"),
        pytest.param(Caller(("a",), None, False), ("a",), id="no-ws-claim-user"),
        pytest.param(Caller(("a",), None, True), None, id="no-ws-claim-admin"),
    ],
)
def test_a_token_workspace_only_narrows(caller: Caller, visible: tuple[str, ...] | None) -> None:
    assert visible_workspaces(caller) == visible
    without_token = visible_workspaces(Caller(caller.workspaces, None, caller.is_admin))
    if without_token is not None and visible is not None:
        assert set(visible) <= set(without_token), "the token shows nothing the user could not see without it"


@pytest.mark.parametrize("spec", [LIST_ARTIFACTS, GET_EVIDENCE, GET_CONTENT], ids=lambda s: s.name)
def test_read_tools_of_a_demoted_token_see_nothing(policy: Policy, spec: Any) -> None:
    demoted = Caller(("a",), "c", False)  # the token was issued for c while the user was ADMIN
    arguments = {"run_id": "0" * 32, "name": "stdout.txt"} if spec is not LIST_ARTIFACTS else {}

    assert check_call(policy, spec, arguments, demoted).visible_workspaces == ()
    assert blocked(policy, {"workspace": "c"}, demoted, LIST_ARTIFACTS) == "workspace_not_allowed"


# --- whole-value patterns, no option prefixes, no control characters ----

CONTROL_VARIANTS = {
    "trailing-newline": "{}\n",
    "trailing-crlf": "{}\r\n",
    "trailing-cr": "{}\r",
    "embedded-newline": "{}\nx",
    "leading-newline": "\n{}",
    "nul": "{}\x00",
    "tab": "{}\tx",
    "escape": "{}\x1b[2J",
    "del": "{}\x7f",
    "nel": "{}\x85",
    "line-separator": "{}\u2028",
}
GOOD_VALUES = [
    (RUN_PYTEST, {"test_path": "tests"}, "test_path"),
    (RUN_PYTEST, {"test_path": "tests", "keyword": "fast"}, "keyword"),
    (RUN_PYTEST, {"test_path": "tests", "markers": "unit"}, "markers"),
    (RUN_PYTEST, {"test_path": "tests", "workspace": "a"}, "workspace"),
    (LIST_ARTIFACTS, {"workspace": "a"}, "workspace"),
    (GET_EVIDENCE, {"run_id": "0" * 32}, "run_id"),
    (GET_CONTENT, {"run_id": "0" * 32, "name": "junit.xml"}, "run_id"),
    (GET_CONTENT, {"run_id": "0" * 32, "name": "junit.xml"}, "name"),
]


@pytest.mark.parametrize("variant", list(CONTROL_VARIANTS.values()), ids=list(CONTROL_VARIANTS))
@pytest.mark.parametrize(("spec", "arguments", "field"), GOOD_VALUES, ids=[f"{s.name}-{f}" for s, _, f in GOOD_VALUES])
def test_control_characters_fail_the_schema(spec: Any, arguments: dict[str, Any], field: str, variant: str) -> None:
    check_arguments(spec, arguments)  # the value itself is fine
    hostile = {**arguments, field: variant.format(arguments[field])}

    with pytest.raises(InvalidParamsError) as caught:
        check_arguments(spec, hostile)

    assert caught.value.detail is not None and caught.value.detail.startswith(f"{field}: ")


@pytest.mark.parametrize("field", ["test_path", "keyword", "markers"])
@pytest.mark.parametrize("value", ["@opts", "@", "@/usr/share/dict/words", "-x", "--co", "-"])
def test_option_and_options_file_prefixes_fail_the_schema(field: str, value: str) -> None:
    with pytest.raises(InvalidParamsError) as caught:
        check_arguments(RUN_PYTEST, {"test_path": "tests", field: value})

    assert caught.value.detail == (
        f"{field}: must not start with '-' or '@' (pytest would read it as an option or a file of options) "
        "and must not hold control characters"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("test_path", "tests/test_a.py::test_x[1-2]"),
        ("test_path", "tests/tëst_ünïcode.py"),
        ("test_path", "a@b/c-d"),
        ("test_path", "x"),
        ("keyword", "fast and not slow"),
        ("keyword", "a-b or c@d"),
        ("markers", "not slow"),
        ("markers", "x"),
    ],
)
def test_whole_values_still_pass(field: str, value: str) -> None:
    check_arguments(RUN_PYTEST, {"test_path": "tests", field: value})


def test_every_registry_pattern_is_a_whole_value_pattern_with_a_hint() -> None:
    patterns = [
        (tool, name, prop["pattern"])
        for tool, spec in TOOLS.items()
        for name, prop in spec.input_schema["properties"].items()
        if "pattern" in prop
    ]
    assert len(patterns) >= 6
    for tool, name, pattern in patterns:
        assert pattern.startswith("^") and pattern.endswith("$"), (tool, name, pattern)
        re.compile(pattern)
        assert pattern in PATTERN_HINTS, (tool, name)


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [
        ("^[0-9a-f]{32}$", "0" * 32, True),
        ("^[0-9a-f]{32}$", "0" * 32 + "\n", False),  # re.search would say True
        ("^[a-z]+$", "abc\n", False),
        ("^[a-z]+$", "abc", True),
        ("^[^-]", "x\n", True),  # unanchored at the end: search semantics, as ECMA-262 reads it
        ("[0-9]", "a1", True),
        ("^a\\$", "a$", True),  # an escaped dollar is no anchor
    ],
)
def test_matches_pattern_reads_anchors_as_ecma_262_does(pattern: str, value: str, matches: bool) -> None:
    assert matches_pattern(pattern, value) is matches


@pytest.mark.parametrize(
    ("test_path", "reason"),
    [
        ("@opts", "path_looks_like_option"),
        ("@/usr/share/dict/words", "path_looks_like_option"),
        ("tests\n", "path_invalid"),
        ("tests\r\n", "path_invalid"),
        ("tes\nts", "path_invalid"),
        ("tests\x1b", "path_invalid"),
    ],
)
def test_stage_4_refuses_option_files_and_control_characters(policy: Policy, test_path: str, reason: str) -> None:
    assert blocked(policy, {"test_path": test_path}) == reason


# --- the folders a run would read must still be those pinned at policy load (decision 30) -------


def swap_for_link(path: Path, target: Path) -> None:
    path.rename(path.with_name(path.name + "-away"))
    path.symlink_to(target, target_is_directory=True)


def test_a_workspace_swapped_for_a_link_after_load_is_refused(policy: Policy, tmp_path: Path) -> None:
    scope = check_call(policy, RUN_PYTEST, {"test_path": "tests"}, ALICE)
    assert scope.pinned_root is policy.pins[policy.workspaces["a"]]
    swap_for_link(tmp_path / "a", tmp_path)

    assert blocked(policy, {"test_path": "tests"}) == "workspace_changed"
    with pytest.raises(PolicyBlockedError) as caught:
        check_pins_intact(scope)
    assert caught.value.reason == "workspace_changed"
    assert "'a'" in caught.value.public_message() and "restart the gateway" in caught.value.public_message()


def test_another_workspace_of_the_same_user_is_not_affected_by_a_swap(policy: Policy, tmp_path: Path) -> None:
    swap_for_link(tmp_path / "a", tmp_path)
    scope = check_call(policy, RUN_PYTEST, {"test_path": "tests", "workspace": "b"}, ALICE)
    assert scope.pinned_root is not None and scope.pinned_root.path == policy.workspaces["b"]


def test_a_workspace_replaced_by_a_new_folder_is_refused(policy: Policy, tmp_path: Path) -> None:
    (tmp_path / "a").rename(tmp_path / "a-away")
    (tmp_path / "a" / "tests").mkdir(parents=True)

    assert blocked(policy, {"test_path": "tests"}) == "workspace_changed"


def test_a_workspace_missing_at_load_is_refused_even_once_created(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("version: 1\nworkspaces: {a: a}\ntools:\n  allowlist: [run_pytest]\n")
    policy = parse_policy((tmp_path / "policy.yaml").read_text(), tmp_path / "policy.yaml", TOOL_NAMES)
    assert blocked(policy, {"test_path": "tests"}) == "workspace_not_found"
    (tmp_path / "a").mkdir()

    assert blocked(policy, {"test_path": "tests"}) == "workspace_not_found", "never pinned: a restart pins it"


def test_read_tools_need_no_folder(policy: Policy, tmp_path: Path) -> None:
    swap_for_link(tmp_path / "a", tmp_path)
    scope = check_call(policy, LIST_ARTIFACTS, {"workspace": "a"}, ALICE)

    assert (scope.workspace, scope.pinned_root) == ("a", None)


def test_allowed_paths_are_pinned_and_checked_for_sandboxed_tools(tmp_path: Path) -> None:
    for name in ("a", "shared", "elsewhere"):
        (tmp_path / name).mkdir()
    (tmp_path / "policy.yaml").write_text(
        "version: 1\nworkspaces: {a: a}\ntools:\n  allowlist: [run_pytest, list_artifacts]\n"
        "sandbox:\n  allowed_paths: [shared, missing]\n"
    )
    policy = parse_policy((tmp_path / "policy.yaml").read_text(), tmp_path / "policy.yaml", TOOL_NAMES)
    assert blocked(policy, {"test_path": "tests"}) == "allowed_path_not_found"
    (tmp_path / "missing").mkdir()
    assert blocked(policy, {"test_path": "tests"}) == "allowed_path_not_found"
    fixed = dataclasses.replace(
        policy, sandbox=dataclasses.replace(policy.sandbox, allowed_paths=policy.sandbox.allowed_paths[:1])
    )
    scope = check_call(fixed, RUN_PYTEST, {"test_path": "tests"}, ALICE)
    assert [p.path for p in scope.pinned_paths] == [(tmp_path / "shared").resolve()]
    swap_for_link(tmp_path / "shared", tmp_path / "elsewhere")

    assert blocked(fixed, {"test_path": "tests"}) == "allowed_path_changed"
    with pytest.raises(PolicyBlockedError) as caught:
        check_pins_intact(scope)
    assert caught.value.reason == "allowed_path_changed"
    check_call(fixed, LIST_ARTIFACTS, {"workspace": "a"}, ALICE)  # read tools are not affected
