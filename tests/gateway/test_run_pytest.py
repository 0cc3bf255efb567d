"""gateway/tools/run_pytest.py: the command line (no value is ever an option) and reading what a run produced.

The run's files (junit.xml, stdout.txt) are the run's own claim:
`counts_from_junit`, `parse_junit` and `read_summary` must never raise on any content. The
command line is measured against the installed pytest: an argument starting with `@` is a
file of options to its argparse, wherever it stands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.tools.run_pytest import (
    MAX_COUNT,
    MAX_JUNIT_BYTES,
    MAX_JUNIT_DEPTH,
    MAX_JUNIT_SUITES,
    MAX_SUMMARY_CHARS,
    Counts,
    JunitCounts,
    counts_from_junit,
    parse_junit,
    pytest_argv,
    read_summary,
    summary_line,
)

PYTEST_SUITE = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="10"
time="0.1"><testcase classname="t" name="a" time="0.0"/></testsuite></testsuites>"""


def suite(**attributes: str) -> bytes:
    attrs = " ".join(f'{name}="{value}"' for name, value in attributes.items())
    return f"<testsuites><testsuite {attrs}/></testsuites>".encode()


# --- junit.xml: counts, never an exception -----------------------------------------------------


@pytest.mark.parametrize(
    ("data", "counts"),
    [
        pytest.param(PYTEST_SUITE, Counts(4, 2, 1, 3), id="what-pytest-writes"),
        pytest.param(b'<testsuite tests="3" failures="1"/>', Counts(2, 1, 0, 0), id="one-suite-root"),
        pytest.param(
            b'<testsuites><testsuite tests="2"/><testsuite tests="3" skipped="1"/></testsuites>',
            Counts(4, 0, 0, 1),
            id="two-suites-summed",
        ),
        pytest.param(suite(tests="-5", failures="-1"), Counts(0, 0, 0, 0), id="negative-clamped-to-0"),
        pytest.param(suite(tests="1", failures="5"), Counts(0, 5, 0, 0), id="more-failures-than-tests"),
        pytest.param(suite(tests="9" * 50), Counts(MAX_COUNT, 0, 0, 0), id="huge-clamped"),
        pytest.param(suite(tests="9" * 5000), Counts(MAX_COUNT, 0, 0, 0), id="past-int-max-str-digits"),
        pytest.param(suite(tests=" 007 "), Counts(7, 0, 0, 0), id="padded-and-leading-zeros"),
        pytest.param(
            b"<testsuites>" + b'<testsuite tests="900000000"/>' * 3 + b"</testsuites>",
            Counts(MAX_COUNT, 0, 0, 0),
            id="sum-clamped",
        ),
        pytest.param(
            b'<testsuites><testsuite tests="2"><testsuite tests="lots"/></testsuite></testsuites>',
            Counts(2, 0, 0, 0),
            id="nested-suite-ignored",
        ),
        pytest.param(
            b'<testsuites><properties tests="lots"/><testsuite tests="1"/></testsuites>',
            Counts(1, 0, 0, 0),
            id="other-elements-ignored",
        ),
        pytest.param(
            b'<?xml version="1.0" encoding="latin-1"?><testsuite name="\xe9" tests="1"/>',
            Counts(1, 0, 0, 0),
            id="declared-latin-1",
        ),
        pytest.param('<testsuite tests="4" failures="1"/>'.encode("utf-16"), Counts(3, 1, 0, 0), id="utf-16-with-bom"),
    ],
)
def test_counts_from_usable_junit(data: bytes, counts: Counts) -> None:
    assert counts_from_junit(data) == JunitCounts(counts)


DEEP = b"<testsuites>" + b"<a>" * 200_000 + b"</a>" * 200_000 + b"</testsuites>"
BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<testsuite tests="&lol4;"/>"""
EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]><testsuite tests="1" name="&x;"/>"""


