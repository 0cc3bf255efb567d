"""TEST_TIME_SCALE's parser (tests/deadlines.py), in process: each value read as the suite reads it.

That pytest stops with a usage error (no traceback) on a value that is no positive factor, and that
the factor multiplies each test's timeout, are tests/e2e/test_suite_checks.py (nested pytest runs).
"""

from __future__ import annotations

import pytest

from tests.deadlines import SCALE_VARIABLE, scaled, time_scale


@pytest.mark.parametrize(
    ("raw", "scale"), [(None, 1.0), ("", 1.0), ("  ", 1.0), ("1", 1.0), ("4", 4.0), (" 2.5 ", 2.5)]
)
def test_a_positive_factor_or_none_is_the_scale(monkeypatch: pytest.MonkeyPatch, raw: str | None, scale: float) -> None:
    if raw is None:
        monkeypatch.delenv(SCALE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(SCALE_VARIABLE, raw)
    assert time_scale() == scale
    assert scaled(10) == 10 * scale


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "inf", "nan", "-inf", "1e400"])
def test_a_value_that_is_no_positive_factor_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(SCALE_VARIABLE, raw)
    with pytest.raises(pytest.UsageError) as refused:
        time_scale()
    assert str(refused.value) == f"TEST_TIME_SCALE={raw!r}: give a positive factor, e.g. TEST_TIME_SCALE=3"
