"""`mcp-gateway demo` (what `make demo` runs) as root and as an ordinary user: the sample suite passes through the gateway.

The demo drives a real `serve` over stdio with the MCP SDK's client. As an ordinary user the
runs are rootless (decision 57): the audit trail it prints shows the layers the run got.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.harness import REPO, enterable_by_everyone

USER_UID = 64073
"""An ordinary uid with no account (CI machines are fresh): not root, not a pool uid."""


def demo(home: Path, as_uid: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    command = [sys.executable, "-m", "gateway", "--home", str(home / "state"), "demo"]
    if as_uid is not None:
        command = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=180, check=False, cwd=REPO)


@pytest.mark.parametrize("as_uid", [None, USER_UID], ids=["root", "ordinary-user"])
def test_the_demo_runs_the_sample_suite_through_the_gateway(as_uid: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="mcp-demo-") as folder:
        home = Path(folder)
        enterable_by_everyone(home)
        if as_uid is not None:
            os.chown(home, as_uid, as_uid)
        done = demo(home, as_uid)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finished = re.search(
        r"TOOL_FINISHED\s+run=\w+ user=alice \{[^}]*\"passed\": 8, \"skipped\": 1, \"status\": \"ok\"", done.stdout
    )
    assert finished, done.stdout[-3000:]
    exec_line = next(line for line in done.stdout.splitlines() if "SANDBOX_EXEC" in line)
    if as_uid is None:
        assert '"uid_drop"' in exec_line and '"user_namespace"' not in exec_line and '"cgroup"' in exec_line
    else:
        assert '"user_namespace"' in exec_line and '"uid_drop"' not in exec_line
        assert all(
            f'"{layer}"' in exec_line
            for layer in ("network_namespace", "scratch_tmpfs", "landlock", "seccomp", "pid_namespace")
        )
    assert re.search(r"audit verify: ok \(\d+ events\)", done.stdout)
    removed = re.search(r"removed the demo's state folder (\S+) ", done.stdout)
    assert removed, done.stdout[-500:]
    assert not Path(removed.group(1)).exists(), "the demo cleans up after itself"
