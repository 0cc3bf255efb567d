"""A change review as a person reads it (docs/consent.md, "The change review"; decision 81): the
question's text, and what the terminal approver and the console show of a run's change set.

A `workspace: review` run leaves two files in its artifacts folder, written by the gateway but
holding text the run chose (file names, file contents): `changes.json` (the entries, their sizes,
modes and hashes, the refused ones with why) and `changes.patch` (sandbox/patch.py). Both are read
here, bounded (`read_artifact`: never more than asked into memory, the whole file hashed in
chunks), through the run's folder opened without following a link, and only when they are regular
files. `changes.json` is checked field by field; anything else (a file missing, a link, a FIFO, not
JSON, a field of the wrong type) makes the set `Unreadable`, and the question says it cannot be
shown and recommends Deny.

Everything shown goes through `visible` (gateway/visible.py), after `sandbox.patch.shown` already
escaped the names and the lines that hold control or bidi characters. `changes_prompt` is the whole
question at most `limit_chars` long: what is asked, the counts, the names, the refused entries, then
the patch; when anything is left out, the top of the question says so, with the patch's size and
sha256, and recommends Deny unless the person has read the whole patch elsewhere.

`is_change_review` and `review_run_id` are the one place that tells a change review's question
from a call's and finds its run.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.consent.store import PendingRequest, QuestionKind
from gateway.visible import MAX_LINE_CHARS, excerpt, visible

PATCH = "changes.patch"
DOCUMENT = "changes.json"

MAX_DOCUMENT_BYTES = 4 << 20
"""changes.json at most: 1,000 entries (the default cap) take about 400 KiB."""
MAX_WHOLE_BYTES = 64 << 20
"""What the approver's `v` and the console's route show of changes.patch at most; past it, the rest
is named, and the approver's Allow stays locked."""
MAX_HASHED_BYTES = 256 << 20
"""A changes.patch longer than this is not hashed and not shown: the set is `Unreadable` (deny)."""
MAX_NAMES = 50
"""Changed and refused paths named in a question; past it, a count (all of them are in changes.json)."""
_CHUNK = 1 << 20
_ACTIONS = ("added", "modified", "deleted")
_KINDS = ("file", "folder")
_TOO_LARGE = (None, "max_change_files", "max_change_bytes")
_NOT_SHOWN = {None: None, "binary": "binary", "earlier_content_not_read": "earlier content not read"}
"""changes.json's `not_shown` values, and how a person reads them."""


class UnreadableError(Exception):
    """The change set cannot be shown: `why` says which file and what is wrong with it (no content of it)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class ShownChange:
    """One entry of changes.json, its path escaped again for a person (`visible`)."""

    path: str
    action: str
    kind: str
    size_before: int | None
    size_after: int | None
    mode_before: int | None
    mode_after: int | None
    not_shown: str | None = None
    """Why part of its content is in no view of the set (sandbox/patch.py `NotShown`), None when all is."""


@dataclass(frozen=True, slots=True)
class ShownRefusal:
    path: str
    why: str


@dataclass(frozen=True, slots=True)
class ChangeSetView:
    changes: tuple[ShownChange, ...]
    refused: tuple[ShownRefusal, ...]
    too_large: str | None
    content_bytes: int


@dataclass(frozen=True, slots=True)
class PatchView:
    """The start of changes.patch (or all of it), escaped, with what a notice needs about the whole."""

    text: str
    """`visible`, newlines kept (unless not `escaped`); at most the bytes asked for, decoded."""
    complete: bool
    """`text` is the whole file."""
    size: int
    """The whole file, in bytes."""
    sha256: str
    """Of the whole file's bytes."""
    escaped: bool = True
    """False: `text` is as the run wrote it, and whoever shows a line escapes it (`visible`)."""

    @property
    def digest(self) -> str:
        return self.sha256[:16]


@dataclass(frozen=True, slots=True)
class ReviewText:
    text: str
    cut: bool
    """Part of the change set is not in `text`: Allow must not be the default, nor given unseen."""
    unreadable: bool = False
    """The set cannot be shown at all: Deny once is the only answer a front end offers."""


# --- which questions are change reviews ---------------------------------------------------------


def is_change_review(question: PendingRequest) -> bool:
    """Whether a question asks to apply a run's change set rather than to run a call (decision 80),
    with a run id that can name a folder of the artifacts."""
    return question.kind == QuestionKind.CHANGE_REVIEW and review_run_id(question) is not None


