"""Runs a command confined and limited, and reports how it ended (docs/security-model.md, "The sandbox").

This package never imports `gateway`: limits come in as values, outcomes go out as values.
"""

from sandbox.limits import Limits
from sandbox.runner import RUN_GRACE_S, RunResult, probe_host, run_sandboxed, run_unsafe_unconfined

__all__ = ["RUN_GRACE_S", "Limits", "RunResult", "probe_host", "run_sandboxed", "run_unsafe_unconfined"]
