"""A throwaway PostgreSQL server for the suite's `postgres` tests (a pytest plugin, tests/conftest.py).

When MCP_GATEWAY_TEST_PG_URL is not set and this machine has PostgreSQL's server programs
(Debian's `postgresql` package: `make test` installs it when run as root, as CI does), the
session starts its own cluster before collection: `initdb` into a temporary folder, a server
on a free 127.0.0.1 port (no socket elsewhere, `fsync=off`: the data is thrown away), one empty
database, and MCP_GATEWAY_TEST_PG_URL naming it, which the tests and every `serve` they start
read. The cluster runs as the `postgres` user when the suite runs as root (the server refuses
root), and is stopped and deleted when the session ends. Without the programs nothing starts
and the `postgres` tests skip, as before. MCP_GATEWAY_TEST_PG=off turns it off.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

URL_VARIABLE = "MCP_GATEWAY_TEST_PG_URL"
_started: list[tuple[Path, Path, str | None]] = []
"""(pg_ctl, data folder, user) of the cluster this session started."""


def server_programs() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres (Debian's versioned folder first)."""
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.access(Path(folder) / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(argv: list[str], user: str | None) -> None:
    done = subprocess.run(argv, user=user, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed: {done.stderr.strip() or done.stdout.strip()}")


def start_cluster(programs: Path) -> str:
    """Start a cluster; the URL of its empty database."""
    user = "postgres" if os.geteuid() == 0 else None
    data = Path(tempfile.mkdtemp(prefix="mcp-gw-pg-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    port = _free_port()
    _run([str(programs / "initdb"), "-D", str(data / "data"), "-A", "trust", "-U", "postgres", "--no-sync"], user)
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off -c max_connections=200"
    _run(
        [str(programs / "pg_ctl"), "-D", str(data / "data"), "-o", options, "-l", str(data / "log"), "-w", "start"],
        user,
    )
    _started.append((programs / "pg_ctl", data, user))
    with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as connection:
        connection.execute("CREATE DATABASE gateway_tests")
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/gateway_tests"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(URL_VARIABLE) or os.environ.get("MCP_GATEWAY_TEST_PG") == "off":
        return
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller started it
    programs = server_programs()
    if programs is None:
        return
    os.environ[URL_VARIABLE] = start_cluster(programs)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _started:
        pg_ctl, data, user = _started.pop()
        subprocess.run(
            [str(pg_ctl), "-D", str(data / "data"), "-m", "immediate", "stop"],
            user=user,
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(data, ignore_errors=True)