@pytest.mark.parametrize(
    ("data", "note"),
    [
        pytest.param(suite(tests="lots"), "tests= is not an integer", id="tests-lots"),
        pytest.param(suite(tests="1", failures="some"), "failures= is not an integer", id="failures-word"),
        pytest.param(suite(tests="1.5"), "tests= is not an integer", id="float"),
        pytest.param(suite(tests="1e3"), "tests= is not an integer", id="exponent"),
        pytest.param(suite(tests=""), "tests= is not an integer", id="empty"),
        pytest.param(suite(tests="0x10"), "tests= is not an integer", id="hex"),
        pytest.param(suite(tests="\u0663"), "tests= is not an integer", id="non-ascii-digit"),
        pytest.param(suite(tests="NaN"), "tests= is not an integer", id="nan"),
        pytest.param(b"<html><body/></html>", "junit.xml holds no test suite", id="wrong-root"),
        pytest.param(b"<testsuites/>", "junit.xml holds no test suite", id="no-suite"),
        pytest.param(b"<testsuites><testcase/></testsuites>", "junit.xml holds no test suite", id="cases-no-suite"),
        pytest.param(b"", "junit.xml is not well-formed XML", id="empty-file"),
        pytest.param(b"<testsuite tests='1'>", "junit.xml is not well-formed XML", id="unclosed"),
        pytest.param(b"\xff\xfe\xfa garbage", "junit.xml is not well-formed XML", id="not-utf-8"),
        pytest.param(b'<testsuite tests="\xff"/>', "junit.xml is not well-formed XML", id="bad-byte-in-value"),
        pytest.param(
            b'<?xml version="1.0" encoding="no-such-codec"?><testsuite/>',
            "junit.xml is not well-formed XML",
            id="unknown-encoding",
        ),
        pytest.param(
            b'<?xml version="1.0" encoding="utf-32"?><testsuite/>',
            "junit.xml is not well-formed XML",
            id="multibyte-encoding-expat-cannot-map",
        ),
        pytest.param(b'<testsuite tests="&undefined;"/>', "junit.xml is not well-formed XML", id="undefined-entity"),
        pytest.param(b'<testsuite tests="&#0;"/>', "junit.xml is not well-formed XML", id="nul-char-ref"),
        pytest.param(b'<testsuite tests="1" tests="2"/>', "junit.xml is not well-formed XML", id="duplicate-attr"),
        pytest.param(BILLION_LAUGHS, "junit.xml declares a DTD", id="billion-laughs"),
        pytest.param(EXTERNAL_ENTITY, "junit.xml declares a DTD", id="external-entity"),
        pytest.param(b"<!DOCTYPE testsuite><testsuite tests='1'/>", "junit.xml declares a DTD", id="bare-doctype"),
        pytest.param(DEEP, "junit.xml is nested too deeply", id="deep-nesting"),
        pytest.param(
            b"<testsuites>" + b"<testsuite/>" * (MAX_JUNIT_SUITES + 1) + b"</testsuites>",
            "junit.xml holds too many test suites",
            id="too-many-suites",
        ),
    ],
)
def test_unusable_junit_gives_zero_counts_and_a_note(data: bytes, note: str) -> None:
    assert counts_from_junit(data) == JunitCounts(Counts(0, 0, 0, 0), note)


def test_what_pytest_nests_is_within_the_depth_limit() -> None:
    nested = b"<testsuites><testsuite tests='1'>" + b"<a>" * (MAX_JUNIT_DEPTH - 2) + b"</a>" * (MAX_JUNIT_DEPTH - 2)
    assert counts_from_junit(nested + b"</testsuite></testsuites>") == JunitCounts(Counts(1, 0, 0, 0))


def test_parse_junit_never_raises_on_files(tmp_path: Path) -> None:
    missing = parse_junit(tmp_path / "junit.xml")
    assert missing == JunitCounts(Counts(0, 0, 0, 0), "the run left no junit.xml")

    (tmp_path / "dir.xml").mkdir()
    assert parse_junit(tmp_path / "dir.xml").note == "junit.xml could not be read"

    big = tmp_path / "big.xml"
    big.write_bytes(b"<testsuite tests='1'/>" + b" " * MAX_JUNIT_BYTES)
    assert parse_junit(big) == JunitCounts(Counts(0, 0, 0, 0), "junit.xml is too large")

    at_limit = tmp_path / "limit.xml"
    head = b'<testsuite tests="5"/>'
    at_limit.write_bytes(head + b" " * (MAX_JUNIT_BYTES - len(head)))  # 16 MiB exactly: still read
    assert parse_junit(at_limit) == JunitCounts(Counts(5, 0, 0, 0))

    lots = tmp_path / "lots.xml"
    lots.write_bytes(suite(tests="lots"))
    assert parse_junit(lots).note == "tests= is not an integer"


