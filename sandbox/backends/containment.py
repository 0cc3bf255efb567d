"""The last sweep: SIGKILL every process of a run's uid until none is left (docs/security-model.md, layer 12).

A double-fork + `setsid` grandchild leaves the process group and the process tree, so
`killpg` and psutil's recursive child kill miss it. Its uid does not change (no_new_privs, no
capabilities), and the uid belongs to this run alone (`identity.UidPool`), so "every process
of the uid" is exactly "every process of the run". A cgroup or a PID namespace catches the same
survivors atomically; this sweep is the backstop that needs neither. Any pid it returns after
the runner's own kill is a containment miss worth logging.

Each round re-reads the process table, because a survivor may fork while it is being killed;
RLIMIT_NPROC bounds how many it can make. Zombies are already dead and are skipped.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import TYPE_CHECKING

from sandbox.backends.identity import MIN_RUN_UID

if TYPE_CHECKING:
    import psutil

MAX_ROUNDS = 50
_FIRST_PAUSE_S = 0.001
_MAX_PAUSE_S = 0.05


def sweep(uid: int, *, max_rounds: int = MAX_ROUNDS) -> list[int]:
    """Kill every live process whose real, effective or saved uid is `uid`; return the pids killed.

    Returns when a round finds nothing or after `max_rounds`; a uid that still has a process
    afterwards shows up in `identity.live_uids()` and so is not handed out again.
    """
    if uid < MIN_RUN_UID:
        raise ValueError("refusing to sweep a system uid (< 1000)")
    import psutil  # noqa: PLC0415  (loaded at the first sweep, see owned_by)

    killed: list[int] = []
    pause = _FIRST_PAUSE_S
    for _ in range(max_rounds):
        survivors = owned_by(uid)
        if not survivors:
            break
        for proc in survivors:
            # psutil re-checks the pid's create time before signalling: a reused pid is left alone.
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.send_signal(signal.SIGKILL)
                killed.append(proc.pid)
        time.sleep(pause)  # SIGKILL is delivered asynchronously; let the round take effect
        pause = min(pause * 2, _MAX_PAUSE_S)
    return sorted(set(killed))


def owned_by(uid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes with `uid` as real, effective or saved uid."""
    # psutil loads at the first sweep, not with the sandbox: about 10 ms of CPU at every start of a gateway,
    # which may never sweep (a run with a cgroup, or a rootless one, does not; decision 109).
    import psutil  # noqa: PLC0415

    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["uids", "status"]):
        uids = proc.info["uids"]
        if uids is None or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if uid in uids:
            found.append(proc)
    return found
