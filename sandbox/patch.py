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
from enum import StrEnum
from pathlib import Path

from sandbox.change_set import Action, Change, ChangeSet, is_text
from sandbox.workspace_copy import Kind

_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
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


def _size(value: int | None) -> str:
    return f"{value or 0:,} bytes"


def _mode(value: int | None) -> str:
    return f"{value or 0:04o}"


DIFF_MAX_FILE_LINES = 100_000
"""A version with more lines is not compared (nor split into lines): the file is shown whole."""
DIFF_MAX_LINES = 2000
"""Past the lines both versions share at their start and end, at most this many lines a side are compared."""
DIFF_MAX_CELLS = 2_000_000
"""What one set may compare in all: the sum, over the files compared, of the earlier lines x the new lines
left once the lines both share at their start and end are set aside. difflib's cost grows with that product
and more (1,000 files of 199 popular lines: 0.7 us of CPU a cell on this machine); past the budget a file is
shown whole, its earlier content as removed and its new as added."""
_CHUNK_CHARS = 1 << 20
_SHOWN_AS_IS = b"\t\n" + bytes(range(0x20, 0x7F))
"""A tab, a newline and printable ASCII: a chunk of nothing else is shown as it is (`_as_is`)."""
_MIRRORED = {"insert": "delete", "delete": "insert"}


class NotShown(StrEnum):
    """Why part of a file's content is in no view of the set (changes.json `not_shown`): a person asked to
    apply it is told so at the top of the question, and deny is recommended (decision 81)."""

    BINARY = "binary"
    """Its new or earlier content is not text: sizes and hashes only."""
    EARLIER_NOT_READ = "earlier_content_not_read"
    """Its earlier content was not read for the patch (past its budget, or no longer as the run began):
    the new content is shown whole, or, for a deletion, nothing of what goes."""


def _text(content: bytes | None) -> str | None:
    return content.decode("utf-8") if content is not None and is_text(content) else None


def not_shown(change: Change) -> NotShown | None:
    """What of a file's change the patch cannot show (None: all of it, or a folder, or a mode alone)."""
    if change.kind is not Kind.FILE or change.sha256_before == change.sha256_after:
        return None
    texts = [] if change.action is Action.DELETED else [change.content]
    texts += [] if change.action is Action.ADDED else [change.content_before]
    if any(content is not None and not is_text(content) for content in texts):
        return NotShown.BINARY
    if change.action is not Action.ADDED and change.content_before is None:
        return NotShown.EARLIER_NOT_READ
    return None


def _lines(text: str) -> int:
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)


class _Budget:
    """The comparisons left to a set (DIFF_MAX_CELLS), spent file by file."""

    def __init__(self, cells: int = DIFF_MAX_CELLS) -> None:
        self.cells = cells

    def spend(self, old: int, new: int) -> bool:
        """Whether `old` lines may be compared with `new` lines, the budget spent if so."""
        if max(old, new) > DIFF_MAX_LINES or old * new > self.cells:
            return False
        self.cells -= old * new
        return True


def _file_diff(change: Change, budget: _Budget) -> list[str]:
    name = shown(change.path)
    old = "/dev/null" if change.action is Action.ADDED else f"a/{name}"
    new = "/dev/null" if change.action is Action.DELETED else f"b/{name}"
    lines = [f"--- {old}", f"+++ {new}"]
    sizes = f"{_size(change.size_before)} -> {_size(change.size_after)}"
    missing = not_shown(change)
    before = None if change.action is Action.ADDED else _text(change.content_before)
    after = None if change.action is Action.DELETED else _text(change.content)
    if missing is NotShown.BINARY and after is None:
        return [*lines, f"# binary file, {sizes}"]
    if missing is not None:  # the new content is text, what it replaces is not shown: the new content whole
        why = "is binary" if missing is NotShown.BINARY else "was not read for this patch"
        if change.sha256_before is None and missing is not NotShown.BINARY:  # decision 82: its identity moved
            why = "changed in the workspace since the copy was made, so applying it would conflict"
        if change.action is Action.DELETED:
            return [*lines, f"# deleted file, {sizes}; NOT SHOWN: its content {why}"]
        note = f"# NOT SHOWN: its earlier content ({_size(change.size_before)}) {why}; its new content whole:"
        return [*lines, note, *_hunk("", after or "")]
    compared = _compared(before, after, budget) if before and after else None
    if compared is not None:
        return [*lines, *compared]
    if before and after:
        note = f"# {_lines(before):,} lines -> {_lines(after):,} lines, too many to compare: shown whole, removed then added"
        return [*lines, note, *_hunk(before, after)]
    return [*lines, *_hunk(before or "", after or "")]


def _span(start: int, count: int) -> str:
    """A hunk's range: `start` (0-based) and its length, as unified diffs write them."""
    if count == 1:
        return f"{start + 1}"
    return f"{start + 1 if count else start},{count}"