def review_run_id(question: PendingRequest) -> str | None:
    """The run whose artifacts folder holds the change set; None when it is not a plain name."""
    run_id = question.run_id
    if not isinstance(run_id, str) or not run_id or run_id in (".", "..") or not run_id.isprintable():
        return None
    if "/" in run_id or "\\" in run_id or not run_id.isascii():
        return None
    return run_id


def review_dir(artifacts_dir: Path, question: PendingRequest) -> Path | None:
    """The question's run folder under `artifacts_dir`, or None for a question that is not a change review."""
    run_id = review_run_id(question) if is_change_review(question) else None
    return None if run_id is None else artifacts_dir / run_id


# --- reading, bounded ---------------------------------------------------------------------------


def read_artifact(run_dir: Path, name: str, max_bytes: int) -> tuple[bytes, int, str]:
    """At most `max_bytes` of `run_dir/name`, the file's size and the sha256 of all of it.

    Neither the folder nor the file is followed if it is a link (O_NOFOLLOW), a FIFO does not block
    the open (O_NONBLOCK), and only a regular file is read. Raises UnreadableError."""
    try:
        folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UnreadableError(f"the run's folder cannot be opened ({exc.strerror})") from exc
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError as exc:
        raise UnreadableError(f"{name} cannot be opened ({exc.strerror})") from exc
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableError(f"{name} is not a regular file")
        if info.st_size > MAX_HASHED_BYTES:
            raise UnreadableError(f"{name} is {info.st_size:,} bytes, more than can be shown")
        digest = hashlib.sha256()
        kept = bytearray()
        size = 0
        while size <= MAX_HASHED_BYTES:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            if len(kept) < max_bytes:
                kept += chunk[: max_bytes - len(kept)]
            size += len(chunk)
        if size > MAX_HASHED_BYTES:
            raise UnreadableError(f"{name} grew past {MAX_HASHED_BYTES:,} bytes while it was read")
    except OSError as exc:
        raise UnreadableError(f"{name} cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    return bytes(kept), size, digest.hexdigest()


def load_change_set(run_dir: Path) -> ChangeSetView:
    """changes.json, checked field by field. Raises UnreadableError."""
    data, size, _ = read_artifact(run_dir, DOCUMENT, MAX_DOCUMENT_BYTES)
    if size > MAX_DOCUMENT_BYTES:
        raise UnreadableError(f"{DOCUMENT} is {size:,} bytes, more than {MAX_DOCUMENT_BYTES:,}")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UnreadableError(f"{DOCUMENT} is not valid JSON") from exc
    if not isinstance(document, dict):
        raise UnreadableError(f"{DOCUMENT} is not an object")
    changes, refused = document.get("changes"), document.get("refused")
    if not isinstance(changes, list) or not isinstance(refused, list):
        raise UnreadableError(f"{DOCUMENT}: changes and refused must be lists")
    too_large = document.get("too_large")
    content_bytes = document.get("content_bytes")
    if too_large not in _TOO_LARGE or not isinstance(content_bytes, int) or not _is_count(content_bytes):
        raise UnreadableError(f"{DOCUMENT}: too_large or content_bytes is not of its form")
    return ChangeSetView(
        tuple(_change(entry) for entry in changes),
        tuple(_refusal(entry) for entry in refused),
        too_large,
        content_bytes,
    )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise UnreadableError(f"{DOCUMENT}: an entry's {key} is not a string")
    return visible(value)


def _number(entry: dict[str, Any], key: str) -> int | None:
    value = entry.get(key)
    if value is not None and not _is_count(value):
        raise UnreadableError(f"{DOCUMENT}: an entry's {key} is not a count")
    return value


def _change(entry: object) -> ShownChange:
    if not isinstance(entry, dict):
        raise UnreadableError(f"{DOCUMENT}: a change is not an object")
    action, kind, missing = entry.get("action"), entry.get("kind"), entry.get("not_shown")
    if action not in _ACTIONS or kind not in _KINDS:
        raise UnreadableError(f"{DOCUMENT}: a change's action or kind is not one of its values")
    if not (missing is None or (isinstance(missing, str) and missing in _NOT_SHOWN)):
        raise UnreadableError(f"{DOCUMENT}: a change's not_shown is not one of its values")
    return ShownChange(
        _text(entry, "path"),
        action,
        kind,
        _number(entry, "size_before"),
        _number(entry, "size_after"),
        _number(entry, "mode_before"),
        _number(entry, "mode_after"),
        missing,
    )


def _refusal(entry: object) -> ShownRefusal:
    if not isinstance(entry, dict):
        raise UnreadableError(f"{DOCUMENT}: a refused entry is not an object")
    return ShownRefusal(_text(entry, "path"), _text(entry, "why"))


def load_patch(run_dir: Path, max_bytes: int, *, escaped: bool = True) -> PatchView:
    """The first `max_bytes` of changes.patch (all of it when shorter), escaped; `escaped=False` for a
    reader that escapes each line it shows itself (the approver's pager: 16 MiB of hostile lines
    take about 1.8 s to escape at once). Raises UnreadableError."""
    data, size, sha256 = read_artifact(run_dir, PATCH, max_bytes)
    complete = len(data) == size
    # A cut may split a character: the decoder keeps an incomplete tail back instead of inventing one.
    text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=complete)
    return PatchView(visible(text, lines=True) if escaped else text, complete, size, sha256, escaped)


