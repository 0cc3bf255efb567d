"""What every sandboxed tool shares (docs/architecture.md, "Where a new tool plugs in"): one confined run and how it ended.

`run_confined` spawns one argv in the sandbox for a call (the scrubbed environment, a scratch
folder held for the run, the limits, progress while it runs, stdout.txt and stderr.txt in the
run's folder); `ConfinedRun` is the part of a `ToolRun` (gateway/tools/base.py) that depends on
the sandbox alone: SANDBOX_EXEC's detail, the refusal for a limit, evidence.json. run_pytest
and the declared tools add their own answer on top.
"""

from __future__ import annotations

import json
import socket
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Self

from anyio.abc import TaskGroup

from gateway.errors import GatewayError, Reason, SandboxViolationError, ToolTimeoutError
from gateway.policy import SandboxPolicy
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.proxy import Asker, ConnectionLog, ProxyLimits, proxy_starter
from gateway.tools.base import ExecutionRequest, Governance, Written
from sandbox import Limits, RunResult, guarantees, run_sandboxed
from sandbox.change_set import ChangeRules
from sandbox.confine import LayerReport
from sandbox.layers import Layer
from sandbox.leftovers import scratch_folder
from sandbox.pinned import Pinned
from sandbox.runner import KilledBy
from sandbox.task_groups import task_group

_NEVER_PASSED = ("PYTHON", "PYTEST_", "LD_")
MIB = 1024 * 1024


def sandbox_environment(policy: SandboxPolicy, scratch: Path, environ: Mapping[str, str]) -> dict[str, str]:
    env = {
        name: environ[name]
        for name in policy.env_whitelist
        if name in environ and not name.startswith(_NEVER_PASSED) and not name.startswith("MCP_GATEWAY")
    }
    env.update(
        {
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
    )
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


def shown(text: str) -> str:
    """Run-chosen text as the caller gets it: control and format characters written out as escapes."""
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text)


def refusal_for(result: RunResult, timeout_s: float, policy: SandboxPolicy) -> GatewayError | None:
    """The error a run that the sandbox had to stop answers with (stage 9: docs/error-codes.md, -32006 and -32007)."""
    if result.killed_by is KilledBy.TIMEOUT:
        return ToolTimeoutError(Reason.TIMEOUT, f"killed after {timeout_s:g} s")
    if result.killed_by is KilledBy.OUTPUT:
        return SandboxViolationError(Reason.OUTPUT_LIMIT, f"output over {policy.max_output_bytes} bytes")
    if result.killed_by is KilledBy.MEMORY:
        return SandboxViolationError(
            Reason.MEMORY_LIMIT, f"the run went over {policy.memory_limit_mb} MiB and was stopped"
        )
    return None


def sandbox_summary(result: RunResult) -> dict[str, Any]:
    """How the run ended, for SANDBOX_EXEC and evidence.json."""
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "duration_ms": result.duration_ms,
        "killed_by": None if result.killed_by is None else str(result.killed_by),
        "peak_memory_kb": result.peak_memory_kb,
        "stdout_bytes": result.stdout_bytes,
        "stderr_bytes": result.stderr_bytes,
        "truncated": result.truncated,
        "oom_kills": result.oom_kills,
        "forks_refused": result.forks_refused,
        "survivors_killed": result.survivors_killed,
        "layers": list(result.layers),
    }


