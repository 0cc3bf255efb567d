"""sandbox/reachable.py on real folders: the first component the run's uid cannot pass, and why."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.backends.identity import DEFAULT_POOL
from sandbox.reachable import Access, Need, first_unreachable, run_access

RUN = Access(61000, 61000)


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder everyone can search, outside pytest's 0700 temp folder."""
    folder = Path(tempfile.mkdtemp(prefix="mcp-gw-reach-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def folder(path: Path, mode: int, uid: int | None = None, gid: int | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    if uid is not None or gid is not None:
        os.chown(path, -1 if uid is None else uid, -1 if gid is None else gid)
    return path


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], Path]
    """Makes the layout under the base folder; returns the path to check."""
    need: Need
    who: Access
    blocked: str | None
    """The component reported, relative to the base ('' for none), or None when reachable."""
    why: str = ""
    fix: str = ""


def _inside_0700(base: Path) -> Path:
    return folder(folder(base / "home", 0o700) / "ws", 0o755)


def _unreadable_target(base: Path) -> Path:
    return folder(folder(base / "outer", 0o711) / "ws", 0o700)


def _open_chain(base: Path) -> Path:
    return folder(folder(base / "a", 0o755) / "b", 0o755)


def _owned_by_run(base: Path) -> Path:
    return folder(base / "mine", 0o700, uid=61000)


def _group_of_run(base: Path) -> Path:
    return folder(base / "shared", 0o070, gid=61000)


def _group_bits_win(base: Path) -> Path:
    # The run's gid owns it: the group's bits (none) decide, not the others' (rwx).
    return folder(base / "grouped", 0o707, gid=61000)


def _supplementary_group(base: Path) -> Path:
    return folder(base / "team", 0o750, gid=5000)


def _not_executable(base: Path) -> Path:
    path = base / "python"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o644)
    return path


def _executable(base: Path) -> Path:
    path = base / "python"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _missing(base: Path) -> Path:
    return base / "gone" / "ws"


def _link_into_0700(base: Path) -> Path:
    target = folder(folder(base / "hidden", 0o700) / "venv", 0o755)
    (base / "link").symlink_to(target)
    return base / "link"


CASES = {
    "a folder on the way is 0700, owned by root": Case(
        _inside_0700, Need.READ, RUN, "home", "is 0700, owned by root: the run's uid 61000 cannot search it", "o+x"
    ),
    "the folder itself is 0700": Case(
        _unreadable_target, Need.READ, RUN, "outer/ws", "cannot read and search it", "o+rx"
    ),
    "every folder open": Case(_open_chain, Need.READ, RUN, None),
    "0700 but the run's uid owns it": Case(_owned_by_run, Need.READ, RUN, None),
    "0070 and the run's gid owns it": Case(_group_of_run, Need.READ, RUN, None),
    "the group's bits decide over the others'": Case(
        _group_bits_win, Need.READ, RUN, "grouped", "cannot read", "chmod g+rx"
    ),
    "a supplementary group": Case(_supplementary_group, Need.READ, Access(61000, 61000, frozenset({5000})), None),
    "a supplementary group the run lacks": Case(_supplementary_group, Need.READ, RUN, "team", "cannot read"),
    "an interpreter without x": Case(_not_executable, Need.SEARCH, RUN, "python", "cannot execute it", "o+x"),
    "an executable interpreter": Case(_executable, Need.SEARCH, RUN, None),
    "missing": Case(_missing, Need.READ, RUN, "gone", "does not exist"),
    "a link into a 0700 folder": Case(_link_into_0700, Need.READ, RUN, "hidden", "cannot search it"),
}
CHOWNS = {
    "0700 but the run's uid owns it",
    "0070 and the run's gid owns it",
    "the group's bits decide over the others'",
}
CHOWNS |= {"a supplementary group", "a supplementary group the run lacks"}


@pytest.mark.parametrize("name", list(CASES))
def test_first_unreachable_component(name: str, base: Path) -> None:
    if name in CHOWNS and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    case = CASES[name]
    path = case.build(base)
    found = first_unreachable(path, case.who, case.need)
    if case.blocked is None:
        assert found is None
        return
    assert found is not None
    assert found.path == path
    assert found.component == base / case.blocked
    assert str(base / case.blocked) in found.why and case.why in found.why
    assert case.fix in found.fix and str(found.component) in found.fix


def test_a_path_without_links_is_walked_as_written_only(base: Path) -> None:
    """resolve=False (pinned paths): the link's target folder is not walked; the path as written is."""
    path = _link_into_0700(base)
    assert first_unreachable(path, RUN, resolve=False) is None
    assert first_unreachable(path, RUN) is not None


def test_the_run_is_a_pool_uid_with_no_groups_when_the_host_drops_to_one() -> None:
    assert run_access(True) == Access(DEFAULT_POOL.start, DEFAULT_POOL.start, frozenset())
    assert run_access(False) == Access(os.getuid(), os.getgid(), frozenset(os.getgroups()))
