"""Run one writing command the way a rootless gateway does, as whoever runs this script, and apply its change set.

The tests run as root and start this script under `setpriv` as an ordinary uid (as
rootless_child.py is started): the runner then takes the rootless path, where the run's child makes
the copy's tmpfs in its own user namespace and the gateway fills it. Prints the outcome as JSON.
Usage: python rootless_writes_child.py CODE WORKSPACE SCRATCH BACKEND [MAX_COPY_FILES]

With REWRITE_ON_OUTPUT set to a file of the workspace, that file is rewritten when the run first
prints (its copy made by then): the same size, other bytes, its times set back (decision 82). With
COPY_RACY_NS set, the copy's racy window is that many nanoseconds (ChangeRules.racy_ns), not RACY_NS.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
    if racy_ns := os.environ.get("COPY_RACY_NS"):
        rules = dataclasses.replace(rules, racy_ns=int(racy_ns))
    pinned = pin(workspace)
    outcome: dict[str, object] = {"rootless": probe_host().rootless}
    rewrite = os.environ.get("REWRITE_ON_OUTPUT")
    rewritten: list[str] = []

    def on_stdout(_: bytes) -> None:
        if rewrite and not rewritten:
            target = workspace / rewrite
            before = target.stat()
            content = target.read_bytes()
            target.write_bytes(content.swapcase())
            os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
            rewritten.append(rewrite)

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
                on_stdout=on_stdout,
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
        "sha256_before": None if changes is None else {c.path: c.sha256_before for c in changes.changes},
        "rewritten": rewritten,
    }
    if changes is not None:
        applied = apply_changes(pinned.fd, changes)
        outcome |= {"applied": applied.applied, "reason": applied.reason, "conflicts": list(applied.conflicts)}
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
