"""The suite's PostgreSQL cluster does not outlive a session that is killed (tests/pg_cluster.py, `start_reaper`):
a stand-in for pytest's controller starts a real cluster as the session does, in the folder the session uses,
and is killed; the cluster's server stops and its folder goes."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.deadlines import scaled
from tests.pg_cluster import server_programs

ROOT_DIR = Path(__file__).resolve().parents[2]
CONTROLLER = """
import tempfile, time
from pathlib import Path
from tests import pg_cluster
programs = pg_cluster.server_programs()
data = pg_cluster.data_folder("mcp-gw-pg-")
outcome = Path(tempfile.mkdtemp(prefix="mcp-gw-pg-outcome-"))
pg_cluster.start_reaper(programs, data, outcome)
pg_cluster.start_cluster(programs, data, pg_cluster._free_port())
print(data, outcome, (data / "data" / "postmaster.pid").read_text().split()[0], flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_session_leaves_no_server_running_and_no_folder(sent: signal.Signals) -> None:
    programs = server_programs()
    if programs is None:
        pytest.skip("no PostgreSQL server programs (initdb) here")
    controller = subprocess.Popen([sys.executable, "-c", CONTROLLER], cwd=ROOT_DIR, stdout=subprocess.PIPE, text=True)
    data = outcome = None
    try:
        assert controller.stdout is not None
        data_text, outcome_text, pid_text = controller.stdout.readline().split()
        data, outcome, server = Path(data_text), Path(outcome_text), int(pid_text)
        assert psutil.pid_exists(server) and data.is_dir()
        controller.send_signal(sent)
        controller.wait(timeout=30)
        deadline = time.monotonic() + scaled(30)
        while (psutil.pid_exists(server) or data.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(server), "the server outlived its session"
        assert not data.exists() and not outcome.exists(), "the cluster's folder outlived its session"
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(timeout=30)
        if controller.stdout is not None:
            controller.stdout.close()
        if data is not None and (data / "data").exists():  # what the reaper should have done
            user = "postgres" if psutil.Process().uids().effective == 0 else None
            stop = [str(programs / "pg_ctl"), "-D", str(data / "data"), "-m", "immediate", "-w", "stop"]
            subprocess.run(stop, user=user, capture_output=True, timeout=60, check=False)
        for folder in (data, outcome):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