def write_evidence(run_dir: Path, governance: Governance, limits: Limits, result: RunResult, host: LayerReport) -> None:
    evidence = {
        "governance": asdict(governance),
        "sandbox": {
            "limits": {
                "timeout_s": limits.timeout_s,
                "memory_limit_mb": limits.memory_limit_mb,
                "max_processes": limits.max_processes,
                "max_output_bytes": limits.max_output_bytes,
                "network": limits.network,
                "env": sorted(limits.env),
                "scratch_bytes": limits.scratch_bytes,
            },
            "confinement": {
                "backend": limits.backend,
                "landlock_abi": host.landlock,
                "rootless": Layer.USER_NAMESPACE in result.layers,
                "required": sorted(limits.required),
                "guarantees": {str(g): list(layers) for g, layers in guarantees.held(frozenset(result.layers)).items()},
            },
            **sandbox_summary(result),
        },
    }
    (run_dir / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@dataclass(frozen=True, slots=True)
class ConfinedRun:
    """How one sandboxed run ended, from the sandbox alone: the part of a ToolRun every sandboxed tool shares."""

    result: RunResult
    limits: Limits
    run_id: str
    run_dir: Path
    policy: SandboxPolicy
    host: LayerReport
    review: bool | None = None
    """A writing run: True when a person decides on its changes, False when they apply at once; None: it read only."""

    @property
    def duration_ms(self) -> int:
        return self.result.duration_ms

    @property
    def exit_code(self) -> int | None:
        return self.result.exit_code

    @property
    def stopped(self) -> bool:
        return self.result.killed_by is not None

    @property
    def outcome_in_memory(self) -> bool:
        return False  # its answer is in files the run wrote: parsed on a worker thread

    def sandbox_detail(self) -> Mapping[str, Any]:
        return sandbox_summary(self.result)

    def refusal(self) -> GatewayError | None:
        return refusal_for(self.result, self.limits.timeout_s, self.policy)

    def written(self) -> Written | None:
        if self.review is None:
            return None
        return Written(self.review, self.result.changes, self.result.changes_error)

    def write_evidence(self, governance: Governance) -> None:
        write_evidence(self.run_dir, governance, self.limits, self.result, self.host)

    @classmethod
    def of(cls, run: ConfinedRun) -> Self:
        """A tool's own run (a subclass that adds its answer) of this one."""
        return cls(run.result, run.limits, run.run_id, run.run_dir, run.policy, run.host, run.review)


@dataclass(frozen=True, slots=True)
class Confinement:
    """Where and how a call's run is confined: from its ExecutionRequest (gateway/tools/base.py)."""

    run_id: str
    root: Pinned
    policy: SandboxPolicy
    timeout_s: int
    run_dir: Path
    environ: Mapping[str, str]
    host: LayerReport
    allowed_paths: tuple[Pinned, ...] = ()
    hidden: tuple[Path, ...] = ()
    progress: CallProgress = NO_PROGRESS
    connections: ConnectionLog | None = None
    ask_host: Asker | None = None


def confinement(request: ExecutionRequest) -> Confinement:
    return Confinement(
        run_id=request.run_id,
        root=request.root,
        policy=request.policy,
        timeout_s=request.timeout_s,
        run_dir=request.run_dir,
        environ=request.environ,
        host=request.host,
        allowed_paths=request.allowed_paths,
        hidden=request.hidden,
        progress=request.progress,
        connections=request.connections,
        ask_host=request.ask_host,
    )


def _on_proxy(c: Confinement, group: TaskGroup) -> Callable[[socket.socket], None] | None:
    """With `sandbox.network` a mapping, the run's listener served by the egress proxy (decision 90) in `group`."""
    if c.policy.egress is None:
        return None
    record = c.connections.add if c.connections is not None else ConnectionLog().add
    return proxy_starter(
        group,
        c.policy.egress,
        ProxyLimits(max_bytes=c.policy.max_network_bytes),
        record,
        key="sandbox.network",
        ask=c.ask_host,
        opened=c.connections.opened if c.connections is not None else None,
    )


async def run_confined(
    c: Confinement,
    argv: Callable[[Path], list[str]],
    *,
    describe: Callable[[], str],
    collect: Mapping[str, Path] = MappingProxyType({}),
    on_stdout: Callable[[bytes], None] | None = None,
    writes: ChangeRules | None = None,
    review: bool = False,
) -> ConfinedRun:
    """Run `argv(scratch)` for one call; nothing the run produced is read here.

    `root` and `allowed_paths` are the folders pinned at policy load (stage 4 found them intact):
    the sandbox reaches them through their fds, so a path swapped since then leads the run nowhere
    new. While the run is on, `progress` sends `describe()` to the caller. With `writes`, the run
    works on a copy of the workspace and its change set comes back for the pipeline to apply or
    put to a person (`review`): decision 80.
    """
    c.run_dir.mkdir(parents=True, exist_ok=False, mode=0o700)
    with scratch_folder(c.run_id[:8]) as scratch:  # held while the run is on; removed after it
        limits = Limits(
            timeout_s=c.timeout_s,
            memory_limit_mb=c.policy.memory_limit_mb,
            max_processes=c.policy.max_processes,
            max_output_bytes=c.policy.max_output_bytes,
            network=c.policy.network,
            allowed_paths=c.allowed_paths,
            env=sandbox_environment(c.policy, scratch, c.environ),
            scratch_bytes=c.policy.scratch_limit_mb * MIB,
            backend=c.policy.backend,
            require=None if c.policy.require is None else frozenset(c.policy.require),
            hidden=c.hidden,
            proxy=c.policy.egress is not None,
        )
        async with c.progress.waiting(describe), task_group() as proxies:
            result = await run_sandboxed(
                argv(scratch),
                c.root,
                limits,
                c.run_dir / "stdout.txt",
                c.run_dir / "stderr.txt",
                scratch=scratch,
                collect=collect,
                host=c.host,
                on_stdout=on_stdout,
                writes=writes,
                on_proxy=_on_proxy(c, proxies),
            )
            proxies.cancel_scope.cancel()  # the run is over: its proxy and every connection end with it
    return ConfinedRun(result, limits, c.run_id, c.run_dir, c.policy, c.host, None if writes is None else review)
