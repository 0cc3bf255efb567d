"""The scratch layer on its own: a size- and inode-bounded tmpfs in a private mount namespace, read back by fd."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends import identity
from sandbox.backends.identity import RunIdentity
from sandbox.backends.rlimits import MIB
from sandbox.backends.scratch import ScratchSpace, files_for, scratch_available
from tests.sandbox.confined_child import leased_identity, requires_root, run_python, shared_dir

pytestmark = requires_root

FILL = """
import errno, json, os, sys
folder, what = sys.argv[1], sys.argv[2]
out = {"owner": os.stat(folder).st_uid, "mode": oct(os.stat(folder).st_mode & 0o777)}
written = made = 0
try:
    if what == "bytes":
        with open(os.path.join(folder, "fill"), "wb") as handle:
            for _ in range(64):
                handle.write(b"z" * (1 << 20))
                handle.flush()
                written += 1 << 20
    else:
        for index in range(5000):
            open(os.path.join(folder, "f%d" % index), "w").close()
            made += 1
except OSError as exc:
    out["errno"] = exc.errno
out["written"], out["made"] = written, made
print(json.dumps(out))
"""


@pytest.fixture
def who() -> Iterator[RunIdentity]:
    with leased_identity() as leased:
        yield leased


def host_mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def run_in(space: ScratchSpace, who: RunIdentity, code: str, *args: str) -> dict[str, object]:
    def preexec() -> None:
        space.apply()
        identity.drop_privileges(who.uid, who.gid)

    done = run_python(code, preexec, str(space.target), *args)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_the_scratch_layer_is_available_here() -> None:
    assert scratch_available()


@pytest.mark.parametrize(("size_mib", "files"), [(1, 32), (16, 512), (256, 8192), (1024, 32768)])
def test_the_inode_count_follows_the_size(size_mib: int, files: int) -> None:
    assert files_for(size_mib * MIB) == files


def test_the_size_bounds_what_the_run_writes(who: RunIdentity) -> None:
    with shared_dir() as folder, ScratchSpace(folder, 8 * MIB, 64, who.uid, who.gid) as space:
        found = run_in(space, who, FILL, "bytes")
    assert found["errno"] == errno.ENOSPC
    assert int(str(found["written"])) <= 8 * MIB


def test_the_inode_count_bounds_how_many_files(who: RunIdentity) -> None:
    with shared_dir() as folder, ScratchSpace(folder, 8 * MIB, 64, who.uid, who.gid) as space:
        found = run_in(space, who, FILL, "inodes")
    assert found["errno"] == errno.ENOSPC
    assert int(str(found["made"])) < 64


def test_the_scratch_is_the_run_uids_alone(who: RunIdentity) -> None:
    with shared_dir() as folder, ScratchSpace(folder, 8 * MIB, 64, who.uid, who.gid) as space:
        found = run_in(space, who, FILL, "inodes")
    assert found["owner"] == who.uid and found["mode"] == "0o700"


def test_nothing_is_mounted_on_the_host_and_files_are_read_through_the_fd(who: RunIdentity) -> None:
    write = "import sys; open(sys.argv[1] + '/junit.xml', 'w').write('<testsuites/>'); print('{}')"
    before = host_mounts()
    with shared_dir() as folder, ScratchSpace(folder, 8 * MIB, 64, who.uid, who.gid) as space:
        run_in(space, who, write)
        assert host_mounts() == before, "the child's mount reached the host's namespace"
        assert list(folder.iterdir()) == [], "the host folder under the tmpfs stays empty"
        fd = space.open_file("junit.xml")
        with os.fdopen(fd, "rb") as handle:
            assert handle.read() == b"<testsuites/>"
    assert host_mounts() == before


def test_a_link_the_run_left_is_not_followed(who: RunIdentity) -> None:
    plant = "import os, sys; os.symlink('/etc/shadow', sys.argv[1] + '/junit.xml'); print('{}')"
    with shared_dir() as folder, ScratchSpace(folder, 8 * MIB, 64, who.uid, who.gid) as space:
        run_in(space, who, plant)
        with pytest.raises(OSError, match="Too many levels of symbolic links") as caught:
            space.open_file("junit.xml")
    assert caught.value.errno == errno.ELOOP


@pytest.mark.parametrize("name", ["", ".", "..", "../junit.xml", "a/b"])
def test_only_a_single_name_is_opened(who: RunIdentity, name: str) -> None:
    with (
        shared_dir() as folder,
        ScratchSpace(folder, 8 * MIB, 64, who.uid, who.gid) as space,
        pytest.raises(ValueError, match="one path component"),
    ):
        space.open_file(name)


@pytest.mark.parametrize(("size", "files"), [(MIB - 1, 64), (MIB, 15)])
def test_a_scratch_space_too_small_is_refused(size: int, files: int) -> None:
    with pytest.raises(ValueError, match="at least"):
        ScratchSpace(Path("/nonexistent"), size, files, 61999, 61999)