@dataclass(frozen=True, slots=True)
class Review:
    """A change review's set and the start of its patch, or why they cannot be shown (then: deny only)."""

    view: ChangeSetView | None
    patch: PatchView | None
    why: str | None = None


def load_review(run_dir: Path | None, max_patch_bytes: int) -> Review:
    """Both artifacts of a change review (the patch's first `max_patch_bytes`), or why not."""
    if run_dir is None:
        return Review(None, None, "the question names no run")
    try:
        return Review(load_change_set(run_dir), load_patch(run_dir, max_patch_bytes))
    except UnreadableError as exc:
        return Review(None, None, exc.why)


# --- the words ----------------------------------------------------------------------------------


def _size(value: int | None) -> str:
    return "none" if value is None else f"{value:,} bytes"


def _mode(value: int | None) -> str:
    return "none" if value is None else f"{value:04o}"


def change_line(change: ShownChange) -> str:
    """`modified file src/a.py (1,200 bytes -> 1,250 bytes; mode 0644 -> 0755)`."""
    what = f"{change.action} {change.kind} {change.path}"
    notes: list[str] = []
    if change.kind == "file":
        if change.action == "added":
            notes.append(_size(change.size_after))
        elif change.action == "deleted":
            notes.append(_size(change.size_before))
        else:
            notes.append(f"{_size(change.size_before)} -> {_size(change.size_after)}")
    if change.action == "modified" and change.mode_before != change.mode_after:
        notes.append(f"mode {_mode(change.mode_before)} -> {_mode(change.mode_after)}")
    elif change.action == "added":
        notes.append(f"mode {_mode(change.mode_after)}")
    if change.not_shown is not None:
        notes.append(f"\u26a0 NOT SHOWN: {_NOT_SHOWN[change.not_shown]}")
    return f"{what} ({'; '.join(notes)})"


def refusal_line(refused: ShownRefusal) -> str:
    return f"refused {refused.path} ({refused.why}): never applied"


def counts_line(view: ChangeSetView) -> str:
    counts = ", ".join(f"{sum(1 for c in view.changes if c.action == a)} {a}" for a in _ACTIONS)
    line = f"{counts}; {len(view.refused)} refused; {view.content_bytes:,} bytes to write"
    if view.too_large is not None:
        line += f"; too large (over {view.too_large}): nothing of it applies"
    return line


def _asked(tool: str) -> list[str]:
    return [
        f"Apply these changes of {visible(tool)} to the workspace?",
        "Allow once applies every change below; Deny once applies nothing (the patch stays in the run's"
        " artifacts as changes.patch).",
    ]


def _cut_notice(patch: PatchView) -> list[str]:
    return [
        f"\u26a0 NOT SHOWN WHOLE: this question shows only the start of the change set (changes.patch:"
        f" {patch.size:,} bytes, sha256 {patch.digest}\u2026).",
        "\u26a0 Deny unless you have read the whole patch elsewhere: `mcp-gateway approvals` ([v]), the"
        " console's approvals page, or changes.patch in the run's artifacts.",
    ]


def unshown_notice(view: ChangeSetView) -> list[str]:
    """The lines that say, at the top of a question, that part of the set's content is in no view of it
    (binary, or an earlier content not read): a cut no pager can undo. Empty when everything is shown."""
    missing = [c.not_shown for c in view.changes if c.not_shown is not None]
    if not missing:
        return []
    kinds = "; ".join(f"{_NOT_SHOWN[why]}: {missing.count(why)}" for why in dict.fromkeys(missing))
    return [
        f"\u26a0 NOT SHOWN WHOLE: part of the content of {len(missing)} changed file(s) is shown nowhere ({kinds};"
        " marked NOT SHOWN below).",
        "\u26a0 Deny unless you know what those files hold: no channel shows it.",
    ]


