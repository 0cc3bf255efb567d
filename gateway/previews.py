"""What an agent's tool use would do, as a person at `mcp-gateway approvals` reads it (docs/claude-code.md, "What the approver shows").

Bash shows its command, WebFetch its URL and host, and Edit, MultiEdit and Write a unified diff
against the file as it is now. The current file is read only inside the workspace, opened
beneath the workspace's pinned folder in one call that follows no link (`sandbox.beneath`: no gap
between a check and the open for a swapped folder to use), and only if it is a regular file of at
most `READ_LIMIT` bytes: a tool use naming `/etc/shadow` gets a diff of the fragments it carries,
never the file's content.

A preview is whole and `visible` line by line: every character that does not print is escaped,
a newline inside a value (a path, a description) included, so only the preview's own lines
break it. What the agent wrote about its tool use (Bash's `description`, WebFetch's `prompt`) is
labelled as the agent's word. Each channel cuts the preview for its screen, loudly
(`visible.excerpt`); the approver can show it whole.
"""

from __future__ import annotations

import difflib
import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.rules.hosts import read_host
from gateway.visible import visible
from sandbox.beneath import open_beneath
from sandbox.pinned import Pinned, open_without_links

READ_LIMIT = 1 << 20
AGENT_SAYS = "the agent says ({field}, unchecked): {text}"


def preview(tool: str, tool_input: Mapping[str, Any], root: Pinned | Path | None) -> str | None:
    """The preview of one tool use; None when its arguments say it best (tools without a preview)."""
    if tool == "Bash":
        return _shown(_bash(tool_input))
    if tool == "WebFetch":
        return _shown(_fetch(tool_input))
    if tool in ("Edit", "MultiEdit", "Write"):
        return _shown(file_change(tool, tool_input, root))
    return None


def _bash(tool_input: Mapping[str, Any]) -> list[str]:
    command = tool_input.get("command")
    if not isinstance(command, str):
        return ["(no command)"]
    # Every line of the command has a prompt ("$ ", then "> "): no line of it can pass for the label below.
    lines = [f"$ {line}" if i == 0 else f"> {line}" for i, line in enumerate(command.split("\n"))]
    description = tool_input.get("description")
    if isinstance(description, str) and description:
        lines.append(AGENT_SAYS.format(field="description", text=description))
    return lines


def _fetch(tool_input: Mapping[str, Any]) -> list[str]:
    url = tool_input.get("url")
    if not isinstance(url, str):
        return ["(no url)"]
    lines = [f"GET {url}", f"host: {read_host(url).host or '(none)'}"]
    prompt = tool_input.get("prompt")
    if isinstance(prompt, str) and prompt:
        lines.append(AGENT_SAYS.format(field="prompt", text=prompt))
    return lines


# --- file changes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Current:
    """The file as it is: its text, or why it was not read (`text` is "" for a file that does not exist)."""

    label: str
    text: str | None
    note: str | None = None


def current_file(value: object, root: Pinned | Path | None) -> Current:
    """Read the file a tool use names, if it lies beneath the workspace `root` and is reached without a link.

    `root` is the workspace as pinned at policy load (its fd is used, never its path again), or a
    path, opened without links here. The file is opened beneath it in one call (`open_beneath`), so
    a folder swapped for a link between any check and the open cannot send the read elsewhere.
    """
    if not isinstance(value, str) or not value:
        return Current("(no path)", None, "no file path given")
    if root is None:
        return Current(value, None, "no workspace: the current file is not read")
    if value.startswith("~"):
        return Current(value, None, "a ~ path (Claude Code's home, unknown here): the current file is not read")
    root_path = root.path if isinstance(root, Pinned) else root
    relative = value
    if value.startswith("/"):
        if not Path(value).is_relative_to(root_path):
            return Current(value, None, "outside the workspace: the current file is not read")
        relative = str(Path(value).relative_to(root_path))
    label = os.path.normpath(relative)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        root_fd = root.fd if isinstance(root, Pinned) else open_without_links(root)
    except OSError as exc:
        return Current(value, None, f"the workspace cannot be opened without links ({exc.strerror})")
    try:
        fd = open_beneath(root_fd, relative, flags)
    except FileNotFoundError:
        return Current(label, "", "new file")
    except OSError as exc:
        return Current(value, None, _unread(exc))
    finally:
        if not isinstance(root, Pinned):
            os.close(root_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Current(label, None, "not a regular file: not read")
        if info.st_size > READ_LIMIT:
            return Current(label, None, f"{info.st_size} bytes, over {READ_LIMIT}: not read")
        data = _read_at_most(fd, READ_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > READ_LIMIT:
        return Current(label, None, f"over {READ_LIMIT} bytes: not read")
    if b"\0" in data:
        return Current(label, None, "binary file: not shown")
    return Current(label, data.decode("utf-8", errors="replace"))


def _unread(exc: OSError) -> str:
    if exc.errno == errno.EXDEV:
        return "outside the workspace: the current file is not read"
    if exc.errno == errno.ELOOP:
        return "a symbolic link on the way, which the preview does not follow (it may lead outside the workspace): not read"
    return f"cannot be read ({exc.strerror})"


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def file_change(tool: str, tool_input: Mapping[str, Any], root: Pinned | Path | None) -> list[str]:
    """A unified diff of the change against the current file, or of the fragments when that cannot be."""
    current = current_file(tool_input.get("file_path"), root)
    header = [f"{tool} {current.label}" + (f" ({current.note})" if current.note else "")]
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
    diff = difflib.unified_diff(_lines(old), _lines(new), fromfile=f"a/{label}", tofile=f"b/{label}", lineterm="")
    lines = list(diff)
    return lines or ["(no change)"]


def _lines(text: str) -> list[str]:
    """Lines at "\n" only: a carriage return or U+2028 inside a line is shown escaped, not as a break."""
    lines = text.split("\n") if text else []
    return lines[:-1] if text.endswith("\n") else lines


def _shown(lines: list[str]) -> str:
    """The preview's lines, each `visible` on its own: a newline inside one is escaped, not a new line."""
    return "\n".join(visible(line) for line in lines)
