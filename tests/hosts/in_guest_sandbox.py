"""The sandbox on a cgroup-v2-only host, through `run_sandboxed` (decision 58): run inside the guest.

No `test_` prefix: the host's run does not collect it; tests/hosts/test_guest_sandbox.py starts it
in the guest (tests/guest.py) as root, then as an ordinary uid whose cgroup is delegated to it
(MCP_GATEWAY_TEST_DELEGATED=1). This process plays the gateway: the probe finds the v2 groups
(and moves it into its leaf, as it moves the gateway), runs get a group there. Every hostile
payload is bounded on its own (a few hundred MiB, a few dozen processes).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from sandbox import Limits, RunResult, probe_host, run_sandboxed
from sandbox.guarantees import Guarantee
from sandbox.runner import KilledBy

DELEGATED = os.environ.get("MCP_GATEWAY_TEST_DELEGATED") == "1"

# Three processes of 40 MiB each: each under the per-process limit, together over the run's total.
HOLDERS = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        block = bytearray(40 << 20)
        time.sleep(20)
        os._exit(0)
time.sleep(20)
"""

# Forks up to 40 sleepers (bounded here whatever the limits) and prints how many it made.
FORKS = """
import os, time
made = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(10)
        os._exit(0)
    made += 1
print(made)
"""

MARKER = "61.4142"
# A double-forked setsid daemon (a `sleep MARKER`), then the command sleeps past its time limit.
DAEMON = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/sleep", ["sleep", "{MARKER}"])
    os._exit(0)
time.sleep(60)
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="guest-run-") as name:
        path = Path(name)
        path.chmod(0o755)
        yield path


def run(folder: Path, code: str, *, memory_mb: int = 256, processes: int = 16, timeout_s: float = 60) -> RunResult:
    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=folder))
    limits = Limits(
        timeout_s=timeout_s,
        memory_limit_mb=memory_mb,
        max_processes=processes,
        max_output_bytes=100_000,
        env={"PATH": "/usr/bin:/bin"},
        scratch_bytes=8 << 20,
    )
    argv = [sys.executable, "-I", "-c", code]
    return anyio.run(lambda: run_sandboxed(argv, folder, limits, *_outputs(folder), scratch=scratch))


def _outputs(folder: Path) -> tuple[Path, Path]:
    name = f"{time.monotonic_ns()}"
    return folder / f"{name}.out", folder / f"{name}.err"


def test_doctor_reports_cgroup_v2_and_the_kernels_landlock() -> None:
    # In process: a second interpreter costs seconds under the guest's emulation.
    from gateway.cli.doctor import as_json, run_doctor
    from gateway.default_policy import SHIPPED_POLICY
    from gateway.policy import load_policy
    from sandbox.diagnose import host_facts

    tools = frozenset({"run_pytest", "list_artifacts", "get_evidence", "get_artifact_content"})
    diagnosis = run_doctor(load_policy(SHIPPED_POLICY, tools), probe_host(), host_facts())
    report = json.loads(as_json(diagnosis))
    lines = {line["name"]: line for line in report["guarantees"]}
    assert diagnosis.ok, as_json(diagnosis)
    assert report["host"]["run_groups"] == "v2" and report["host"]["cgroup_v1"] is False
    assert lines["memory_total"]["holds"] and lines["memory_total"]["layers"] == ["cgroup"]
    assert report["rootless"] is DELEGATED
    assert lines["own_identity"]["layers"] == (["user_namespace"] if DELEGATED else ["uid_drop"])
    assert report["host"]["landlock_abi"] < 3 and any("Landlock ABI < 3" in note for note in report["notes"])


def test_the_probe_keeps_every_guarantee_with_cgroup_v2() -> None:
    report = probe_host()
    assert report.cgroup and report.cgroup_version == 2, report
    assert report.missing("native", frozenset(Guarantee)) == [], report
    assert report.rootless is DELEGATED, "an ordinary user's gateway confines rootless"
    assert 0 < report.landlock < 7, "the guest's own kernel and Landlock ABI"


def test_the_runs_processes_together_are_held_to_its_memory_total(folder: Path) -> None:
    result = run(folder, HOLDERS, memory_mb=96)
    assert "cgroup" in result.layers
    assert result.killed_by is KilledBy.MEMORY and result.oom_kills >= 1, result
    assert result.peak_memory_kb <= 96 * 1024 + 1024, "the peak is the group's, within its limit"


def test_the_runs_processes_together_are_held_to_its_process_total(folder: Path) -> None:
    result = run(folder, FORKS, processes=8)
    out = next(folder.glob("*.out")).read_text()
    made = int(out)
    assert result.exit_code == 0, result
    assert made <= 8, f"{made} forks: the total (8, plus the run's supervisors) held"


def test_the_whole_run_is_killed_at_its_time_limit_daemons_included(folder: Path) -> None:
    result = run(folder, DAEMON, timeout_s=3)
    assert result.killed_by is KilledBy.TIMEOUT, result
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in psutil.process_iter(["cmdline"]) if MARKER in (p.info["cmdline"] or [])]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, "the daemon outlived the run"
