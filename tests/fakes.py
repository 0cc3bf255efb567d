"""Fakes handed to the gateway's stages in unit tests, instead of patching globals."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.clock import RunId
from sandbox.confine import LayerReport

T0 = 1_700_000_000.0
"""A fixed epoch second the fakes start from (2023-11-14T22:13:20Z)."""


class FakeClock:
    """A Clock that only moves when told to."""

    def __init__(self, start: float = T0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = when


class SequentialRunIds:
    """An IdFactory giving 32-hex-digit ids in order: ...0001, ...0002, ..."""

    def __init__(self) -> None:
        self._counter: Iterator[int] = itertools.count(1)

    def __call__(self) -> RunId:
        return RunId(f"{next(self._counter):032x}")


FAKE_HOST = LayerReport(
    uid_drop=True,
    cgroup=True,
    network_namespace=True,
    scratch_tmpfs=True,
    rlimits=True,
    landlock=6,
    seccomp=True,
    mount_tree=True,
    pid_namespace=True,
    ipc_namespace=True,
)
"""A host with every layer of every backend: stage 7 passes without probing the machine the tests run on."""


class PressedKeys:
    """Key presses for the terminal approver (gateway/approvals.py `Keys`), from a list; then the end of input."""

    def __init__(self, *keys: str) -> None:
        self.keys = list(keys)

    @contextmanager
    def reading(self) -> Iterator[PressedKeys]:
        yield self

    def read(self, timeout_s: float) -> str | None:
        return self.keys.pop(0) if self.keys else ""
