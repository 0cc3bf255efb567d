"""One knob for every deadline of the suite's own waits: TEST_TIME_SCALE (a factor, 1 when unset).

The heavy fixtures wait for readiness (the console answers, each gateway of the fleet answers
`initialize`, the guest's agent connects), never for a fixed time; their deadlines only bound a
wait that failed. On a busy machine (other suites, a loaded CI host) the same waits take several
times longer, so every such deadline and pytest-timeout's limit of every test is multiplied by
TEST_TIME_SCALE: `TEST_TIME_SCALE=3 make test` on a host whose load is three times its cores.
"""

from __future__ import annotations

import os

import pytest

SCALE_VARIABLE = "TEST_TIME_SCALE"


def time_scale() -> float:
    """The factor TEST_TIME_SCALE sets (1 when unset); a value that is no positive number is a usage error."""
    raw = os.environ.get(SCALE_VARIABLE, "").strip()
    if not raw:
        return 1.0
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not scale > 0 or scale == float("inf"):
        raise pytest.UsageError(f"{SCALE_VARIABLE}={raw!r}: give a positive factor, e.g. {SCALE_VARIABLE}=3")
    return scale


def scaled(seconds: float) -> float:
    """`seconds` of a deadline, times TEST_TIME_SCALE."""
    return seconds * time_scale()
