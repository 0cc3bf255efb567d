"""Another process making and removing `mcp-run-*` folders as fast as it can (decision 68).

`python -m tests.scratch_churn <folder> <seconds> [uid]`: churns in `folder` for at most `seconds`
(or until killed), as `uid` when given (root drops to it first), and prints how many folders it
made. Another local user, or another gateway of the same user, does this to the temp folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path


def churn(parent: Path, seconds: float, present: int = 500) -> int:
    """Keep about `present` folders, removing the oldest and making a new one, over and over: a sweep
    that lists them and then looks at each finds some gone. Returns how many it made."""
    made = 0
    ring = 2 * present
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            shutil.rmtree(parent / f"mcp-run-churn-{made % ring}", ignore_errors=True)
            (parent / f"mcp-run-churn-{(made + present) % ring}").mkdir()
        made += 1
    for index in range(ring):
        shutil.rmtree(parent / f"mcp-run-churn-{index}", ignore_errors=True)
    return made


if __name__ == "__main__":
    if len(sys.argv) > 3:
        uid = int(sys.argv[3])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    print(churn(Path(sys.argv[1]), float(sys.argv[2])), flush=True)
