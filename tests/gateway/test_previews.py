"""What the approver is shown for an agent's tool use (issue 5, acceptance 3): real files in a temporary workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.approvals import shown
from gateway.previews import MAX_LINES, READ_LIMIT, current_file, preview


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def main():\n    return 1\n\n\nprint(main())\n")
    return root


def test_edit_is_a_unified_diff_against_the_current_file(workspace: Path) -> None:
    edit = {"file_path": str(workspace / "src/app.py"), "old_string": "return 1", "new_string": "return 2"}
    assert preview("Edit", edit, workspace) == "\n".join(
        [
            "Edit src/app.py",
            "--- a/src/app.py",
            "+++ b/src/app.py",
            "@@ -1,5 +1,5 @@",
            " def main():",
            "-    return 1",
            "+    return 2",
            " ",
            " ",
            " print(main())",
        ]
    )


def test_edit_replaces_the_first_occurrence_or_all_with_replace_all(workspace: Path) -> None:
    path = workspace / "src" / "twice.py"
    path.write_text("x = 1\ny = 1\n")
    one = {"file_path": str(path), "old_string": "= 1", "new_string": "= 2", "replace_all": True}
    assert preview("Edit", one, workspace) == "\n".join(
        ["Edit src/twice.py", "--- a/src/twice.py", "+++ b/src/twice.py", "@@ -1,2 +1,2 @@",
         "-x = 1", "-y = 1", "+x = 2", "+y = 2"]
    )  # fmt: skip
    ambiguous = {"file_path": str(path), "old_string": "= 1", "new_string": "= 2"}
    text = preview("Edit", ambiguous, workspace)
    assert text is not None
    assert "old_string occurs 2 times (replace_all is off): Claude Code will refuse this edit" in text
    assert "--- a/src/twice.py (fragment)" in text


def test_an_edit_whose_old_string_is_missing_says_so(workspace: Path) -> None:
    edit = {"file_path": str(workspace / "src/app.py"), "old_string": "return 9", "new_string": "return 2"}
    text = preview("Edit", edit, workspace)
    assert text is not None
    assert text.splitlines()[:2] == [
        "Edit src/app.py",
        "old_string is not in the file: Claude Code will refuse this edit",
    ]
    assert "-return 9" in text and "+return 2" in text


def test_multi_edit_applies_its_edits_in_order(workspace: Path) -> None:
    edits = [{"old_string": "return 1", "new_string": "return 2"}, {"old_string": "return 2", "new_string": "return 3"}]
    text = preview("MultiEdit", {"file_path": str(workspace / "src/app.py"), "edits": edits}, workspace)
    assert text is not None
    assert "-    return 1\n+    return 3" in text


def test_write_diffs_the_new_content_against_the_old(workspace: Path) -> None:
    write = {"file_path": str(workspace / "src/app.py"), "content": "def main():\n    return 1\n"}
    assert preview("Write", write, workspace) == "\n".join(
        ["Write src/app.py", "--- a/src/app.py", "+++ b/src/app.py", "@@ -1,5 +1,2 @@",
         " def main():", "     return 1", "-", "-", "-print(main())"]
    )  # fmt: skip


def test_write_of_a_new_file_is_all_additions(workspace: Path) -> None:
    write = {"file_path": str(workspace / "src/new.py"), "content": "a\nb\n"}
    assert preview("Write", write, workspace) == "\n".join(
        ["Write src/new.py  (new file)", "--- a/src/new.py", "+++ b/src/new.py", "@@ -0,0 +1,2 @@", "+a", "+b"]
    )


def test_a_relative_path_is_taken_from_the_workspace(workspace: Path) -> None:
    edit = {"file_path": "src/app.py", "old_string": "return 1", "new_string": "return 2"}
    text = preview("Edit", edit, workspace)
    assert text is not None and "+    return 2" in text


def test_files_outside_the_workspace_are_never_read(workspace: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT\n")
    (workspace / "src" / "link.py").symlink_to(secret)
    for target in (str(secret), str(workspace / "src/link.py"), str(workspace / "src/../../secret.txt")):
        edit = {"file_path": target, "old_string": "SECRET", "new_string": "public"}
        write = {"file_path": target, "content": "new\n"}
        for tool, tool_input in (("Edit", edit), ("Write", write)):
            text = preview(tool, tool_input, workspace)
            assert text is not None
            assert "SECRET-CONTENT" not in text, (tool, target)
            assert "outside the workspace" in text
    assert current_file(str(secret), workspace).text is None


def test_special_binary_and_large_files_are_not_read(workspace: Path) -> None:
    os.mkfifo(workspace / "src" / "pipe")
    (workspace / "src" / "blob.bin").write_bytes(b"\x00\x01\x02")
    (workspace / "src" / "big.txt").write_bytes(b"x" * (READ_LIMIT + 1))
    assert current_file(str(workspace / "src/pipe"), workspace).note == "not a regular file: not read"
    assert current_file(str(workspace / "src/blob.bin"), workspace).note == "binary file: not shown"
    big = current_file(str(workspace / "src/big.txt"), workspace)
    assert big.text is None and big.note is not None and "over" in big.note


def test_bash_and_webfetch_previews() -> None:
    bash = {"command": "pytest -q &&\ngit push", "description": "run the tests"}
    assert preview("Bash", bash, None) == "$ pytest -q &&\n  git push\n# run the tests"
    fetch = {"url": "https://docs.example.com/a?b=1", "prompt": "summarise"}
    assert preview("WebFetch", fetch, None) == "GET https://docs.example.com/a?b=1\nhost: docs.example.com\n# summarise"
    assert preview("Read", {"file_path": "/x"}, None) is None  # its arguments say it


def test_long_previews_are_cut(workspace: Path) -> None:
    write = {"file_path": str(workspace / "src/long.py"), "content": "".join(f"line {i}\n" for i in range(500))}
    text = preview("Write", write, workspace)
    assert text is not None
    lines = text.splitlines()
    assert len(lines) == MAX_LINES + 1
    assert lines[-1].startswith("… ") and lines[-1].endswith("more lines")


def test_the_approver_escapes_what_could_steer_a_terminal() -> None:
    # A carriage return could overwrite the line with something harmless-looking; an escape
    # sequence could erase it; a bidi override could reorder it.
    assert shown("rm -rf ~\rpytest") == "rm -rf ~\\u000dpytest"
    assert shown("ls\x1b[2K") == "ls\\u001b[2K"
    assert shown("a\u202eb") == "a\\u202eb"
    assert shown("ok: é ü 中") == "ok: é ü 中"
