"""What a `sandbox_start_failed` says (docs/error-codes.md): the sandbox's step slug -> what failed and the fix.

The sandbox raises `SandboxStartError(slug)` when a run could not start (sandbox/errors.py); the
slug names the step. The client's message and the gateway's log line say which step failed and
what the operator can do, from this table; `data.step` carries the slug, `data.reason` stays
`sandbox_start_failed`. An unknown slug still names itself: the message is never empty.
docs/error-codes.md lists the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICY_CHECK = "run `mcp-gateway policy check` on this host"
OPERATIONS = "see docs/operations.md"


@dataclass(frozen=True, slots=True)
class StartStep:
    what: str
    fix: str


START_STEPS: dict[str, StartStep] = {
    "uid_pool_exhausted": StartStep(
        "no run uid is free in the pool (61000-61999: each is busy, held by another gateway or has a process left)",
        "wait for runs to end, or end leftover processes of pool uids",
    ),
    "run_uid_privileged": StartStep("the run's uid is below 1000", "report it: the pool must hold only uids >= 1000"),
    "no_new_privs_failed": StartStep(
        "no_new_privs could not be set on the run", f"the kernel or a security module refused it; {OPERATIONS}"
    ),
    "privilege_drop_unverified": StartStep(
        "the drop to the run's uid could not be verified", f"the kernel or a security module interfered; {OPERATIONS}"
    ),
    "privilege_drop_reversible": StartStep(
        "the run could regain root after the uid drop", f"the gateway's capabilities are unusual; {OPERATIONS}"
    ),
    "guarantee_unavailable": StartStep(
        "no layer of this host keeps a guarantee sandbox.require asks for",
        "run `mcp-gateway doctor` (it names the cause and the fix of each), or leave it out of sandbox.require",
    ),
    "bubblewrap_failed": StartStep(
        "bubblewrap could not build the run's mount tree",
        "read the run's stderr.txt (get_artifact_content); check bwrap is installed and may create namespaces",
    ),
    "spawn_failed": StartStep(
        "the interpreter could not be started as the run's uid",
        f"{POLICY_CHECK}: it names the first folder the run cannot reach; "
        f"use a venv the run can reach, e.g. under /opt; {OPERATIONS}",
    ),
    "server_program_not_absolute": StartStep(
        "an upstream server's program was not given as an absolute path (the policy resolves and pins it at load)",
        f"{POLICY_CHECK}: it prints each upstream's resolved program; report it if it shows one",
    ),
    "cgroup_unavailable": StartStep(
        "no cgroup hierarchy with the memory and pids controllers was found",
        "run `mcp-gateway doctor`; or leave memory_total out of sandbox.require",
    ),
    "cgroup_failed": StartStep(
        "the run's cgroup could not be created",
        "check the gateway may create groups under the memory and pids hierarchies",
    ),
    "layer_failed": StartStep(
        "a confinement step failed in the run's process before pytest started",
        f"{POLICY_CHECK}; the gateway's log has the step if the sandbox could name it",
    ),
    "rlimit_not_applied": StartStep("a resource limit could not be applied", f"{POLICY_CHECK}; {OPERATIONS}"),
    "seccomp_no_new_privs_failed": StartStep(
        "no_new_privs, which the seccomp filter needs, could not be set", f"{OPERATIONS}"
    ),
    "seccomp_filter_failed": StartStep(
        "the kernel refused the seccomp filter", "check the kernel has seccomp (CONFIG_SECCOMP_FILTER)"
    ),
    "seccomp_unsupported_platform": StartStep(
        "the seccomp filter exists only for Linux x86_64", "leave syscall_filter out of sandbox.require"
    ),
    "landlock_unavailable": StartStep(
        "the kernel has no Landlock", "boot a kernel with Landlock, or use sandbox.backend: bubblewrap"
    ),
    "landlock_path_unopenable": StartStep(
        "a folder the run is granted (the interpreter's, the workspace, sandbox.allowed_paths) could not be opened",
        f"check those folders still exist; {POLICY_CHECK}",
    ),
    "scratch_root_unsafe": StartStep(
        "the folder that holds the runs' scratch folders (mcp-runs-<uid> in the temp folder) is not safe: "
        "someone else may have made or changed it",
        "remove it (someone else made it; check what it holds first) or give the gateway another TMPDIR; "
        "the gateway makes it anew, mode 0711",
    ),
    "network_proxy": StartStep(
        "the proxy's listener could not be made in the run's network namespace (the detail names the step: "
        "socket, loopback_up, bind, listen, or not_received, and the errno)",
        "run `mcp-gateway doctor` (network_through_proxy needs a network namespace the gateway may configure: "
        "root with CAP_NET_ADMIN, or a user namespace); or set the tool's network to false",
    ),
    "scratch_unavailable": StartStep(
        "the run's scratch tmpfs could not be mounted",
        "run `mcp-gateway doctor`; or leave bounded_scratch out of sandbox.require",
    ),
}


def start_step(slug: str) -> str:
    """The step's name: the slug up to any `:` detail (`layer_unavailable:cgroup` -> `layer_unavailable`)."""
    return slug.partition(":")[0] or "unknown"


def describe_start_failure(slug: str) -> str:
    """One sentence for the client and the log: the step, what failed, the fix."""
    step = start_step(slug)
    detail = slug.partition(":")[2]
    known = START_STEPS.get(step)
    if known is None:
        return f"the sandbox could not start the run (step {step}); {POLICY_CHECK} and report it"
    what = f"{known.what} ({detail})" if detail else known.what
    return f"step {step}: {what}; fix: {known.fix}"


VIEW_STEPS: dict[str, StartStep] = {
    "workspace_view_unavailable": StartStep(
        "no writable copy of the workspace can be made on this host (it needs mount and user namespaces)",
        "run `mcp-gateway doctor`, or declare the tool `workspace: read_only`",
    ),
    "workspace_too_large_for_view": StartStep(
        "the workspace holds more than a writing run's copy may take (1 GiB or 100,000 entries)",
        "point the tool at a smaller workspace, or declare it `workspace: read_only`",
    ),
    "workspace_copy_failed": StartStep(
        "the workspace could not be copied for the run (an entry could not be read as the gateway)",
        "check the gateway can read every file of the workspace, then call again",
    ),
}
"""A writing run's own start failures (decision 78): each is its own `data.reason`, not `sandbox_start_failed`."""


def describe_view_failure(slug: str) -> str | None:
    """The sentence for a writing run's copy that could not be made (VIEW_STEPS); None for any other slug."""
    known = VIEW_STEPS.get(start_step(slug))
    return None if known is None else f"{known.what}; nothing ran; fix: {known.fix}"
