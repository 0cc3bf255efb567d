"""`run_pytest` (docs/clients.md; decision 12): structured arguments in, pytest's counts and artifacts out.

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
import re
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.parsers import expat

from gateway.errors import GatewayError, Reason, SandboxViolationError, ToolTimeoutError
from gateway.policy import SandboxPolicy
from gateway.progress import NO_PROGRESS, CallProgress
from gateway.runs import RunStatus
from gateway.tools.base import ExecutionRequest, Governance
from gateway.tools.outcome import ResourceLink, ToolOutcome
from gateway.tools.suite_progress import COUNT_STYLE, SuiteProgress
from sandbox import Limits, RunResult, guarantees, run_sandboxed
from sandbox.confine import LayerReport
from sandbox.layers import Layer
from sandbox.leftovers import scratch_folder
from sandbox.pinned import Pinned
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
class JunitCounts:
    """What junit.xml says, as clamped counts; `note` says why the file could not be used (then all 0)."""

    counts: Counts
    note: str | None = None


@dataclass(frozen=True, slots=True)
class PytestRun:
    """One finished pytest run: a ToolRun (gateway/tools/base.py)."""

    result: RunResult
    limits: Limits
    run_id: str
    run_dir: Path
    policy: SandboxPolicy
    host: LayerReport

    @property
    def duration_ms(self) -> int:
        return self.result.duration_ms

    @property
    def exit_code(self) -> int | None:
        return self.result.exit_code

    @property
    def stopped(self) -> bool:
        return self.result.killed_by is not None

    def sandbox_detail(self) -> Mapping[str, Any]:
        return sandbox_summary(self.result)

    def refusal(self) -> GatewayError | None:
        return refusal_for(self.result, self.limits.timeout_s, self.policy)

    def status(self) -> RunStatus:
        return RunStatus.ERROR if is_tool_error(self.result) else RunStatus.OK

    def write_evidence(self, governance: Governance) -> None:
        write_evidence(self.run_dir, governance, self.limits, self.result, self.host)

    def read_outcome(self) -> ToolOutcome:
        """The answer, read from files the run produced (untrusted): only after SANDBOX_EXEC is recorded."""
        return read_outcome(self.run_id, self.run_dir, self.result)

    def finished_detail(self, outcome: ToolOutcome) -> Mapping[str, Any]:
        structured = outcome.structured or {}
        return {key: structured[key] for key in FINISHED_COUNTS if key in structured}


FINISHED_COUNTS = ("passed", "failed", "errors", "skipped", "exit_code", "duration_ms")
"""What TOOL_FINISHED records of a run's outcome."""


def pytest_argv(root: Path, arguments: Mapping[str, Any], junit_path: Path, plugins: tuple[str, ...] = ()) -> list[str]:
    config = next((root / name for name in CONFIG_FILES if (root / name).is_file()), Path(os.devnull))
    argv = [
        sys.executable, "-I", "-B", "-m", "pytest",
        f"--rootdir={root}", f"--confcutdir={root}", "-c", str(config),
        "-p", "no:cacheprovider", f"--junitxml={junit_path}", "-q", "-rfE", *COUNT_STYLE,
    ]  # fmt: skip
    for plugin in plugins:
        argv += ["-p", plugin]
    # pytest's argparse reads ANY argument starting with '@' as a file of more arguments (an
    # option's value and anything after '--' included), and one starting with '-' as an option.
    # So no structured value is ever an argument of its own: a value is glued to its flag
    # (`-k<value>` starts with '-k', and argparse takes the rest as the value, spaces and '='
    # included), and the path follows './' (it starts with '.'). Stages 4 and 5 refuse '-' and
    # '@' prefixes as well; this holds without them.
    if "keyword" in arguments:
        argv.append(f"-k{arguments['keyword']}")
    if "markers" in arguments:
        argv.append(f"-m{arguments['markers']}")
    if "max_failures" in arguments:
        argv.append(f"--maxfail={int(arguments['max_failures'])}")
    argv += ["--", f"./{arguments['test_path']}"]
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


MAX_COUNT = 10**9
"""Counts above this are clamped: no honest suite has a billion tests."""
MAX_JUNIT_DEPTH = 64
"""pytest nests 5 deep (testsuites, testsuite, testcase, failure or properties, property)."""
MAX_JUNIT_SUITES = 10_000
"""pytest writes one suite per session."""
_INTEGER = re.compile(r"\s*([+-]?)([0-9]+)\s*")
_SUMMARY_TAIL_BYTES = 64 * 1024
MAX_SUMMARY_CHARS = 500