# --- stdout.txt: the summary line ----------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "line"),
    [
        pytest.param("x\n2 passed in 0.01s\n\n", "2 passed in 0.01s", id="pytest"),
        pytest.param("", "(no output)", id="empty"),
        pytest.param("\n \n", "(no output)", id="blank"),
        pytest.param("1 passed\x1b[2K\x1b]0;title\x07", "1 passed\\u001b[2K\\u001b]0;title\\u0007", id="escapes"),
        pytest.param("2 passed\rall good", "all good", id="cr-ends-a-line"),
        pytest.param("2 passed\x85\u2028x", "x", id="unicode-line-breaks-end-a-line"),
        pytest.param("ok\u202egnp.exe", "ok\\u202egnp.exe", id="bidi-override"),
        pytest.param("a\x00b", "a\\u0000b", id="nul"),
    ],
)
def test_summary_line_is_the_last_line_with_controls_written_out(output: str, line: str) -> None:
    assert summary_line(output) == line


def test_summary_line_is_cut() -> None:
    line = summary_line("y" * 10_000)
    assert len(line) == MAX_SUMMARY_CHARS + 1 and line.endswith("…")


def test_read_summary_reads_only_the_tail_and_never_raises(tmp_path: Path) -> None:
    assert read_summary(tmp_path / "missing.txt") == "(no output)"

    stdout = tmp_path / "stdout.txt"
    stdout.write_bytes(b"\xff\xfe not utf-8\n" * 100_000 + b"3 passed \xe9\xff\n")
    assert read_summary(stdout) == "3 passed \ufffd\ufffd"

    stdout.write_bytes(b"z" * (4 * 1024 * 1024))  # one 4 MiB line: cut, not carried whole
    assert len(read_summary(stdout)) == MAX_SUMMARY_CHARS + 1


# --- the command line: no structured value is ever an option ----------------------------------

ROOT = Path("/srv/ws")
JUNIT = Path("/scratch/junit.xml")


def argv_tail(arguments: dict[str, Any]) -> list[str]:
    argv = pytest_argv(ROOT, arguments, JUNIT)
    return argv[argv.index("console_output_style=count") + 1 :]


@pytest.mark.parametrize(
    ("arguments", "tail"),
    [
        pytest.param({"test_path": "tests"}, ["--", "./tests"], id="path"),
        pytest.param({"test_path": "@opts"}, ["--", "./@opts"], id="path-at"),
        pytest.param({"test_path": "-x"}, ["--", "./-x"], id="path-dash"),
        pytest.param({"test_path": "t.py::test_a[1-2]"}, ["--", "./t.py::test_a[1-2]"], id="node-id"),
        pytest.param({"test_path": "t", "keyword": "@kf"}, ["-k@kf", "--", "./t"], id="keyword-at"),
        pytest.param({"test_path": "t", "keyword": "a and not b"}, ["-ka and not b", "--", "./t"], id="keyword"),
        pytest.param({"test_path": "t", "markers": "@mf"}, ["-m@mf", "--", "./t"], id="markers-at"),
        pytest.param({"test_path": "t", "max_failures": 3}, ["--maxfail=3", "--", "./t"], id="maxfail"),
    ],
)
def test_every_structured_value_is_glued_or_prefixed(arguments: dict[str, Any], tail: list[str]) -> None:
    assert argv_tail(arguments) == tail
    assert not any(arg.startswith("@") for arg in pytest_argv(ROOT, arguments, JUNIT))


WORKSPACE_FILES = {
    "test_mark.py": "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n",
    # Two lines: with `-k @opts` the expansion is `-k zzz --junitxml=...`; after `--` it is one more option.
    "opts": "zzz_matches_nothing\n--junitxml={pwned}\n",
}


PYTEST = [sys.executable, "-I", "-B", "-m", "pytest"]
"""How every command line measured here starts: the interpreter and flags a run is given."""

_FORKS = textwrap.dedent(
    """
    import json, os, signal, sys
    from importlib import import_module
    import pytest
    from _pytest.config import default_plugins
    for name in default_plugins:  # what each run's configuration imports: once, here
        import_module(f"_pytest.{name}")
    for line in sys.stdin:
        run = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.chdir(run["cwd"])
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, run["stdout"], os.O_WRONLY | os.O_CREAT),
                                    (2, run["stderr"], os.O_WRONLY | os.O_CREAT)):
                os.dup2(os.open(path, flags | os.O_CLOEXEC, 0o600), fd)
            signal.alarm(60)  # the run's bound: SIGALRM ends it
            sys.argv = run["argv"]
            code = 1
            try:
                code = pytest.console_main()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    """
)


