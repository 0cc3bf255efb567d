"""No background task ends a serving gateway (decision 68), through real `serve` processes.

Another local user (uid 65534), or another gateway of the same user, makes and removes
`mcp-run-*` folders as fast as it can (tests/scratch_churn.py) while `serve` starts and sweeps
every 50 ms: it answers initialize and its calls throughout. A sweep that fails (the scratch
root planted by someone else) is logged once, not once per sweep, and once more when it works
again; meanwhile the gateway answers, and a run is refused with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.recovery import SWEEP_ENV
from sandbox.leftovers import ROOT_PREFIX
from tests.e2e.test_run_pytest import ELICITATION, answer
from tests.harness import GatewayHome, StdioSession

SessionFactory = Callable[..., StdioSession]
REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
CHURN_S = 12.0
SWEEP_S = 0.05


@pytest.fixture
def own_tmp() -> Iterator[Path]:
    """A temp folder for these gateways alone, sticky and open to all as /tmp is."""
    folder = Path(tempfile.mkdtemp(prefix="mcp-churn-tmp-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def churning(folder: Path, uid: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "tests.scratch_churn", str(folder), str(CHURN_S)]
    if uid is not None:
        argv.append(str(uid))
    churner = subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        time.sleep(0.5)  # under way before serve starts
        yield churner
    finally:
        churner.kill()
        churner.wait(timeout=30)
        if churner.stdout is not None:
            churner.stdout.close()


def keeps_answering(session: StdioSession, token: str, seconds: float) -> None:
    """A call, then pings for `seconds` (many sweeps), then a call: each answered."""
    first = session.call_tool("list_artifacts", {}, token)
    assert "result" in first, (first, session.stderr_text())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert "result" in session.request("ping", timeout=30), session.stderr_text()
        time.sleep(0.1)
    last = session.call_tool("list_artifacts", {}, token)
    assert "result" in last, (last, session.stderr_text())
    assert session.process.poll() is None, session.stderr_text()


def test_serve_starts_and_answers_while_another_user_churns_the_temp_folder(
    gateway: GatewayHome, open_session: SessionFactory, own_tmp: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("another user's churn needs root to become uid 65534")
    env = {"TMPDIR": str(own_tmp), SWEEP_ENV: str(SWEEP_S)}
    with churning(own_tmp, NOBODY):
        # Old code: 3 of 10 starts died in the start-up sweep; a serving one at one of its sweeps.
        for _ in range(3):
            session = open_session(gateway, env=env)
            keeps_answering(session, gateway.token("alice"), 2.5)
            assert "Traceback" not in session.stderr_text(), session.stderr_text()
            session.close()
    assert (own_tmp / f"{ROOT_PREFIX}{os.geteuid()}").is_dir()


def test_a_serving_gateway_survives_its_own_users_churn_in_the_scratch_root(
    gateway: GatewayHome, open_session: SessionFactory, own_tmp: Path
) -> None:
    # Gateways of one user share the scratch root: their folders appear and vanish under each other's sweeps.
    root = own_tmp / f"{ROOT_PREFIX}{os.geteuid()}"
    root.mkdir(mode=0o711)
    env = {"TMPDIR": str(own_tmp), SWEEP_ENV: str(SWEEP_S)}
    with churning(root), churning(own_tmp):
        session = open_session(gateway, env=env)
        keeps_answering(session, gateway.token("alice"), 5)
    assert "failed" not in session.stderr_text(), session.stderr_text()


@pytest.mark.parametrize("planted", ["others_may_write", "a_symlink"])
def test_a_failing_sweep_is_logged_once_the_gateway_answers_and_a_run_is_refused_with_the_reason(
    gateway: GatewayHome, open_session: SessionFactory, own_tmp: Path, planted: str
) -> None:
    root = own_tmp / f"{ROOT_PREFIX}{os.geteuid()}"
    decoy = own_tmp / "decoy"
    decoy.mkdir()
    if planted == "a_symlink":
        root.symlink_to(decoy)
    else:
        root.mkdir()
        root.chmod(0o777)
    env = {"TMPDIR": str(own_tmp), SWEEP_ENV: "0.1"}
    session = open_session(gateway, env=env, capabilities=ELICITATION)
    session.responder = answer("allow_once")
    keeps_answering(session, gateway.token("alice"), 2)  # 20 sweeps or more, each failing

    refused = session.call_tool("run_pytest", {"test_path": "tests", "timeout_s": 5}, gateway.token("alice"))
    error = refused.get("error", {})
    assert error.get("code") == -32006 and error["data"]["step"] == "scratch_root_unsafe", refused
    assert str(root) in error["message"] and "fix:" in error["message"], error
    assert list(decoy.iterdir()) == [], "nothing was made through the planted root"

    failed = [line for line in session.stderr_text().splitlines() if "scratch folder sweep" in line]
    assert len(failed) == 2, session.stderr_text()  # at start-up, then the first sweep while serving
    assert all(str(root) in line and "retries" in line for line in failed), failed

    if planted == "a_symlink":
        root.unlink()
    else:
        root.chmod(0o711)  # ours: fixed
    deadline = time.monotonic() + 20
    while "scratch folder sweep works again" not in session.stderr_text() and time.monotonic() < deadline:
        assert "result" in session.request("ping", timeout=30)
        time.sleep(0.1)
    text = session.stderr_text()
    assert text.count("scratch folder sweep works again") == 1, text
    assert session.process.poll() is None, text