class _UnusableJunit(Exception):
    """junit.xml is not something pytest wrote; its message is the note shown to the caller."""


def _count(attributes: Mapping[str, str], name: str) -> int:
    value = attributes.get(name, "0")
    match = _INTEGER.fullmatch(value)
    if match is None:
        raise _UnusableJunit(f"{name}= is not an integer")
    sign, digits = match.groups()
    digits = digits.lstrip("0") or "0"
    if sign == "-":
        return 0
    # int() of a long digit string is slow (and refused past 4300 digits): anything this long is clamped.
    return MAX_COUNT if len(digits) > len(str(MAX_COUNT)) else min(MAX_COUNT, int(digits))


def counts_from_junit(data: bytes) -> JunitCounts:
    """Counts from the bytes of a junit XML file. Never raises: the file is the run's, untrusted.

    Only what pytest writes is read: a `testsuites` root holding `testsuite` elements, or one
    `testsuite` root; their `tests`, `failures`, `errors` and `skipped` attributes, each a decimal
    integer, clamped to 0..MAX_COUNT. Nested suites are ignored. A DTD (the vehicle of entity
    expansion bombs and external entities; pytest never writes one), malformed XML, a bad
    encoding, nesting deeper than MAX_JUNIT_DEPTH, more than MAX_JUNIT_SUITES suites or a count
    that is not an integer make the whole file unusable: all counts 0, and a note. Nothing is
    kept per element, so memory does not grow with the number of elements.
    """
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    suites = depth = 0
    root: str | None = None

    def start(name: str, attributes: dict[str, str]) -> None:
        nonlocal depth, root, suites
        depth += 1
        if depth > MAX_JUNIT_DEPTH:
            raise _UnusableJunit("junit.xml is nested too deeply")
        if depth == 1:
            root = name
        if (depth == 1 and name == "testsuite") or (depth == 2 and root == "testsuites" and name == "testsuite"):
            suites += 1
            if suites > MAX_JUNIT_SUITES:
                raise _UnusableJunit("junit.xml holds too many test suites")
            for key, total in totals.items():
                totals[key] = min(MAX_COUNT, total + _count(attributes, key))

    def end(_name: str) -> None:
        nonlocal depth
        depth -= 1

    def no_dtd(*_args: object) -> None:
        raise _UnusableJunit("junit.xml declares a DTD")

    try:
        parser = expat.ParserCreate()
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartDoctypeDeclHandler = no_dtd
        parser.EntityDeclHandler = no_dtd
        parser.StartElementHandler = start
        parser.EndElementHandler = end
        parser.Parse(data, True)
        if root not in ("testsuites", "testsuite") or not suites:
            raise _UnusableJunit("junit.xml holds no test suite")
    except _UnusableJunit as exc:
        return JunitCounts(Counts(0, 0, 0, 0), str(exc))
    except Exception:  # expat's errors, an encoding it cannot map: all mean "not usable"
        return JunitCounts(Counts(0, 0, 0, 0), "junit.xml is not well-formed XML")
    tests, failed, errors, skipped = (totals[key] for key in ("tests", "failures", "errors", "skipped"))
    return JunitCounts(Counts(max(0, tests - failed - errors - skipped), failed, errors, skipped))


