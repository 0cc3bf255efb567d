"""`mcp-gateway serve` started by an ordinary user (decision 57): the sample suite, what the user is told.

The memory total is not kept here for an ordinary user (memory and pids are cgroup v1
controllers, where only root may make groups): the runs go without it by default, evidence.json
and `policy check` say so, and a policy that requires it is refused with the cause and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sandbox.guarantees import DEFAULT_REQUIRED, Guarantee
from tests.adversarial.conftest import Arena, open_arena
from tests.adversarial.test_exhaustion import DAEMON
from tests.harness import StdioSession, as_uid_argv, hand_over
from tests.rootless.conftest import USER_UID, user_folder
from tests.rootless.test_contained import TAMPER

ROOTLESS_LAYERS = {
    "user_namespace",
    "network_namespace",
    "ipc_namespace",
    "scratch_tmpfs",
    "rlimits",
    "landlock",
    "pid_namespace",
    "seccomp",
}


def user_env(arena: Arena) -> dict[str, str]:
    """The environment of the user's own shell, for a CLI command the user runs."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(arena.gateway.root), "LANG": "C.UTF-8"}


def test_the_sample_suite_passes_through_a_users_gateway_with_every_guarantee_the_doctor_reports(
    rootless_arena: Arena,
) -> None:
    run = rootless_arena.run("tests")
    assert "result" in run.response, run.response
    counts = {k: run.structured[k] for k in ("passed", "failed", "errors", "skipped", "exit_code")}
    assert counts == {"passed": 8, "failed": 0, "errors": 0, "skipped": 1, "exit_code": 0}, run.structured
    layers = run.sandbox_event()["layers"]
    assert set(layers) == ROOTLESS_LAYERS, "a rootless run: a user namespace, no pool uid, no cgroup"
    confinement = run.evidence()["sandbox"]["confinement"]
    assert confinement["rootless"] is True
    assert set(confinement["required"]) == {str(g) for g in DEFAULT_REQUIRED}
    assert set(confinement["guarantees"]) == {str(g) for g in Guarantee} - {"memory_total"}
    assert confinement["guarantees"]["own_identity"] == ["user_namespace"]
    assert confinement["guarantees"]["process_total"] == ["rlimits", "user_namespace"]
    serve = psutil.Process(rootless_arena.serve_pid)
    assert serve.uids().real == USER_UID and serve.uids().effective == USER_UID, "the gateway ran as the user"
    # Every guarantee `mcp-gateway doctor` reports for this user, and by the same layers.
    doctor = rootless_arena.gateway.cli_argv("doctor", "--format", "json")
    done = subprocess.run(
        as_uid_argv(USER_UID, doctor),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=user_env(rootless_arena),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["rootless"] is True and report["user"]["uid"] == USER_UID
    holds = {line["name"]: line["layers"] for line in report["guarantees"] if line["holds"]}
    assert holds == confinement["guarantees"], (holds, confinement["guarantees"])


def test_policy_check_as_the_user_says_rootless_and_that_runs_go_without_a_memory_total(
    rootless_arena: Arena,
) -> None:
    gateway = rootless_arena.gateway
    done = subprocess.run(
        as_uid_argv(USER_UID, gateway.cli_argv("policy", "check", str(gateway.policy_path))),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=user_env(rootless_arena),
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if x.startswith("sandbox on this host:"))
    assert line.startswith("sandbox on this host: rootless (a user namespace per run), backend native"), line
    assert "own_identity (user_namespace)" in line and "process_total (rlimits+user_namespace)" in line
    assert line.endswith("missing, not required (runs go without): memory_total"), line
    assert "MISSING (required)" not in line


@pytest.fixture
def user_root() -> Iterator[Path]:
    root = user_folder("mcp-rootless-own-")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_with_bubblewrap_a_users_run_passes_and_reaches_no_state_file(user_root: Path) -> None:
    # bubblewrap's tree holds only the grants: the state folder is not in it, the workspace is bound read-only.
    with open_arena(user_root, {"sandbox": {"backend": "bubblewrap"}}, run_as=USER_UID) as arena:
        run = arena.run("tests")
        assert "result" in run.response, run.response
        assert run.structured["passed"] == 8 and run.structured["failed"] == 0, run.structured
        layers = set(run.sandbox_event()["layers"])
        assert {"user_namespace", "mount_tree", "scratch_tmpfs", "seccomp"} <= layers and "uid_drop" not in layers
        files = [arena.gateway.home / "signing.key", arena.gateway.policy_path, arena.workspace / "pyproject.toml"]
        params = {"files": [str(p) for p in files], "folders": [str(arena.gateway.home), str(arena.workspace)]}
        readable = [str(arena.workspace / "pyproject.toml")]
        arena.write("adv/test_tamper.py", TAMPER, **params, readable=readable, pids=[arena.serve_pid])
        hand_over(USER_UID, arena.workspace)
        before = [(p.stat().st_mode, p.read_bytes(), os.listxattr(p)) for p in files]
        found = arena.run("adv/test_tamper.py").report()
        assert [(p.stat().st_mode, p.read_bytes(), os.listxattr(p)) for p in files] == before
        assert {what: outcome for what, outcome in found.items() if not outcome.startswith("blocked:")} == {}


def test_requiring_every_guarantee_refuses_a_users_run_naming_the_memory_total_its_cause_and_fix(
    user_root: Path,
) -> None:
    policy = {"sandbox": {"backend": "native", "require": [g.value for g in Guarantee]}}
    with open_arena(user_root, policy, run_as=USER_UID) as arena:
        run = arena.run("tests")
        stderr = arena.session.stderr_text()
    assert run.error_code == -32006, run.response
    error = run.response["error"]
    assert error["data"]["reason"] == "sandbox_layer_missing", error
    message = error["message"]
    assert "sandbox.require asks for: memory_total (memory_total:" in message, message
    assert "on cgroup v1 here, where only root may create groups" in message, f"the cause is not named: {message}"
    assert "fix: run the gateway as root, or boot with cgroup v2 only" in message, f"no fix offered: {message}"
    assert "or leave them out of sandbox.require" in message, message
    assert "memory_total" in stderr, "serve did not warn at start that this policy cannot be kept"


def test_a_users_daemon_dies_with_its_run_when_the_gateway_is_killed_mid_run(user_root: Path) -> None:
    marker_file = "adv/test_daemon_orphaned.py"
    with open_arena(user_root, {"sandbox": {"backend": "native"}}, run_as=USER_UID) as arena:
        # The run lingers (20 s, its limit 30 s) so that it is surely running when the gateway is killed: a
        # run of a second could end, on a busy host, before its processes were seen.
        arena.write(marker_file, DAEMON, marker=str(arena.outside / "daemon-alive"), linger_s=20)
        arena.session.send_call("run_pytest", {"test_path": marker_file, "timeout_s": 30}, arena.token)
        deadline = time.monotonic() + 30
        while len(arena.leftovers(marker_file)) < 2 and time.monotonic() < deadline:
            arena.session.pump()
        running = arena.leftovers(marker_file)
        assert len(running) >= 2, (
            f"the run and its daemon never started; answers: {arena.session.answered()}; "
            f"the user's processes: {_processes_of(USER_UID)}; the gateway's stderr: {arena.session.stderr_text()[-2000:]}"
        )
        scratch = Path(psutil.Process(running[0]).environ()["TMPDIR"])
        os.kill(arena.serve_pid, signal.SIGKILL)  # the pid this test started (setpriv execs serve in place)
        killed_at = time.monotonic()
        while arena.leftovers(marker_file) and time.monotonic() - killed_at < 10:
            time.sleep(0.05)
        gone_after = time.monotonic() - killed_at
        assert arena.leftovers(marker_file) == [], "the daemon outlived its gateway"
        # The watchdog would end it at the time limit (30 s) plus its grace: this is the gateway's death.
        assert gone_after < 3, f"gone only {gone_after:.1f} s after the gateway"
        assert not (arena.outside / "daemon-alive").exists(), "the daemon wrote outside its scratch folder"
        assert scratch.is_dir(), "the killed gateway could not remove the run's scratch folder"
        # The user's next gateway sweeps what the killed one left.
        restarted = StdioSession(arena.gateway, env={"HOME": str(user_root)}, run_as=USER_UID)
        try:
            assert "result" in restarted.initialize(), restarted.stderr_text()
            swept_by = time.monotonic() + 10
            while scratch.exists() and time.monotonic() < swept_by:
                time.sleep(0.05)
            assert not scratch.exists(), "the next gateway of the user left the dead run's scratch folder"
        finally:
            restarted.close()


def _processes_of(uid: int) -> list[str]:
    """What `uid` runs, for a failure's message: pid, parent, state and the start of each command line."""
    seen = []
    for proc in psutil.process_iter(["pid", "ppid", "uids", "status", "cmdline"]):
        uids = proc.info["uids"]
        if uids is not None and uid in uids:
            seen.append(
                f"{proc.info['pid']}<{proc.info['ppid']} {proc.info['status']} {' '.join((proc.info['cmdline'] or [])[-3:])}"
            )
    return seen
