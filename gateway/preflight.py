"""Preflight (decision 54): every path a run needs is reachable by the run's identity, before the budget.

A run executes this gateway's interpreter as an unprivileged pool uid with no groups
(sandbox/backends/identity.py), reads the standard library and the venv's site-packages, and reads
the workspace and each `sandbox.allowed_paths` entry. A folder on the way that the run cannot
search (a venv under `/root`, a workspace in a 0700 home) used to surface as an empty
`sandbox_start_failed` after consent and a budget attempt, or as pytest's own confusing error.
`check_run_paths` refuses such a call at its own stage, before the budget and consent, naming
the path, the first component the run cannot pass and the fix; `serve` logs and `policy check`
prints the same findings for the whole policy (`unreachable_run_paths`).

The interpreter's paths are checked once per process (they are this process's own and cannot
move while it runs; about 70 µs of stats); the call's workspace and allowed paths are checked at
each call (pinned, so no link to resolve: a few µs per folder). The check reads permission bits
only: sandbox/reachable.py says what it assumes.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gateway.errors import Reason, SandboxViolationError
from gateway.policy import Policy
from sandbox.reachable import Access, Need, Unreachable, first_unreachable

OPERATIONS_DOC = "docs/operations.md"


@dataclass(frozen=True, slots=True)
class RunPath:
    """A path a run needs, what it needs on it, and what the operator calls it."""

    label: str
    path: Path
    need: Need


@dataclass(frozen=True, slots=True)
class Finding:
    """A run path the run's identity cannot reach."""

    what: RunPath
    blocked: Unreachable
    who: Access

    def message(self) -> str:
        return (
            f"the run ({self.who.describe()}) cannot reach {self.what.label} {self.what.path}: "
            f"{self.blocked.why}; fix: {self.fix()}"
        )

    def fix(self) -> str:
        if self.what.label == "the interpreter" or self.what.label.startswith("the interpreter's"):
            return f"{self.blocked.fix}, or use a venv the run can reach, e.g. under /opt; see {OPERATIONS_DOC}"
        return f"{self.blocked.fix}, or move it where the run can reach it; see {OPERATIONS_DOC}"


def interpreter_paths() -> tuple[RunPath, ...]:
    """The interpreter the run executes (`sys.executable`, as run_pytest's argv names it) and what it imports."""
    paths = sysconfig.get_paths()
    found = [RunPath("the interpreter", Path(sys.executable), Need.SEARCH)]
    for key, label in (("stdlib", "standard library"), ("purelib", "site-packages"), ("platlib", "site-packages")):
        found.append(RunPath(f"the interpreter's {label}", Path(paths[key]), Need.READ))
    return tuple(dict.fromkeys(found))


@cache
def _interpreter_findings(who: Access) -> tuple[Finding, ...]:
    return _findings(interpreter_paths(), who, resolve=True)


def _findings(paths: tuple[RunPath, ...], who: Access, *, resolve: bool) -> tuple[Finding, ...]:
    found = []
    for run_path in paths:
        blocked = first_unreachable(run_path.path, who, run_path.need, resolve=resolve)
        if blocked is not None:
            found.append(Finding(run_path, blocked, who))
    return tuple(found)


def unreachable_run_paths(policy: Policy, who: Access) -> list[Finding]:
    """Every path of the policy a run would need and `who` cannot reach (for `serve` and `policy check`)."""
    if not policy.sandbox.enabled:
        return []  # no run ever starts: stage 7 refuses every write tool
    paths = tuple(RunPath(f"workspace {name!r}", root, Need.READ) for name, root in policy.workspaces.items())
    paths += tuple(RunPath("sandbox.allowed_paths entry", path, Need.READ) for path in policy.sandbox.allowed_paths)
    declared = [d.program for d in policy.declared.values()]
    executed = [p.real for p in (*declared, *(p.interpreter for p in declared)) if p is not None]
    programs = tuple(_programs(dict.fromkeys(executed)))  # once each, however many tools share one
    return [*_interpreter_findings(who), *_findings(paths + programs, who, resolve=True)]


def _programs(paths: Iterable[Path]) -> Iterator[RunPath]:
    """A declared tool's program (and a script's interpreter): executed, and a script read, by the run."""
    for path in paths:
        yield RunPath("the declared program", path, Need.READ | Need.SEARCH)


def check_run_paths(
    workspace: tuple[str, Path], allowed_paths: tuple[Path, ...], who: Access, programs: tuple[Path, ...] = ()
) -> None:
    """The preflight stage: raise -32006 `run_path_unreachable` for the first path of the call the run cannot reach.

    `workspace` and `allowed_paths` are the call's pinned folders (no link in any component);
    `programs`, a declared tool's program and interpreter, as they resolved at load.
    """
    name, root = workspace
    paths: tuple[RunPath, ...] = (RunPath(f"workspace {name!r}", root, Need.READ),)
    paths += tuple(RunPath("sandbox.allowed_paths entry", path, Need.READ) for path in allowed_paths)
    paths += tuple(_programs(programs))
    found = (*_interpreter_findings(who), *_findings(paths, who, resolve=False))
    if found:
        raise SandboxViolationError(Reason.RUN_PATH_UNREACHABLE, found[0].message())