def parse_junit(path: Path) -> JunitCounts:
    """Counts from the run's junit.xml (copied out by the gateway, at most MAX_JUNIT_BYTES). Never raises."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_JUNIT_BYTES + 1)
    except FileNotFoundError:
        return JunitCounts(Counts(0, 0, 0, 0), "the run left no junit.xml")
    except OSError:
        return JunitCounts(Counts(0, 0, 0, 0), "junit.xml could not be read")
    if len(data) > MAX_JUNIT_BYTES:
        return JunitCounts(Counts(0, 0, 0, 0), "junit.xml is too large")
    return counts_from_junit(data)


def shown(text: str) -> str:
    """Run-chosen text as the caller gets it: control and format characters written out as escapes."""
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text)


def summary_line(output: str) -> str:
    """The last non-empty line (pytest's summary), escaped and cut to MAX_SUMMARY_CHARS."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    line = shown(lines[-1])
    return line if len(line) <= MAX_SUMMARY_CHARS else line[:MAX_SUMMARY_CHARS] + "…"


def read_summary(path: Path) -> str:
    """The summary line from the tail of stdout.txt (the run's bytes: any encoding, any size). Never raises."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - _SUMMARY_TAIL_BYTES))
            tail = handle.read(_SUMMARY_TAIL_BYTES)
    except OSError:
        return "(no output)"
    return summary_line(tail.decode("utf-8", errors="replace"))


def is_tool_error(result: RunResult) -> bool:
    """pytest exit codes: 0 passed, 1 tests failed, 5 none collected; anything else is a tool error."""
    return result.exit_code not in (0, 1, 5)


def read_outcome(run_id: str, run_dir: Path, result: RunResult) -> ToolOutcome:
    """The call's answer: counts from junit.xml and the summary line from stdout.txt, both untrusted. Never raises."""
    junit = parse_junit(run_dir / "junit.xml")
    structured: dict[str, Any] = {
        **asdict(junit.counts),
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "run_id": run_id,
    }
    text = f"{read_summary(run_dir / 'stdout.txt')}\n(run {run_id}; exit code {result.exit_code})"
    if junit.note is not None:
        structured["counts_note"] = junit.note
        text += f"\n(counts unavailable: {junit.note})"
    links = tuple(
        ResourceLink(uri=artifact_uri(run_id, name), name=name, mime_type=mime, description=f"{name} of run {run_id}")
        for name, mime in ARTIFACT_MIME_TYPES.items()
    )
    return ToolOutcome(text, structured, links, is_error=is_tool_error(result))


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


async def execute(request: ExecutionRequest) -> PytestRun:
    """The registry's `execute` for run_pytest (gateway/tools/base.py)."""
    return await run(
        run_id=request.run_id,
        root=request.root,
        allowed_paths=request.allowed_paths,
        arguments=request.arguments,
        policy=request.policy,
        timeout_s=request.timeout_s,
        run_dir=request.run_dir,
        environ=request.environ,
        host=request.host,
        hidden=request.hidden,
        progress=request.progress,
    )


async def run(
    *,
    run_id: str,
    root: Pinned,
    arguments: Mapping[str, Any],
    policy: SandboxPolicy,
    timeout_s: int,
    run_dir: Path,
    environ: Mapping[str, str],
    allowed_paths: tuple[Pinned, ...] = (),
    host: LayerReport,
    hidden: tuple[Path, ...] = (),
    progress: CallProgress = NO_PROGRESS,
) -> PytestRun:
    """Run pytest for one call; nothing the run produced is read here (that is `PytestRun.outcome`).

    `root` and `allowed_paths` are the folders pinned at policy load (stage 4 found them intact):
    the sandbox reaches them through their fds, so a path swapped since then leads the run nowhere
    new; the paths on pytest's command line (`--rootdir`, `-c`) then at worst fail.
    The artifacts are written by the gateway (evidence: `write_evidence`). While the run is on,
    `progress` tells the caller how many tests are done (gateway/tools/suite_progress.py).
    """
    run_dir.mkdir(parents=True, exist_ok=False, mode=0o700)
    with scratch_folder(run_id[:8]) as scratch:  # held while the run is on; removed after it
        limits = Limits(
            timeout_s=timeout_s,
            memory_limit_mb=policy.memory_limit_mb,
            max_processes=policy.max_processes,
            max_output_bytes=policy.max_output_bytes,
            network=policy.network,
            allowed_paths=allowed_paths,
            env=sandbox_environment(policy, scratch, environ),
            scratch_bytes=policy.scratch_limit_mb * MIB,
            backend=policy.backend,
            require=None if policy.require is None else frozenset(policy.require),
            hidden=hidden,
        )
        suite = SuiteProgress(progress.moved)
        async with progress.waiting(suite.describe):
            result = await run_sandboxed(
                pytest_argv(root.path, arguments, scratch / "junit.xml", policy.pytest_plugins),
                root,
                limits,
                run_dir / "stdout.txt",
                run_dir / "stderr.txt",
                scratch=scratch,
                collect={"junit.xml": run_dir / "junit.xml"},
                host=host,
                on_stdout=suite.feed,
            )
    return PytestRun(result, limits, run_id, run_dir, policy, host)


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
