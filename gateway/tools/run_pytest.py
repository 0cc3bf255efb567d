"""`run_pytest` (spec section 5): structured arguments in, pytest's counts and artifacts out.

Only the structured arguments become pytest flags. The command line closes the ways a
workspace could steer pytest from outside its own config: `python -I -B` (no PYTHON*
variables, no user site, no workspace module shadowing pytest, no bytecode written into
the workspace), `--rootdir` and `--confcutdir` at the workspace, `-c` the workspace's own
config file (or /dev/null, so no parent-directory config is read), the cache plugin off
and plugin autoloading disabled; the plugins the policy lists (`sandbox.pytest_plugins`)
are loaded by name with `-p`, and no other.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError, SandboxViolationError, ToolTimeoutError
from gateway.policy import SandboxPolicy
from gateway.tools.outcome import ResourceLink, ToolOutcome
from sandbox import Limits, RunResult, layers, run_sandboxed
from sandbox.runner import MAX_COLLECTED_BYTES, KilledBy

CONFIG_FILES = ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
ARTIFACT_MIME_TYPES = {
    "evidence.json": "application/json",
    "junit.xml": "application/xml",
    "stdout.txt": "text/plain",
    "stderr.txt": "text/plain",
}
ARTIFACT_URI_PREFIX = "mcp-gateway://runs/"


def artifact_uri(run_id: str, name: str) -> str:
    """`resources/read` resolves it through get_artifact_content, with the same checks."""
    return f"{ARTIFACT_URI_PREFIX}{run_id}/{name}"


def parse_artifact_uri(uri: str) -> tuple[str, str] | None:
    if not uri.startswith(ARTIFACT_URI_PREFIX):
        return None
    run_id, _, name = uri[len(ARTIFACT_URI_PREFIX) :].partition("/")
    return (run_id, name) if run_id and name else None


_NEVER_PASSED = ("PYTHON", "PYTEST_", "LD_")
MAX_JUNIT_BYTES = MAX_COLLECTED_BYTES
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Counts:
    passed: int
    failed: int
    errors: int
    skipped: int


@dataclass(frozen=True, slots=True)
class PytestRun:
    result: RunResult
    outcome: ToolOutcome
    limits: Limits


@dataclass(frozen=True, slots=True)
class Governance:
    """evidence.json's `governance`: the user's window totals including this run (spec section 5)."""

    elapsed_ms_total: int
    attempts_total: int
    short_circuited: bool
    policy_timeout_s: int


def pytest_argv(root: Path, arguments: Mapping[str, Any], junit_path: Path, plugins: tuple[str, ...] = ()) -> list[str]:
    config = next((root / name for name in CONFIG_FILES if (root / name).is_file()), Path(os.devnull))
    argv = [
        sys.executable, "-I", "-B", "-m", "pytest",
        f"--rootdir={root}", f"--confcutdir={root}", "-c", str(config),
        "-p", "no:cacheprovider", f"--junitxml={junit_path}", "-q", "-rfE",
    ]  # fmt: skip
    for plugin in plugins:
        argv += ["-p", plugin]
    if "keyword" in arguments:
        argv += ["-k", str(arguments["keyword"])]
    if "markers" in arguments:
        argv += ["-m", str(arguments["markers"])]
    if "max_failures" in arguments:
        argv.append(f"--maxfail={int(arguments['max_failures'])}")
    argv += ["--", str(arguments["test_path"])]
    return argv


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


def parse_junit(path: Path) -> Counts | None:
    """Counts from pytest's junit XML; None when the file is missing, too large or unreadable."""
    try:
        if path.stat().st_size > MAX_JUNIT_BYTES:
            return None
        root = ET.parse(path).getroot()  # noqa: S314  (see the import)
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = failed = errors = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0))
        errors += int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return Counts(max(0, tests - failed - errors - skipped), failed, errors, skipped)


def summary_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def refusal(result: RunResult, timeout_s: float, policy: SandboxPolicy) -> GatewayError | None:
    """The error a run that the sandbox had to stop answers with (spec section 4, stage 9)."""
    if result.killed_by is KilledBy.TIMEOUT:
        return ToolTimeoutError("timeout", f"killed after {timeout_s:g} s")
    if result.killed_by is KilledBy.OUTPUT:
        return SandboxViolationError("output_limit", f"output over {policy.max_output_bytes} bytes")
    if result.killed_by is KilledBy.MEMORY:
        return SandboxViolationError("memory_limit", f"the run went over {policy.memory_limit_mb} MiB and was stopped")
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


async def run(
    *,
    run_id: str,
    root: Path,
    arguments: Mapping[str, Any],
    policy: SandboxPolicy,
    timeout_s: int,
    run_dir: Path,
    environ: Mapping[str, str],
) -> PytestRun:
    """Run pytest for one call; the artifacts are written by the gateway (evidence: `write_evidence`)."""
    run_dir.mkdir(parents=True, exist_ok=False, mode=0o700)
    scratch = Path(tempfile.mkdtemp(prefix=f"mcp-run-{run_id[:8]}-"))
    try:
        limits = Limits(
            timeout_s=timeout_s,
            memory_limit_mb=policy.memory_limit_mb,
            max_processes=policy.max_processes,
            max_output_bytes=policy.max_output_bytes,
            network=policy.network,
            allowed_paths=policy.allowed_paths,
            env=sandbox_environment(policy, scratch, environ),
            scratch_bytes=policy.scratch_limit_mb * MIB,
            backend=policy.backend,
            required_layers=None if policy.required_layers is None else frozenset(policy.required_layers),
        )
        result = await run_sandboxed(
            pytest_argv(root, arguments, scratch / "junit.xml", policy.pytest_plugins),
            root,
            limits,
            run_dir / "stdout.txt",
            run_dir / "stderr.txt",
            scratch=scratch,
            collect={"junit.xml": run_dir / "junit.xml"},
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    counts = parse_junit(run_dir / "junit.xml") or Counts(0, 0, 0, 0)
    stdout = (run_dir / "stdout.txt").read_text(encoding="utf-8", errors="replace")
    structured = {
        **asdict(counts),
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "run_id": run_id,
    }
    text = f"{summary_line(stdout)}\n(run {run_id}; exit code {result.exit_code})"
    links = tuple(
        ResourceLink(uri=artifact_uri(run_id, name), name=name, mime_type=mime, description=f"{name} of run {run_id}")
        for name, mime in ARTIFACT_MIME_TYPES.items()
    )
    # pytest exit codes: 0 passed, 1 tests failed, 5 none collected; anything else is a tool error.
    outcome = ToolOutcome(text, structured, links, is_error=result.exit_code not in (0, 1, 5))
    return PytestRun(result, outcome, limits)


def write_evidence(run_dir: Path, governance: Governance, limits: Limits, result: RunResult) -> None:
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
                "landlock_abi": layers().landlock,
                "required_layers": sorted(limits.required),
            },
            **sandbox_summary(result),
        },
    }
    (run_dir / "evidence.json").write_text(json.dumps(evidence, indent=2, sort_keys=True) + "\n", encoding="utf-8")