@pytest.fixture(scope="module")
def pytest_forks() -> Iterator[subprocess.Popen[str]]:
    """An interpreter started as `PYTEST` starts one, with pytest and its own plugins imported, that forks
    a run for each command line it is sent: a run is pytest's own `python -m pytest` main in a process
    of its own, as a fresh interpreter's, without the 0.1 s of CPU each of them spent importing pytest
    (10 runs: 0.7 against 1.7 s).

    Without the plugins installed beside it (xdist, timeout: PYTEST_DISABLE_PLUGIN_AUTOLOAD): pytest's own
    parser reads the command line and its @files, which is what is measured (loading them made a run 0.38 s
    of CPU where it was 0.2)."""
    environment = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    forks = subprocess.Popen(
        [*PYTEST[:3], "-c", _FORKS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment, text=True
    )
    assert forks.stdin is not None and forks.stdout is not None
    try:
        yield forks
    finally:
        forks.stdin.close()
        try:
            forks.wait(timeout=90)  # a run still going ends at its alarm
        finally:
            forks.kill()
            forks.wait()
            forks.stdout.close()


def measured(
    forks: subprocess.Popen[str], tmp_path: Path, argv: list[str]
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """Run the installed pytest on a small workspace; True when the options file was applied."""
    assert argv[: len(PYTEST)] == PYTEST and forks.stdin is not None and forks.stdout is not None
    pwned = tmp_path / "pwned.xml"
    pwned.unlink(missing_ok=True)
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    out.unlink(missing_ok=True)
    err.unlink(missing_ok=True)
    run = {"cwd": str(tmp_path), "argv": ["pytest", *argv[len(PYTEST) :]], "stdout": str(out), "stderr": str(err)}
    forks.stdin.write(json.dumps(run) + "\n")
    forks.stdin.flush()
    code = int(forks.stdout.readline())
    result = subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())
    return result, pwned.exists()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    for name, text in WORKSPACE_FILES.items():
        (tmp_path / name).write_text(text.format(pwned=tmp_path / "pwned.xml"))
    return tmp_path


def legacy_argv(root: Path, arguments: dict[str, Any], junit: Path) -> list[str]:
    """The command line before decision 34: values as arguments of their own (the control of the measurement)."""
    argv = [*PYTEST, f"--rootdir={root}", "-c", "/dev/null",
            "-p", "no:cacheprovider", f"--junitxml={junit}", "-q"]  # fmt: skip
    if "keyword" in arguments:
        argv += ["-k", arguments["keyword"]]
    if "markers" in arguments:
        argv += ["-m", arguments["markers"]]
    return [*argv, "--", arguments["test_path"]]


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"test_path": "@opts"}, id="test_path"),
        pytest.param({"test_path": "test_mark.py", "keyword": "@opts"}, id="keyword"),
        pytest.param({"test_path": "test_mark.py", "markers": "@opts"}, id="markers"),
    ],
)
def test_pytest_never_reads_a_value_as_a_file_of_options(
    pytest_forks: subprocess.Popen[str], workspace: Path, arguments: dict[str, Any]
) -> None:
    junit = workspace / "junit.xml"
    _, applied_before = measured(pytest_forks, workspace, legacy_argv(workspace, arguments, junit))
    assert applied_before, "control: the separate-argument form expands @opts (the measurement works)"

    result, applied = measured(pytest_forks, workspace, pytest_argv(workspace, arguments, junit))

    assert not applied, result.stdout + result.stderr
    assert junit.exists() or result.returncode in (4, 5), result.stdout + result.stderr


@pytest.mark.parametrize(
    ("arguments", "passed"),
    [
        pytest.param({"test_path": "test_mark.py", "keyword": "one or two"}, 2, id="keyword-with-spaces"),
        pytest.param({"test_path": "test_mark.py", "keyword": "not two"}, 1, id="keyword-not"),
        pytest.param({"test_path": "test_mark.py", "markers": "not slow"}, 2, id="markers-with-spaces"),
        pytest.param({"test_path": "test_mark.py::test_two"}, 1, id="node-id"),
    ],
)
def test_glued_values_mean_what_they_say(
    pytest_forks: subprocess.Popen[str], workspace: Path, arguments: dict[str, Any], passed: int
) -> None:
    result, _ = measured(pytest_forks, workspace, pytest_argv(workspace, arguments, workspace / "junit.xml"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{passed} passed" in result.stdout
