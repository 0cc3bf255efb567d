"""Coverage sees the supervisors' lines though they fork by libc's fork (decision 95, `_plain_fork`, which
skips CPython's fork hooks and so coverage's own), and without coverage nothing of it is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Forks by `_plain_fork`; each side runs lines of its own and ends by os._exit, as the supervisors do.
FORKS = """
import json, os, sys
from sandbox.backends.pidns import _plain_fork

def in_the_child():
    return os.getpid()  # the child's line

def in_the_parent():
    return os.getpid()  # the parent's line

pid = _plain_fork()
if pid == 0:
    in_the_child()
    os._exit(0)
os.waitpid(pid, 0)
in_the_parent()
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "coverage")), flush=True)
os._exit(0)
"""

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *prefix: str) -> list[str]:
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    done = subprocess.run(
        [sys.executable, *prefix, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "COVERAGE_FILE": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def measured_lines(tmp_path: Path) -> set[str]:
    subprocess.run(
        [sys.executable, "-m", "coverage", "combine", "-q", "--rcfile", str(tmp_path / "rc")],
        cwd=tmp_path,
        env={"COVERAGE_FILE": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=120,
    )
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", "-q", "-o", "report.json", "--rcfile", str(tmp_path / "rc")],
        cwd=tmp_path,
        env={"COVERAGE_FILE": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=120,
    )
    files = json.loads((tmp_path / "report.json").read_text())["files"]
    source = (tmp_path / "forks.py").read_text().splitlines()
    executed = files["forks.py"]["executed_lines"]
    return {source[number - 1].strip() for number in executed}


def test_under_coverage_both_sides_of_a_plain_fork_are_measured(tmp_path: Path) -> None:
    # As pyproject.toml's [tool.coverage.run]: parallel data files, coverage restarted after a fork; no `_exit` patch.
    (tmp_path / "rc").write_text(f"[run]\nparallel = true\npatch = fork\nsource = {tmp_path}\n")
    run(tmp_path, "-m", "coverage", "run", "--rcfile", str(tmp_path / "rc"))
    lines = measured_lines(tmp_path)
    assert "return os.getpid()  # the child's line" in lines, "the child's lines, saved by its os._exit"
    assert "return os.getpid()  # the parent's line" in lines, "the parent's, saved by its os._exit"


def test_without_coverage_a_plain_fork_loads_nothing_of_it(tmp_path: Path) -> None:
    assert run(tmp_path) == []
