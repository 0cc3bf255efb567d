"""Trying a layer's real step in a throwaway child: the probes behind `sandbox.probe_host()` (docs/security-model.md, "Which layers are active")."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence

PROBE_TIMEOUT_S = 10


def child_succeeds(argv: Sequence[str], preexec: Callable[[], None], env: Mapping[str, str] | None = None) -> bool:
    """Whether `argv` exits 0 when started with `preexec` (the step under test) in its child.

    Probes run at start-up, before the server has threads, so `preexec_fn` is safe here.
    """
    try:
        completed = subprocess.run(
            argv,
            preexec_fn=preexec,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return completed.returncode == 0
