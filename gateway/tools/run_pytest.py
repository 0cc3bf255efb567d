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

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from xml.parsers import expat

from gateway.runs import RunStatus
from gateway.tools.base import ExecutionRequest
from gateway.tools.confined import ConfinedRun, confinement, run_confined, shown
from gateway.tools.outcome import ResourceLink, ToolOutcome
from gateway.tools.suite_progress import COUNT_STYLE, SuiteProgress
from sandbox import RunResult
from sandbox.runner import MAX_COLLECTED_BYTES

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


MAX_JUNIT_BYTES = MAX_COLLECTED_BYTES


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
class PytestRun(ConfinedRun):
    """One finished pytest run: a ToolRun (gateway/tools/base.py)."""

    def status(self) -> RunStatus:
        return RunStatus.ERROR if is_tool_error(self.result) else RunStatus.OK

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


async def execute(request: ExecutionRequest) -> PytestRun:
    """The registry's `execute` for run_pytest (gateway/tools/base.py): pytest, confined; nothing it wrote is read here.

    The paths on pytest's command line (`--rootdir`, `-c`) are the pinned workspace's: a path
    swapped since the policy was loaded then at worst fails. While the run is on, `progress` tells
    the caller how many tests are done (gateway/tools/suite_progress.py).
    """
    policy = request.policy
    suite = SuiteProgress(request.progress.moved)
    run = await run_confined(
        confinement(request),
        lambda scratch: pytest_argv(request.root.path, request.arguments, scratch / "junit.xml", policy.pytest_plugins),
        describe=suite.describe,
        collect={"junit.xml": request.run_dir / "junit.xml"},
        on_stdout=suite.feed,
    )
    return PytestRun.of(run)
