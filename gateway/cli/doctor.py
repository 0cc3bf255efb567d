"""`mcp-gateway doctor`: what this host gives a run, as the user the gateway runs as (docs/security-model.md, "Guarantees").

It probes each layer with a throwaway child (sandbox.probe_host: the runner's own steps), maps
them to the guarantees a policy can require (sandbox/guarantees.py), and for each guarantee
prints the layers keeping it, or why none does and the exact fix (sandbox/diagnose.py). It also
checks what preflight checks at a call: the interpreter, its standard library and site-packages,
each workspace and allowed path, reachable by the run's identity. Exit 0 when every guarantee
the policy requires holds and every path is reachable, 1 otherwise: a CI gate.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from typing import Any

from gateway.policy import Policy
from gateway.preflight import Finding, unreachable_run_paths
from sandbox.confine import LayerReport
from sandbox.diagnose import HostFacts, Line, diagnose, userns_blocker
from sandbox.guarantees import MEANING
from sandbox.reachable import run_access

_LANDLOCK_NOTES = (
    (3, "Landlock ABI < 3: truncate() of a readable file is not refused (the workspace is still read-only by mount or grant)"),
    (4, "Landlock ABI < 4: TCP is not refused by Landlock (the network namespace and seccomp still refuse it)"),
    (6, "Landlock ABI < 6: no signal or abstract-socket scope (the PID and network namespaces still close them)"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Diagnosis:
    facts: HostFacts
    report: LayerReport
    policy: Policy
    lines: list[Line]
    paths: list[Finding]

    @property
    def ok(self) -> bool:
        return all(line.holds or not line.required for line in self.lines) and not self.paths

    @property
    def mode(self) -> str:
        if self.report.uid_drop and not self.report.user_namespace:
            return "root: a pool uid per run (61000-61999), namespaces made as root"
        if self.report.uid_drop:
            return "root without CAP_SYS_ADMIN: a pool uid per run, then a user namespace of its own"
        if self.report.user_namespace:
            return "rootless: a user namespace per run (the run's kernel uid is the gateway's)"
        return "none: not root, and no user namespace"

    def notes(self) -> list[str]:
        out = [text for abi, text in _LANDLOCK_NOTES if 0 < self.report.landlock < abi]
        blocker = userns_blocker(self.facts)
        if blocker is not None and self.report.uid_drop and not self.report.user_namespace:
            out.append(f"{blocker[0]}: as an ordinary user this host would confine nothing; fix: {blocker[1]}")
        return out


def run_doctor(policy: Policy, report: LayerReport, facts: HostFacts) -> Diagnosis:
    sandbox = policy.sandbox
    lines = diagnose(report, sandbox.backend, sandbox.required, facts)
    return Diagnosis(facts, report, policy, lines, unreachable_run_paths(policy, run_access(report.uid_drop)))


def as_text(d: Diagnosis) -> str:
    sandbox = d.policy.sandbox
    out = [
        f"user: uid {d.facts.euid}{' (root)' if d.facts.root else ''}, CAP_SYS_ADMIN {_yes(d.facts.sys_admin)}, "
        f"CAP_SETUID {_yes(d.facts.set_uid)}",
        f"kernel: {d.facts.kernel} {platform.machine()}, Landlock ABI {d.report.landlock}, "
        f"cgroup v1 {_yes(d.facts.cgroup_v1)}, cgroup2 {_yes(d.facts.cgroup2_mounted)}, bubblewrap {_yes(d.facts.bwrap_installed)}"
        + (f"; run groups on cgroup v{d.report.cgroup_version}" if d.report.cgroup else ""),
        f"mode: {d.mode}",
        f"policy: {d.policy.source} (backend {sandbox.backend}; requires {', '.join(sorted(sandbox.required))})",
        "",
    ]
    for line in d.lines:
        need = "required" if line.required else "optional"
        if line.holds:
            out.append(f"  ok       {line.guarantee:<18} {need:<9} by {'; and by '.join(line.options)}")
        else:
            flag = "MISSING" if line.required else "missing"
            out.append(f"  {flag:<8} {line.guarantee:<18} {need:<9} {line.why}")
            out.append(f"  {'':<8} {'':<18} {'':<9} fix: {line.fix}")
    for finding in d.paths:
        out.append(f"  MISSING  path: {finding.message()}")
    out += [f"  note: {note}" for note in d.notes()]
    missing = [str(line.guarantee) for line in d.lines if line.required and not line.holds]
    if d.ok:
        out.append("\nresult: ok, every guarantee the policy requires holds here")
    else:
        what = ", ".join(missing + ([f"{len(d.paths)} unreachable path(s)"] if d.paths else []))
        out.append(f"\nresult: NOT OK ({what}): write tools would be refused (-32006)")
    return "\n".join(out)


def as_json(d: Diagnosis) -> str:
    document: dict[str, Any] = {
        "ok": d.ok,
        "user": {
            "uid": d.facts.euid,
            "root": d.facts.root,
            "cap_sys_admin": d.facts.sys_admin,
            "cap_setuid": d.facts.set_uid,
        },
        "host": {
            "kernel": d.facts.kernel,
            "machine": platform.machine(),
            "landlock_abi": d.report.landlock,
            "cgroup_v1": d.facts.cgroup_v1,
            "cgroup2": d.facts.cgroup2_mounted,
            "run_groups": f"v{d.report.cgroup_version}" if d.report.cgroup else None,
            "bubblewrap": d.facts.bwrap_installed,
            "sysctls": dict(d.facts.sysctls),
        },
        "mode": d.mode,
        "rootless": d.report.rootless,
        "layers": sorted(d.report.available()),
        "policy": {"source": str(d.policy.source), "backend": d.policy.sandbox.backend},
        "guarantees": [
            {
                "name": str(line.guarantee),
                "meaning": MEANING[line.guarantee],
                "required": line.required,
                "holds": line.holds,
                "layers": list(line.layers),
                **({} if line.holds else {"why": line.why, "fix": line.fix}),
            }
            for line in d.lines
        ],
        "paths": [
            {
                "what": f.what.label,
                "path": str(f.what.path),
                "blocked_at": str(f.blocked.component),
                "why": f.blocked.why,
                "fix": f.fix(),
            }
            for f in d.paths
        ],
        "notes": d.notes(),
    }
    return json.dumps(document, indent=2)


def _yes(value: bool) -> str:
    return "yes" if value else "no"
