"""gateway/consent/grant_scope.py: a stored Deny for a path covers every spelling of it, what is under it, and
whatever else comes with the call (decision 44); an Allow stays exact."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.consent.grant_scope import (
    absolute_spellings,
    deny_covers,
    normal_grant_arguments,
    normal_path,
    overlaps,
    workspace_spellings,
)


@pytest.mark.parametrize(
    ("value", "normal"),
    [
        ("tests/integration", "tests/integration"),
        ("tests/integration/", "tests/integration"),
        ("./tests/integration", "tests/integration"),
        ("tests//integration", "tests/integration"),
        ("tests/./integration/.", "tests/integration"),
        ("tests/unit/../integration", "tests/integration"),
        ("tests/integration/test_x.py::test_a", "tests/integration/test_x.py"),
        ("tests/integration/test_x.py::TestA::test_b[1-2]", "tests/integration/test_x.py"),
        (".", "."),
        ("./", "."),
        ("tests/..", "."),
        ("/proj//src/./a.py", "/proj/src/a.py"),
        ("/../etc/passwd", "/etc/passwd"),
        ("../outside", None),
        ("tests/../../outside", None),
        ("", None),
        ("::test_a", None),
    ],
)
def test_normal_path(value: str, normal: str | None) -> None:
    assert normal_path(value) == normal


@pytest.mark.parametrize(
    ("a", "b", "touching"),
    [
        ("tests/integration", "tests/integration", True),
        ("tests/integration/test_x.py", "tests/integration", True),
        ("tests", "tests/integration", True),  # running `tests` runs what is in `tests/integration`
        (".", "tests/integration", True),
        ("tests/integration_extra", "tests/integration", False),
        ("tests/unit", "tests/integration", False),
        ("/proj/secrets", "/proj/secrets/a.env", True),
        ("/proj/secret", "/proj/secrets", False),
        ("/", "/proj", True),
    ],
)
def test_overlaps(a: str, b: str, touching: bool) -> None:
    assert overlaps(a, b) is touching
    assert overlaps(b, a) is touching


DENIED = {"test_path": "tests/integration"}


@pytest.mark.parametrize(
    "test_path",
    [
        "tests/integration",
        "tests/integration/",
        "./tests/integration",
        "tests//integration",
        "tests/./integration",
        "tests/unit/../integration",
        "tests/integration/test_x.py",
        "tests/integration/test_x.py::test_a",
        "tests/integration/sub/test_y.py::TestA::test_b[1]",
        "tests",
        ".",
    ],
)
@pytest.mark.parametrize(
    "other", [{}, {"keyword": "smoke"}, {"timeout_s": 5, "max_failures": 1}, {"markers": "slow", "workspace": "w"}]
)
def test_a_deny_on_a_path_covers_every_spelling_and_what_is_under_it_with_any_other_arguments(
    tmp_path: Path, test_path: str, other: dict[str, Any]
) -> None:
    (tmp_path / "tests" / "integration" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "unit").mkdir()
    arguments = {"test_path": test_path, **other}
    spellings = {"test_path": workspace_spellings(str(tmp_path), test_path)}
    assert deny_covers(DENIED, arguments, spellings)


@pytest.mark.parametrize("test_path", ["tests/unit", "tests/integration_extra", "tests/unit/test_integration.py"])
def test_a_deny_on_a_path_leaves_other_paths_alone(tmp_path: Path, test_path: str) -> None:
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    spellings = {"test_path": workspace_spellings(str(tmp_path), test_path)}
    assert not deny_covers(DENIED, {"test_path": test_path, "keyword": "x"}, spellings)


def test_a_symlink_to_the_denied_folder_is_another_spelling_of_it(tmp_path: Path) -> None:
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    (tmp_path / "tests" / "alias").symlink_to("integration")
    spellings = {"test_path": workspace_spellings(str(tmp_path), "tests/alias/test_x.py")}
    assert spellings["test_path"] == {"tests/alias/test_x.py", "tests/integration/test_x.py"}
    assert deny_covers(DENIED, {"test_path": "tests/alias/test_x.py"}, spellings)


def test_a_link_leading_out_of_the_workspace_has_only_its_written_spelling(tmp_path: Path) -> None:
    (tmp_path / "out").symlink_to("/etc")
    assert workspace_spellings(str(tmp_path), "out/passwd") == {"out/passwd"}


def test_without_path_arguments_a_deny_needs_its_own_arguments_whatever_else_comes(tmp_path: Path) -> None:
    denied = {"command": "rm -rf ~"}
    assert deny_covers(denied, {"command": "rm -rf ~", "description": "tidy up", "timeout": 5}, {})
    assert not deny_covers(denied, {"command": "rm -rf /tmp/x"}, {})
    assert not deny_covers(denied, {}, {})
    assert not deny_covers({"count": 1}, {"count": True}, {}), "JSON values, not Python's 1 == True"


def test_claude_code_paths_are_compared_absolute_as_written_and_resolved(tmp_path: Path) -> None:
    root = str(tmp_path)
    (tmp_path / "secrets").mkdir()
    (tmp_path / "link").symlink_to("secrets")
    denied = normal_grant_arguments({"file_path": "secrets"}, ("file_path",), root)
    assert denied == {"file_path": f"{root}/secrets"}
    for written in (f"{root}/secrets/a.env", f"{root}//secrets/./a.env", "secrets/a.env", "./link/a.env"):
        assert deny_covers(denied, {"file_path": written}, {"file_path": absolute_spellings(root, written)}), written
    assert not deny_covers(denied, {"file_path": "src/a.py"}, {"file_path": absolute_spellings(root, "src/a.py")})
    assert absolute_spellings(root, None) == {os.path.realpath(root), root}, "absent: the workspace itself"


def test_a_deny_is_stored_in_its_normal_spelling_and_refused_when_it_leaves_the_workspace() -> None:
    stored = normal_grant_arguments({"test_path": "./tests//integration/", "keyword": "k"}, ("test_path",))
    assert stored == {"test_path": "tests/integration", "keyword": "k"}
    with pytest.raises(ValueError, match="leaves the workspace"):
        normal_grant_arguments({"test_path": "../x"}, ("test_path",))
    with pytest.raises(ValueError, match="relative to the workspace"):
        normal_grant_arguments({"test_path": "/etc"}, ("test_path",))
    with pytest.raises(ValueError, match="must be a path"):
        normal_grant_arguments({"test_path": 3}, ("test_path",))
