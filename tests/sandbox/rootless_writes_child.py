"""Run one writing command the way a rootless gateway does, as whoever runs this script, and apply its change set.

The tests run as root and start this script under `setpriv` as an ordinary uid (as
rootless_child.py is started): the runner then takes the rootless path, where the run's child makes
the copy's tmpfs in its own user namespace and the gateway fills it. Prints the outcome as JSON.
Usage: python rootless_writes_child.py CODE WORKSPACE SCRATCH BACKEND [MAX_COPY_FILES]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

from sandbox import Limits, probe_host, run_sandboxed
from sandbox.apply import apply_changes
from sandbox.change_set import ChangeRules
from sandbox.errors import SandboxStartError
from sandbox.limits import BACKENDS
from sandbox.pinned import pin


def main() -> None:
    code, workspace, scratch, backend = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    if backend not in BACKENDS:
        raise SystemExit(f"unknown backend {backend}")
    limits = Limits(
        timeout_s=30,
        memory_limit_mb=256,
        max_processes=32,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(scratch)},
        scratch_bytes=8 << 20,
        backend="native" if backend == "native" else "bubblewrap",
    )
    rules = ChangeRules(max_copy_files=int(sys.argv[5])) if len(sys.argv) > 5 else ChangeRules()
    pinned = pin(workspace)
    outcome: dict[str, object] = {"rootless": probe_host().rootless}
    try:
        result = anyio.run(
            lambda: run_sandboxed(
                [sys.executable, "-I", "-c", code],
                pinned,
                limits,
                scratch.parent / "out",
                scratch.parent / "err",
                scratch=scratch,
                writes=rules,
            )
        )
    except SandboxStartError as exc:
        print(json.dumps(outcome | {"start_error": exc.reason}))
        return
    changes = result.changes
    outcome |= {
        "exit_code": result.exit_code,
        "stdout": (scratch.parent / "out").read_text(),
        "stderr": (scratch.parent / "err").read_text(),
        "changes_error": result.changes_error,
        "changes": None if changes is None else [[c.path, c.action] for c in changes.changes],
        "refused": None if changes is None else [[r.path, r.why] for r in changes.refused],
        "too_large": None if changes is None else changes.too_large,
    }
    if changes is not None:
        applied = apply_changes(pinned.fd, changes)
        outcome |= {"applied": applied.applied, "reason": applied.reason}
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
