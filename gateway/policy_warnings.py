"""What `policy check` warns about (docs/policy.md): settings that are valid but risky.

Each warning names the policy file and says what the setting lets happen; none of them stops the
gateway, whose policy loader (gateway/policy.py) refuses only what is invalid.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gateway.declarations import WorkspaceMode
from gateway.policy import Policy, SandboxPolicy
from gateway.rules.code_runners import program_wide_code_runner
from gateway.scope import is_within
from sandbox.guarantees import DEFAULT_REQUIRED, Guarantee

NO_NETWORK = Guarantee.NO_NETWORK

_SECRET_LIKE = re.compile(r"KEY|TOKEN|SECRET|PASS|CREDENTIAL|AUTH|SESSION|COOKIE|PRIVATE|CERT", re.IGNORECASE)
_NEVER_PASSED = ("PYTHON", "PYTEST_", "LD_", "MCP_GATEWAY")


@dataclass(frozen=True, slots=True)
class PolicyWarning:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: warning: {self.message}"


def _requirement_warnings(sandbox: SandboxPolicy) -> list[str]:
    """Guarantees required by default that the policy waives, and the old `required_layers` form."""
    out = []
    waived = [
        g
        for g in Guarantee
        if g in DEFAULT_REQUIRED and g not in sandbox.required and not (g is NO_NETWORK and sandbox.network)
    ]
    if waived:
        out.append(
            f"sandbox.require leaves out {', '.join(waived)}: on a host that cannot keep it, runs go on without it"
        )
    if sandbox.migrated_layers:
        listed = ", ".join(sandbox.require or ())
        out.append(f"sandbox.required_layers is the old form of sandbox.require; it was read as `require: [{listed}]`: "
                   "write that line in its place")  # fmt: skip
    return out


def _network_warnings(policy: Policy) -> list[str]:
    """`allow: ["*"]` in a `network` mapping: the proxy then refuses only what is not public."""
    egresses = [("sandbox.network", policy.sandbox.egress)]
    egresses += [(f"upstreams.{name}.network", u.egress) for name, u in policy.upstreams.items()]
    return [
        f"{key}.allow has '*': every public host is reachable through the proxy (list the hosts instead)"
        for key, egress in egresses
        if egress is not None and any(p.host == "" for p in egress.allow)
    ]


def risky_settings(policy: Policy, state_home: Path | None) -> list[PolicyWarning]:
    """What `policy check` warns about: valid settings a security reviewer should look at twice."""
    where = str(policy.source)
    out: list[PolicyWarning] = []

    def warn(message: str) -> None:
        out.append(PolicyWarning(where, message))

    sandbox = policy.sandbox
    if not sandbox.enabled:
        warn("sandbox.enabled is false: every write tool (run_pytest) will be refused with -32006")
    if not policy.allowlist:
        warn("tools.allowlist is empty: every tool call will be refused with -32004")
    if sandbox.network:
        warn("sandbox.network is true: sandboxed test suites can reach the network")
    out.extend(PolicyWarning(where, message) for message in _network_warnings(policy))
    home = state_home.resolve() if state_home else None
    for path in sandbox.allowed_paths:
        if not path.exists():
            warn(f"sandbox.allowed_paths contains {path}, which does not exist: every run would fail to start")
        if path == Path("/"):
            warn("sandbox.allowed_paths contains '/': the whole filesystem becomes readable inside the sandbox")
        elif home is not None and (is_within(home, path) or is_within(path, home)):
            warn(f"sandbox.allowed_paths contains {path}, which overlaps the gateway's state folder {home}")
    out.extend(PolicyWarning(where, message) for message in _requirement_warnings(sandbox))
    if sandbox.scratch_limit_mb > sandbox.memory_limit_mb:
        warn("sandbox.scratch_limit_mb is above memory_limit_mb: the scratch's pages count as the run's memory")
    for name in sandbox.env_whitelist:
        prefix = next((p for p in _NEVER_PASSED if name.startswith(p)), None)
        if prefix is not None:
            warn(f"sandbox.env_whitelist names {name}: variables starting with {prefix} are never passed")
        elif _SECRET_LIKE.search(name):
            warn(f"sandbox.env_whitelist names {name}, which looks like a secret; it would reach the tool")
    for name, root in policy.workspaces.items():
        if not root.is_dir():
            warn(f"workspace {name!r} points at {root}, which is not a directory")
        if home is not None and (is_within(home, root) or is_within(root, home)):
            warn(f"workspace {name!r} ({root}) overlaps the gateway's state folder {home}")
    if policy.consent.mode == "prompt" and policy.consent.timeout_s > sandbox.timeout_s * 4:
        warn("consent.timeout_s is long: an unattended prompt holds the agent's call that long")
    hmac = any(a.startswith("HS") for a in policy.auth.algorithms)
    public = any(not a.startswith("HS") for a in policy.auth.algorithms)
    if hmac and public:
        warn("auth.algorithms mixes HMAC and public-key algorithms; each verifies only with its own key")
    if policy.auth.env_token:
        warn("auth.env_token is true: a call without params.auth acts as the user of the server's "
             "MCP_GATEWAY_TOKEN; any process that can start the gateway with that variable acts as that user")  # fmt: skip
    if policy.budget.attempts_total == 0 or policy.budget.elapsed_ms_total == 0:
        warn("a budget total is 0: every write call will be refused with -32005")
    for rule in policy.permission_prompt.allow:
        tool, _, spec = rule.partition("(")
        if tool in _AGENT_WRITERS and (not spec or spec.rstrip(")").strip() in ("*", "**", ":*")):
            warn(f"permission_prompt.allow has {rule!r}: every use of {tool} is allowed without a person")
        runner = program_wide_code_runner(spec.removesuffix(")")) if tool == "Bash" else None
        if runner is not None:
            program, lets_through = runner
            warn(f"permission_prompt.allow has {rule!r}: every argument of {program} is allowed, and it runs, "
                 f"outside any sandbox, {lets_through}; allow exact commands instead")  # fmt: skip
    out.extend(PolicyWarning(where, message) for message in _declared_warnings(policy))
    return out


def _declared_warnings(policy: Policy) -> list[str]:
    """Declared tools whose program (or interpreter) someone else could swap: a folder on its way, or the
    file itself, writable by another user than root and the gateway's own (decision 77: the last window)."""
    out = []
    for name, declared in policy.declared.items():
        for program in (declared.program, declared.program.interpreter):
            if program is None:
                continue
            writable = next((p for p in (program.real, *program.real.parents) if _others_may_write(p)), None)
            if writable is not None:
                out.append(
                    f"tools.declared.{name}: {writable} is writable by others: whoever can write it can replace"
                    f" {program.real} (a replaced program is refused, but not one swapped between the check and exec)"
                )
    if any(d.workspace is not WorkspaceMode.READ_ONLY for d in policy.declared.values()):
        out.append("tools.declared has workspace: review or write: such calls are refused (-32006) in this version")
    return out


def _others_may_write(path: Path) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    sticky = bool(info.st_mode & stat.S_ISVTX) and path.is_dir()  # /tmp: others cannot rename what is not theirs
    by_others = info.st_uid not in (0, os.geteuid()) or (info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky)
    return bool(by_others)


_AGENT_WRITERS = ("Bash", "Edit", "MultiEdit", "Write", "NotebookEdit")
"""Claude Code's tools that change things: a bare allow rule for one of them allows everything."""