def unreadable_text(tool: str, why: str) -> str:
    return "\n".join(
        [
            *_asked(tool)[:1],
            f"\u26a0 The change set cannot be shown: {visible(why)}.",
            "\u26a0 Deny: allowing would apply changes nobody has seen. Nothing is applied on Deny.",
        ]
    )


def names_lines(view: ChangeSetView, max_names: int = MAX_NAMES) -> tuple[list[str], bool]:
    """The changed and refused entries, one a line, at most `max_names`; True when some are left out."""
    named = [change_line(c) for c in view.changes] + [refusal_line(r) for r in view.refused]
    if len(named) <= max_names:
        return named, False
    hidden = len(named) - max_names
    return [*named[:max_names], f"[\u2702 CUT: {hidden} more entries of {len(named)}; all are in changes.json]"], True


def review_text(run_dir: Path, tool: str, limit_chars: int) -> ReviewText:
    """The whole review question, at most `limit_chars` characters, and whether anything was left out."""
    try:
        view = load_change_set(run_dir)
        # Enough bytes for `limit_chars` characters of patch (escaping only lengthens it), never the whole file.
        patch = load_patch(run_dir, max(0, limit_chars) * 4 + 4)
    except UnreadableError as exc:
        return ReviewText(unreadable_text(tool, exc.why)[: max(0, limit_chars)], True, unreadable=True)
    names, cut = names_lines(view)
    body = [*names, f"changes.patch ({patch.size:,} bytes, sha256 {patch.digest}\u2026):"]
    patch_lines = patch.text.split("\n")
    if patch_lines and patch_lines[-1] == "" and patch.complete:
        patch_lines.pop()
    cut = cut or not patch.complete
    body += [f"  {line}" for line in patch_lines]
    unshown = unshown_notice(view)
    fixed = [*_asked(tool)[:1], *unshown, *_asked(tool)[1:], counts_line(view)]
    kept, cut = _fit(fixed, body, patch, limit_chars, cut)
    head = [*fixed[:1], *(_cut_notice(patch) if cut else []), *fixed[1:]]
    text = "\n".join([*head, *kept])
    return ReviewText(text[: max(0, limit_chars)], cut or bool(unshown) or len(text) > limit_chars)


def _fit(fixed: list[str], body: list[str], patch: PatchView, limit_chars: int, cut: bool) -> tuple[list[str], bool]:
    """The lines of `body` that fit after the head, each at most MAX_LINE_CHARS; when anything is left
    out, room is made for the cut notice at the top and a last line saying what was cut."""
    lines = [_line_cut(line) for line in body]
    cut = cut or lines != body
    fixed_chars = sum(len(line) + 1 for line in fixed)
    if not cut and fixed_chars + sum(len(line) + 1 for line in lines) <= limit_chars:
        return lines, False
    room = limit_chars - fixed_chars - sum(len(line) + 1 for line in _cut_notice(patch)) - _MARKER_ROOM
    kept: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        if used + len(line) + 1 > room:
            return [*kept, _cut_lines(len(lines) - index, patch)], True
        kept.append(line)
        used += len(line) + 1
    if not patch.complete:
        kept.append(f"[\u2702 CUT: the rest of changes.patch is not shown here; {patch.size:,} bytes in all]")
    return kept, True


_MARKER_ROOM = 120
"""Characters kept for the line that says what was cut."""


def _line_cut(line: str) -> str:
    """`line`, cut loudly past MAX_LINE_CHARS (`visible.excerpt`: never inside an escape)."""
    return line if len(line) <= MAX_LINE_CHARS else excerpt(line, _COPY, max_lines=1).text


_COPY = {
    "cut_line": "[\u2702 CUT: {hidden} more characters of this line's {total}]",
    "cut_lines": "[\u2702 CUT: {hidden} more lines of {total}]",
}


def _cut_lines(hidden: int, patch: PatchView) -> str:
    whole = "" if patch.complete else ", and the rest of changes.patch"
    return f"[\u2702 CUT: {hidden} more lines{whole}; {patch.size:,} bytes in all]"


def changes_prompt(run_dir: Path, tool: str, limit_chars: int) -> str:
    """The text of the review question for the client's dialog, a round trip or a stored question:
    what is asked, the counts, the names, the refused entries with why, then the patch, at most
    `limit_chars` characters; a cut is announced at the top with a recommendation to deny."""
    return review_text(run_dir, tool, limit_chars).text
