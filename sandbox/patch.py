"""A change set as people read it: a unified diff (`changes.patch`) and a short summary (decision 78).

`render_patch(changes)` is a unified diff of the text files, with what a diff cannot show named in
words: binary files and their sizes ("binary file, 12,345 bytes -> 12,400 bytes"), mode changes,
folders, and every refused entry with why. `summarize(changes, max_names)` is the short form for
a prompt that must be cut: the counts and the first names. Both are pure.

Paths are kept exact in the change set (bytes through os.fsencode) and shown escaped here:
`shown(path)` turns control characters (a newline included), bidi and other format characters,
and bytes that are not UTF-8 into visible escapes, so a name can neither break a line of the
patch nor read as another name. A text file's lines holding such characters (a bidi override
that makes code read otherwise than it runs) are shown escaped too, under a line that says so:
the patch is for people; what is applied is the change set's exact bytes.
"""

from __future__ import annotations

import difflib
import os
import re
import unicodedata
from pathlib import Path

from sandbox.change_set import Action, Change, ChangeSet
from sandbox.workspace_copy import Kind

_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_TEXT_PROBE = 8192
_ASCII_HIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""ASCII's control characters but the tab."""


def shown(path: str) -> str:
    """`path` with every character a person could misread escaped (`\\n`, `\\u202e`, `\\xff` for a raw byte)."""
    out: list[str] = []
    for char in path:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char == "\\":
            out.append("\\\\")
        elif char in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char])
        elif unicodedata.category(char) in _HIDDEN_CATEGORIES:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


def _shown_line(line: str) -> str:
    """A diff line with what a reader cannot see escaped as `shown` does (a tab kept: it shows)."""
    if line.isascii() and not _ASCII_HIDDEN.search(line):  # most lines: no character looked up one by one
        return line
    if all(char == "\t" or unicodedata.category(char) not in _HIDDEN_CATEGORIES for char in line):
        return line
    return "\t".join(shown(part) for part in line.split("\t"))


def _is_text(content: bytes) -> bool:
    if b"\0" in content[:_TEXT_PROBE]:
        return False
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _size(value: int | None) -> str:
    return f"{value or 0:,} bytes"


def _mode(value: int | None) -> str:
    return f"{value or 0:04o}"


def _file_diff(change: Change) -> list[str]:
    name = shown(change.path)
    before, after = change.content_before, change.content
    old = "/dev/null" if change.action is Action.ADDED else f"a/{name}"
    new = "/dev/null" if change.action is Action.DELETED else f"b/{name}"
    lines = [f"--- {old}", f"+++ {new}"]
    if change.action is not Action.ADDED and before is None:
        return [*lines, f"# {change.action} file, {_size(change.size_before)} -> {_size(change.size_after)}; "
                "its earlier content is no longer in the workspace as it was (applying it would conflict)"]  # fmt: skip
    texts = [content for content in (before, after) if content is not None]
    if not all(_is_text(content) for content in texts):
        return [*lines, f"# binary file, {_size(change.size_before)} -> {_size(change.size_after)}"]
    old_lines = (before or b"").decode("utf-8").splitlines(keepends=True)
    new_lines = (after or b"").decode("utf-8").splitlines(keepends=True)
    if not old_lines or not new_lines:  # all added or all removed: no need to compare
        sign, only = ("+", new_lines) if new_lines else ("-", old_lines)
        span = f"-0,0 +1,{len(only)}" if sign == "+" else f"-1,{len(only)} +0,0"
        hunk = [f"@@ {span} @@", *(sign + line for line in only)]
    else:
        hunk = list(difflib.unified_diff(old_lines, new_lines, lineterm="", n=3))[2:]  # without its ---/+++ lines
    body, escaped = [], False
    for raw in hunk:
        if raw.startswith("@@"):
            body.append(raw)
            continue
        text = raw.removesuffix("\n")
        seen = _shown_line(text)
        escaped = escaped or seen != text
        body.append(seen if raw.endswith("\n") else f"{seen}\n\\ No newline at end of file")
    if escaped:
        lines.append("# this file holds control or bidi characters: shown escaped below (\\u202e, \\x1b, ...)")
    return lines + body


def _header(change: Change) -> str:
    what = f"{change.action} {change.kind} {shown(change.path)}"
    if change.action is Action.MODIFIED and change.mode_before != change.mode_after:
        return f"{what} (mode {_mode(change.mode_before)} -> {_mode(change.mode_after)})"
    if change.action is Action.ADDED:
        return f"{what} (mode {_mode(change.mode_after)})"
    return what


def render_patch(changes: ChangeSet) -> str:
    """The whole change set as a unified diff with comment lines (`# ...`) for what a diff cannot show."""
    lines: list[str] = []
    if changes.too_large is not None:
        lines.append(f"# too large: over {changes.too_large}; nothing of this change set applies (listed so far below)")
    for change in changes.changes:
        lines.append(f"# {_header(change)}")
        if change.kind is Kind.FILE and (change.content is not None or change.action is Action.DELETED):
            same = change.sha256_before == change.sha256_after
            if not same:
                lines.extend(_file_diff(change))
    for refused in changes.refused:
        lines.append(f"# refused: {shown(refused.path)} ({refused.why}): not applied")
    return "\n".join(lines) + ("\n" if lines else "")


def summarize(changes: ChangeSet, max_names: int = 10) -> str:
    """Counts and the first `max_names` paths, escaped: for a prompt that must be short."""
    counts = {action: sum(1 for c in changes.changes if c.action is action) for action in Action}
    head = ", ".join(f"{counts[action]} {action}" for action in Action)
    parts = [f"{head}; {len(changes.refused)} refused; {changes.content_bytes:,} bytes to write"]
    if changes.too_large is not None:
        parts.append(f"too large (over {changes.too_large}): nothing applies")
    named = [f"{c.action} {shown(c.path)}" for c in changes.changes]
    named += [f"refused {shown(r.path)} ({r.why})" for r in changes.refused]
    if named:
        more = len(named) - max_names
        parts.append("; ".join(named[:max_names]) + (f"; and {more} more" if more > 0 else ""))
    return ". ".join(parts)


def write_patch(changes: ChangeSet, artifacts: Path) -> Path:
    """Write `changes.patch` into the run's artifacts folder (created by the gateway); returns its path."""
    target = artifacts / "changes.patch"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(render_patch(changes))
    return target