def _hunk(before: str, after: str) -> list[str]:
    """`before` all removed and `after` all added as one hunk (either may be empty), in linear time and
    memory: lines are looked at one by one only in the chunks that need escaping."""
    old, new = _lines(before), _lines(after)
    if not old and not new:
        return []
    head = f"@@ -{_span(0, old)} +{_span(0, new)} @@"
    removed, escaped_old = _whole("-", before)
    added, escaped_new = _whole("+", after)
    note = ["# this file holds control or bidi characters: shown escaped below (\\u202e, \\x1b, ...)"]
    return [*(note if escaped_old or escaped_new else []), head, *removed, *added]


def _whole(sign: str, text: str) -> tuple[list[str], bool]:
    """Every line of `text` behind `sign`, in pieces of many lines each; True when any was escaped."""
    pieces: list[str] = []
    escaped = False
    start = 0
    while start < len(text):
        cut = text.find("\n", start + _CHUNK_CHARS)
        end = len(text) if cut < 0 else cut + 1
        body = text[start:end].removesuffix("\n")
        start = end
        if _as_is(body):
            pieces.append(sign + body.replace("\n", "\n" + sign))
            continue
        raw = body.split("\n")
        seen = [_shown_line(line) for line in raw]
        escaped = escaped or seen != raw
        pieces.append("\n".join(sign + line for line in seen))
    if text and not text.endswith("\n"):
        pieces.append("\\ No newline at end of file")
    return pieces, escaped


def _as_is(body: str) -> bool:
    """Whether `body` holds only `_SHOWN_AS_IS`: what is left once bytes.translate deletes them, in C, three
    times faster than a search for anything else (1.1 against 3.1-3.7 ms a MiB)."""
    return body.isascii() and not body.encode("ascii").translate(None, _SHOWN_AS_IS)


class _Mirrored(difflib.SequenceMatcher[str]):
    """difflib's matcher given the longer version second and its opcodes read back the other way round:
    its popular-line heuristic (autojunk) looks only at the second sequence, and only from 200 lines, so
    2,000 lines of `0`/`1` against 199 of `0`/`1`/`2` took 1.4 s of CPU one way and 10 ms this way."""

    def get_opcodes(self) -> list[tuple[str, int, int, int, int]]:  # type: ignore[override]  # tags as str
        return [(_MIRRORED.get(tag, tag), j1, j2, i1, i2) for tag, i1, i2, j1, j2 in super().get_opcodes()]


def _split(text: str) -> list[str]:
    """`text`'s lines, each with its newline (other line breaks are shown escaped within a line)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _compared(before: str, after: str, budget: _Budget) -> list[str] | None:
    """A unified diff of the two versions (3 lines of context), or None when over `budget`."""
    if max(_lines(before), _lines(after)) > DIFF_MAX_FILE_LINES:
        return None
    old_lines, new_lines = _split(before), _split(after)
    shorter = min(len(old_lines), len(new_lines))
    head = 0
    while head < shorter and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while tail < shorter - head and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    if not budget.spend(len(old_lines) - head - tail, len(new_lines) - head - tail):
        return None
    # What both share at the start and end is not compared; 3 lines of it are kept as context.
    start, kept_tail = max(0, head - 3), max(0, tail - 3)
    old_part, new_part = old_lines[start : len(old_lines) - kept_tail], new_lines[start : len(new_lines) - kept_tail]
    if len(old_part) > len(new_part):
        matcher: difflib.SequenceMatcher[str] = _Mirrored(None, new_part, old_part)
    else:
        matcher = difflib.SequenceMatcher(None, old_part, new_part)
    hunk: list[str] = []
    for group in matcher.get_grouped_opcodes(3):
        (_, i1, _, j1, _), (_, _, i2, _, j2) = group[0], group[-1]
        hunk.append(f"@@ -{_span(start + i1, i2 - i1)} +{_span(start + j1, j2 - j1)} @@")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                hunk += (" " + line for line in old_part[a1:a2])
                continue
            if tag in ("replace", "delete"):
                hunk += ("-" + line for line in old_part[a1:a2])
            if tag in ("replace", "insert"):
                hunk += ("+" + line for line in new_part[b1:b2])
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
        body.insert(0, "# this file holds control or bidi characters: shown escaped below (\\u202e, \\x1b, ...)")
    return body


def _header(change: Change) -> str:
    what = f"{change.action} {change.kind} {shown(change.path)}"
    if change.action is Action.MODIFIED and change.mode_before != change.mode_after:
        return f"{what} (mode {_mode(change.mode_before)} -> {_mode(change.mode_after)})"
    if change.action is Action.ADDED:
        return f"{what} (mode {_mode(change.mode_after)})"
    return what


def render_patch(changes: ChangeSet) -> str:
    """The whole change set as a unified diff with comment lines (`# ...`) for what a diff cannot show.

    A set over a cap is listed by name only: it is refused whole, and its content is neither compared
    nor shown (what the walk read of it is at most the cap plus one file)."""
    lines: list[str] = []
    if changes.too_large is not None:
        lines.append(
            f"# too large: over {changes.too_large}; nothing of this change set applies"
            " (listed so far below, without content)"
        )
    budget = _Budget()
    for change in changes.changes:
        lines.append(f"# {_header(change)}")
        content = change.content is not None or change.action is Action.DELETED
        changed = change.kind is Kind.FILE and content and change.sha256_before != change.sha256_after
        if changed and changes.too_large is None:
            lines.extend(_file_diff(change, budget))
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
