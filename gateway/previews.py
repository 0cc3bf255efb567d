"""What an agent's tool use would do, as a person at `mcp-gateway approvals` reads it (spec section 9).

Bash shows its command, WebFetch its URL and host, and Edit, MultiEdit and Write a unified diff
against the file as it is now. The current file is read only inside the workspace (after
following symlinks), only if it is a regular file of at most `READ_LIMIT` bytes: a tool use
naming `/etc/shadow` gets a diff of the fragments it carries, never the file's content. Every
preview is cut at `MAX_LINES` lines of at most `MAX_LINE_CHARS` characters. Control characters
are left for the approver to escape (`approvals.shown`).
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

READ_LIMIT = 1 << 20
MAX_LINES = 200
MAX_LINE_CHARS = 400


def preview(tool: str, tool_input: Mapping[str, Any], root: Path | None) -> str | None:
    """The preview of one tool use; None when its arguments say it best (tools without a preview)."""
    if tool == "Bash":
        return _cut(_bash(tool_input))
    if tool == "WebFetch":
        return _cut(_fetch(tool_input))
    if tool in ("Edit", "MultiEdit", "Write"):
        return _cut(file_change(tool, tool_input, root))
    return None


def _bash(tool_input: Mapping[str, Any]) -> list[str]:
    command = tool_input.get("command")
    if not isinstance(command, str):
        return ["(no command)"]
    lines = [f"$ {line}" if i == 0 else f"  {line}" for i, line in enumerate(command.split("\n"))]
    description = tool_input.get("description")
    if isinstance(description, str) and description:
        lines.append(f"# {description}")
    return lines


def _fetch(tool_input: Mapping[str, Any]) -> list[str]:
    url = tool_input.get("url")
    if not isinstance(url, str):
        return ["(no url)"]
    lines = [f"GET {url}", f"host: {urlsplit(url).hostname or '(none)'}"]
    prompt = tool_input.get("prompt")
    if isinstance(prompt, str) and prompt:
        lines.append(f"# {prompt}")
    return lines


# --- file changes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Current:
    """The file as it is: its text, or why it was not read (`text` is "" for a file that does not exist)."""

    label: str
    text: str | None
    note: str | None = None


def current_file(value: object, root: Path | None) -> Current:
    """Read the file a tool use names, if it lies inside the workspace (symlinks followed)."""
    if not isinstance(value, str) or not value:
        return Current("(no path)", None, "no file path given")
    path = Path(value) if value.startswith("/") or root is None else root / value
    if root is None:
        return Current(value, None, "no workspace: the current file is not read")
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(real_root):
        return Current(value, None, f"outside the workspace ({real}): the current file is not read")
    label = str(real.relative_to(real_root))
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Current(label, "", "new file")
    except OSError as exc:
        return Current(label, None, f"cannot be read ({exc.strerror})")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Current(label, None, "not a regular file: not read")
        if info.st_size > READ_LIMIT:
            return Current(label, None, f"{info.st_size} bytes, over {READ_LIMIT}: not read")
        data = os.read(fd, READ_LIMIT + 1)
    finally:
        os.close(fd)
    if b"\0" in data:
        return Current(label, None, "binary file: not shown")
    return Current(label, data.decode("utf-8", errors="replace"))


def file_change(tool: str, tool_input: Mapping[str, Any], root: Path | None) -> list[str]:
    """A unified diff of the change against the current file, or of the fragments when that cannot be."""
    current = current_file(tool_input.get("file_path"), root)
    header = [f"{tool} {current.label}" + (f"  ({current.note})" if current.note else "")]
    if tool == "Write":
        content = tool_input.get("content")
        if not isinstance(content, str):
            return [*header, "(no content)"]
        return [*header, *_diff(current.text or "", content, current.label)]
    edits = _edits(tool, tool_input)
    if edits is None:
        return [*header, "(no edits)"]
    if current.text is None:
        return [*header, *_fragments(edits, current.label)]
    text = current.text
    for old, new, replace_all in edits:
        found = text.count(old) if old else 0
        if found == 0 or (found > 1 and not replace_all):
            why = "is not in the file" if found == 0 else f"occurs {found} times (replace_all is off)"
            notice = f"old_string {why}: Claude Code will refuse this edit"
            return [*header, notice, *_fragments(edits, current.label)]
        text = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    return [*header, *_diff(current.text, text, current.label)]


def _edits(tool: str, tool_input: Mapping[str, Any]) -> list[tuple[str, str, bool]] | None:
    raw: object = tool_input.get("edits") if tool == "MultiEdit" else [tool_input]
    if not isinstance(raw, list) or not raw:
        return None
    edits = []
    for item in raw:
        if not isinstance(item, Mapping):
            return None
        old, new = item.get("old_string"), item.get("new_string")
        if not isinstance(old, str) or not isinstance(new, str):
            return None
        edits.append((old, new, item.get("replace_all") is True))
    return edits


def _fragments(edits: Sequence[tuple[str, str, bool]], label: str) -> list[str]:
    lines: list[str] = []
    for old, new, _ in edits:
        lines.extend(_diff(old, new, f"{label} (fragment)"))
    return lines


def _diff(old: str, new: str, label: str) -> list[str]:
    diff = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=f"a/{label}", tofile=f"b/{label}", lineterm=""
    )
    lines = list(diff)
    return lines or ["(no change)"]


def _cut(lines: list[str]) -> str:
    kept = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…" for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        kept.append(f"… {len(lines) - MAX_LINES} more lines")
    return "\n".join(kept)
