"""Run one confined command the way a rootless gateway does, as whoever runs this script; print the outcome as JSON.

The tests run as root; an ordinary user's gateway is reproduced by starting this script under
`setpriv` as an ordinary uid: the probe, the plan and the runner then take the rootless path.
Usage: python rootless_child.py CODE WORKSPACE SCRATCH MAX_PROCESSES
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import anyio

from sandbox import Limits, probe_host, run_sandboxed


def main() -> None:
    code, workspace, scratch, processes = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    limits = Limits(
        timeout_s=20,
        memory_limit_mb=256,
        max_processes=processes,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(scratch)},
        scratch_bytes=8 << 20,
    )
    result = anyio.run(
        lambda: run_sandboxed(
            [sys.executable, "-I", "-c", code],
            workspace,
            limits,
            workspace / "out",
            workspace / "err",
            scratch=scratch,
            collect={"kept.txt": workspace / "kept.txt"},
        )
    )
    outcome = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name != "collected"}
    outcome |= {"collected": sorted(result.collected), "rootless": probe_host().rootless}
    outcome["stdout"] = (workspace / "out").read_text()
    outcome["stderr"] = (workspace / "err").read_text()
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
