"""How far a run's suite is, read from pytest's own progress lines as the run writes them.

run_pytest runs pytest with `-q -o console_output_style=count`: a letter per finished test
(`.` passed, `F` failed, `E` error, `s` skipped, `x`/`X` xfail/xpass), and at the end of each
line the count so far of those collected, `[ 12/40]`. The lines come from the run, so they are
untrusted and serve only what a person reads in a progress message: the count only grows, the
total is the first one seen and a line that disagrees with it is ignored, a line longer than any
progress line stops the reading, and no byte of the output is ever repeated.
"""

from __future__ import annotations

import re
from collections.abc import Callable

COUNT_STYLE = ("-o", "console_output_style=count")
"""pytest options that make its progress lines carry `[done/collected]`."""

_COUNTED_LINE = re.compile(rb"([.FEsxX]*) *\[ *(\d{1,9})/(\d{1,9})\]\s*")
_LETTERS = re.compile(rb"[.FEsxX]*")
_LONGEST_LINE = 1024
"""pytest wraps its progress lines at the terminal's width (80 columns without a terminal)."""


class SuiteProgress:
    """Fed the run's stdout (`feed`), calls `moved` when the count of finished tests grows."""

    def __init__(self, moved: Callable[[], None]) -> None:
        self._moved = moved
        self.done = 0
        self.total: int | None = None
        self._line = bytearray()
        self._counted = 0
        """Tests finished as of the last complete progress line."""
        self._stopped = False

    def feed(self, data: bytes) -> None:
        if self._stopped:
            return
        *complete, rest = (bytes(self._line) + data).split(b"\n")
        before = self.done
        for line in complete:
            self._complete_line(line)
        self._line = bytearray(rest)
        if len(rest) > _LONGEST_LINE:
            self._stopped = True
        elif _LETTERS.fullmatch(rest):
            self._advance(self._counted + len(rest))
        else:  # a count at the end of a line whose newline is still to come
            self._complete_line(rest)
        if self.done > before:
            self._moved()

    def _complete_line(self, line: bytes) -> None:
        counted = _COUNTED_LINE.fullmatch(line)
        if counted is None:
            return  # a summary, a warning, anything else
        done, total = int(counted[2]), int(counted[3])
        if done > total or (self.total is not None and total != self.total):
            return
        self.total = total
        self._counted = max(self._counted, done)
        self._advance(done)

    def _advance(self, done: int) -> None:
        if self.total is not None:
            done = min(done, self.total)
        self.done = max(self.done, done)

    def describe(self) -> str:
        if self.total is not None:
            return f"Running the tests in the sandbox: {self.done} of {self.total} done"
        if self.done:
            return f"Running the tests in the sandbox: {self.done} done"
        return "Running the tests in the sandbox: starting"
