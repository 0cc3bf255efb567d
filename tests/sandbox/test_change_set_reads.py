"""What reading a change set holds in memory (sandbox/change_set.py, decision 78): a file the run touched at
the same size is hashed in chunks, never read whole, and kept only when it differs and fits the cap. Real
copy in a real tmpfs, measured in a subprocess by its own peak RSS (review 2026-11-27: a 900 MiB file the
run rewrote in place, byte for byte but one, grew the gateway by 1.8 GiB before the cap was checked)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sandbox.confined_child import requires_root

pytestmark = requires_root

ROOT_DIR = Path(__file__).resolve().parents[2]
SIZE_MIB = 64
"""Past the 48 MiB the reading may grow by (held whole once, it grows by 73), four times the default
max_change_bytes, 64 chunks of 1 MiB: what 192 MiB proved, in a third of the CPU (1.7-1.9 -> 0.64 s)."""

_READ = textwrap.dedent(
    """
    import json, os, resource, sys
    from sandbox.backends.view import WorkspaceView
    from sandbox.change_set import ChangeRules, read_changes
    from sandbox.workspace_copy import Owner, copy_workspace

    workspace, how, size = sys.argv[1], sys.argv[2], int(sys.argv[3]) << 20
    with open(os.path.join(workspace, "data.bin"), "wb") as handle:
        handle.truncate(size)  # sparse here; its copy is whole
    ws = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    with WorkspaceView(size + (16 << 20), 1000) as view:
        originals = copy_workspace(ws, view.mount_fd, Owner(0, 0), max_entries=1000, max_bytes=size + 1)
        fd = os.open("data.bin", os.O_WRONLY, dir_fd=view.mount_fd)
        os.pwrite(fd, b"x" if how == "one byte" else b"\\0", size // 2)  # what the run does
        os.close(fd)
        view.freeze()
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        changes = read_changes(view.mount_fd, originals, ChangeRules(), ws)
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) >> 10
    print(json.dumps({"grew_mib": grew, "changes": len(changes.changes), "too_large": changes.too_large}))
    """
)


@pytest.mark.parametrize(("how", "changes", "too_large"), [("touched", 0, None), ("one byte", 0, "max_change_bytes")])
def test_a_same_size_file_is_hashed_in_chunks_never_held_whole(
    tmp_path: Path, how: str, changes: int, too_large: str | None
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(tmp_path), how, str(SIZE_MIB)],
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert (result["changes"], result["too_large"]) == (changes, too_large)
    assert result["grew_mib"] < 48, f"{SIZE_MIB} MiB file: the reading grew by {result['grew_mib']} MiB"
