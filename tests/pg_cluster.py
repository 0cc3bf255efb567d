"""A throwaway PostgreSQL server for the suite's `postgres` tests (a pytest plugin, tests/conftest.py).

When MCP_GATEWAY_TEST_PG_URL is not set and this machine has PostgreSQL's server programs
(Debian's `postgresql` package: `make test` installs it when run as root, as CI does), the
session starts its own cluster: `initdb` into a temporary folder, a server on a free 127.0.0.1
port (no socket elsewhere, `fsync=off`: the data is thrown away), one empty database, and
MCP_GATEWAY_TEST_PG_URL naming it, which the tests and every `serve` they start read. It starts
in a thread of the controller while the workers start and collect (about 2 s of the run's wall
time): the variable is set at once, and the first test of a process that needs the server waits
until it answers (`start_failure`). The cluster runs as the `postgres` user when the suite runs as root (the server refuses
root), and is stopped and deleted when the session ends. MCP_GATEWAY_TEST_PG=off turns it off.

Every test that asks for a PostgreSQL database (the `db_url` fixture) gets one of its own,
dropped after the test: the tests never share one, so they run in parallel (pytest-xdist: one
cluster, started by the controller, for every worker). `db_url`'s is already migrated: each
process migrates one template database once (`template_database`, on its first use) and every
test's database is a copy of it (`CREATE DATABASE ... TEMPLATE`, `clone_database`), about 75 ms
where creating and migrating one took 205 ms (median of 5, on a quiet server), and a `migrate`
on the copy finds the newest revision and does nothing. A test of the migrations themselves asks
for `empty_db_url`: an empty database, migrated from scratch by the test (decision 76). A server named by
MCP_GATEWAY_TEST_PG_URL by hand works the same way when its user may create databases.

Without a server, `pg_missing` says why: as root (CI, where `make test` installs postgresql)
the PostgreSQL variants then fail; as an ordinary user they skip.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from gateway.db import make_engine, migrate
from tests.deadlines import scaled

URL_VARIABLE = "MCP_GATEWAY_TEST_PG_URL"
SWITCH_VARIABLE = "MCP_GATEWAY_TEST_PG"
OUTCOME_VARIABLE = "MCP_GATEWAY_TEST_PG_OUTCOME"
"""The file the session's cluster start writes when it ends (`start_failure`): every worker inherits it."""
_started: list[tuple[Path, Path, str | None]] = []
"""(pg_ctl, data folder, user) of the cluster this session started."""
_starting: list[threading.Thread] = []
"""The thread starting the session's cluster, until it is joined."""
_outcome_folders: list[Path] = []


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


START_S = 60.0
"""How long initdb, or a server's start (`pg_ctl -w -t`), may take (TEST_TIME_SCALE times it)."""


def _run(argv: list[str], user: str | None) -> None:
    done = subprocess.run(argv, user=user, capture_output=True, text=True, timeout=scaled(START_S) + 10, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed: {done.stderr.strip() or done.stdout.strip()}")


def _pg_ctl(programs: Path, data: Path) -> list[str]:
    """pg_ctl on the cluster in `data`, waiting up to START_S (TEST_TIME_SCALE times it) for what it does."""
    return [str(programs / "pg_ctl"), "-D", str(data / "data"), "-w", "-t", str(round(scaled(START_S)))]


def start_cluster(programs: Path, data: Path, port: int) -> None:
    """Start a cluster in `data` (a new folder) on `port`, with one empty database (`cluster_url`)."""
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    _run([str(programs / "initdb"), "-D", str(data / "data"), "-A", "trust", "-U", "postgres", "--no-sync"], user)
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off -c max_connections=200"
    _started.append((programs / "pg_ctl", data, user))  # stopped at the end even when its start fails
    _run([*_pg_ctl(programs, data), "-o", options, "-l", str(data / "log"), "start"], user)
    with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as connection:
        connection.execute("CREATE DATABASE gateway_tests")


def cluster_url(port: int) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/gateway_tests"


def _start_in_background(programs: Path, data: Path, port: int, outcome: Path) -> None:
    """`start_cluster`, then its outcome in the file `outcome` (written whole, by a rename): empty when the
    server answers, else why it did not start."""
    try:
        start_cluster(programs, data, port)
        why = ""
    except Exception as exc:  # every failure is reported to the tests that wait for the server
        why = f"the suite's PostgreSQL did not start: {exc}"
    written = outcome.with_name(outcome.name + ".new")
    written.write_text(why)
    written.rename(outcome)


def start_failure() -> str | None:
    """Why the session's cluster failed to start, or None once it answers (after waiting for its start,
    `OUTCOME_VARIABLE`); None at once for a server named by hand."""
    outcome = os.environ.get(OUTCOME_VARIABLE)
    if not outcome:
        return None
    patience = 2 * scaled(START_S) + 10  # initdb, then the server's start
    deadline = time.monotonic() + patience
    while not os.path.exists(outcome):
        if time.monotonic() > deadline:
            return f"the suite's PostgreSQL did not start within {patience:.0f} s"
        time.sleep(0.02)  # the controller's thread renames the file into place: nothing here to await
    return Path(outcome).read_text() or None


@dataclass
class Cluster:
    """A cluster of this process's own (`own_cluster`), for a test that stops its server: the suite's is shared."""

    programs: Path
    data: Path
    user: str | None
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/gateway_tests"

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data} -c fsync=off"
        _run([*_pg_ctl(self.programs, self.data), "-o", options, "-l", str(self.data / "log"), "start"], self.user)

    def stop(self) -> None:
        """Stop the server at once (`immediate`: as a crash or a killed host would)."""
        subprocess.run(
            [str(self.programs / "pg_ctl"), "-D", str(self.data / "data"), "-m", "immediate", "-w", "stop"],
            user=self.user,
            capture_output=True,
            timeout=60,
            check=False,
        )


@contextmanager
def own_cluster() -> Iterator[Cluster]:
    """A throwaway cluster with one empty database (`Cluster.url`), stopped and deleted afterwards."""
    programs = server_programs()
    if programs is None:
        pytest.skip("no PostgreSQL server programs (initdb) here")
    user = "postgres" if os.geteuid() == 0 else None
    data = Path(tempfile.mkdtemp(prefix="mcp-gw-pg-own-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(data, entry.pw_uid, entry.pw_gid)
    _run([str(programs / "initdb"), "-D", str(data / "data"), "-A", "trust", "-U", "postgres", "--no-sync"], user)
    cluster = Cluster(programs, data, user, _free_port())
    try:
        cluster.start()
        with psycopg.connect(f"host=127.0.0.1 port={cluster.port} user=postgres dbname=postgres") as connection:
            connection.autocommit = True
            connection.execute("CREATE DATABASE gateway_tests")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(URL_VARIABLE) or os.environ.get(SWITCH_VARIABLE) == "off":
        return
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller started it
    programs = server_programs()
    if programs is None:
        return
    # Started in a thread, while pytest-xdist starts its workers and they collect: the first use of
    # the server (`pg_missing`) waits for it. The URL is known at once, and every worker inherits it.
    data = Path(tempfile.mkdtemp(prefix="mcp-gw-pg-"))
    port = _free_port()
    outcome = Path(tempfile.mkdtemp(prefix="mcp-gw-pg-outcome-")) / "outcome"
    os.environ[URL_VARIABLE] = cluster_url(port)
    os.environ[OUTCOME_VARIABLE] = str(outcome)
    _outcome_folders.append(outcome.parent)
    starting = threading.Thread(target=_start_in_background, args=(programs, data, port, outcome), daemon=True)
    _starting.append(starting)
    starting.start()


def _join_start() -> None:
    while _starting:
        _starting.pop().join()


@pytest.hookimpl(tryfirst=True)  # before the leftover check (tests/leftover_processes.py): no initdb still running
def pytest_sessionfinish(session: pytest.Session) -> None:
    _join_start()


def pytest_unconfigure(config: pytest.Config) -> None:
    _join_start()
    drop_templates()
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
    while _outcome_folders:
        shutil.rmtree(_outcome_folders.pop(), ignore_errors=True)


def session_server_pids() -> set[int]:
    """The pids of the servers this session started (each postmaster's: its own processes are its children)."""
    pids = set()
    for _, data, _ in _started:
        try:
            pids.add(int((data / "data" / "postmaster.pid").read_text().split()[0]))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def pg_missing() -> str | None:
    """Why no PostgreSQL test can run here, or None when a server is there (MCP_GATEWAY_TEST_PG_URL; the
    session's own, once it has started)."""
    if os.environ.get(URL_VARIABLE):
        return start_failure()
    if os.environ.get(SWITCH_VARIABLE) == "off":
        return f"{SWITCH_VARIABLE}=off"
    return f"{URL_VARIABLE} is not set and no PostgreSQL server programs (initdb) were found"


def pg_required() -> bool:
    """Whether a missing server fails the PostgreSQL variants instead of skipping them.

    As root the suite is CI's (`make test` installs Debian's postgresql first, as it installs
    bubblewrap), so a missing server is a broken set-up; an ordinary user's machine may lack it.
    MCP_GATEWAY_TEST_PG=off is an explicit choice, and skips."""
    return os.geteuid() == 0 and os.environ.get(SWITCH_VARIABLE) != "off"


_names = itertools.count()


_admins: dict[str, Engine] = {}
"""This process's one connection to each server it creates and drops databases on (base URL -> its engine)."""


def _admin(base_url: str, statement: str) -> None:
    """Run one statement that cannot run in a transaction (CREATE/DROP DATABASE) on `base_url`'s server.

    On one connection per process, kept between statements: each PostgreSQL connection is a server
    process of its own, whose start costs the server about 7 ms of CPU, and every test on PostgreSQL
    creates and drops a database. A connection the server closed meanwhile is replaced (pre-ping)."""
    if base_url not in _admins:
        _admins[base_url] = create_engine(
            make_url(base_url), isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0, pool_pre_ping=True
        )
    with _admins[base_url].connect() as connection:
        connection.execute(text(statement))


def new_database(base_url: str) -> str:
    """Create an empty database on the server of `base_url`; the URL naming it.

    The name carries the pid, so the workers of one parallel run never pick the same."""
    name = f"gw_test_{os.getpid()}_{next(_names)}"
    _admin(base_url, f'CREATE DATABASE "{name}"')
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def drop_database(base_url: str, url: str) -> None:
    """Drop the database `new_database` made, closing whatever connection a test left open."""
    _admin(base_url, f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


_templates: dict[str, str] = {}
"""This process's migrated template database on each server it used (base URL -> its URL)."""


def template_database(base_url: str) -> str:
    """This process's migrated template on the server of `base_url`, made on first use; its URL.

    One per process (each xdist worker its own), so no other session is ever connected to it while
    a copy is made. Connections to it are then refused (ALLOW_CONNECTIONS false, as template0), so
    nothing (an autovacuum worker, a stray test) holds it open when the next test copies it."""
    if base_url not in _templates:
        url = new_database(base_url)
        engine = make_engine(url)
        try:
            migrate(engine)
        finally:
            engine.dispose()
        _admin(base_url, f'ALTER DATABASE "{make_url(url).database}" WITH ALLOW_CONNECTIONS false')
        _templates[base_url] = url
    return _templates[base_url]


def clone_database(base_url: str) -> str:
    """A new database on the server of `base_url`, a copy of this process's migrated template; its URL."""
    name = f"gw_test_{os.getpid()}_{next(_names)}"
    template = make_url(template_database(base_url)).database
    _admin(base_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


def drop_templates() -> None:
    """Drop this process's templates (a server named by hand keeps nothing of the suite's), then close its
    admin connections."""
    while _templates:
        base_url, url = _templates.popitem()
        drop_database(base_url, url)
    while _admins:
        _admins.popitem()[1].dispose()


ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

on_both_engines = pytest.mark.usefixtures("db_url")
"""Run every test of a module (`pytestmark = on_both_engines`), or one test, on SQLite and on
PostgreSQL: `gateway` and `make_gateway` (tests/conftest.py) then build on that engine."""

on_postgres_only = pytest.mark.parametrize("db_url", ENGINES[1:], indirect=True)
"""For what only PostgreSQL does (what its text columns cannot hold, its locks): `db_url` is a new
PostgreSQL database. The test, or one of its fixtures, must ask for `db_url` by name."""


def suite_server() -> str:
    """The base URL of the suite's PostgreSQL server, for a test's postgres variant.

    Without one the variant fails as root (CI: `make test` installs postgresql) and skips otherwise
    (`pg_missing`)."""
    missing = pg_missing()
    if missing is not None:
        if pg_required():
            pytest.fail(f"{missing}: as root the suite runs on PostgreSQL too; `make system-deps` installs it")
        pytest.skip(missing)
    return os.environ[URL_VARIABLE]


def own_database(engine: str, folder: Path, make: Callable[[str], str]) -> Iterator[str]:
    """A database of one test's (or module's) own on `engine`: a SQLite file in `folder`, not made
    yet, or what `make` creates on the suite's PostgreSQL (`clone_database`, `new_database`),
    dropped afterwards."""
    if engine == "sqlite":
        yield f"sqlite:///{folder / 'engine.db'}"
        return
    base = suite_server()
    url = make(base)
    yield url
    drop_database(base, url)


@pytest.fixture(params=ENGINES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of the test's own: a SQLite file not made yet, or on the suite's PostgreSQL a copy
    of the process's migrated template (`clone_database`). Whoever opens it migrates it as before:
    a SQLite file then gets its tables, the PostgreSQL copy already has them."""
    yield from own_database(request.param, tmp_path, clone_database)


@pytest.fixture(params=ENGINES)
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of the test's own, no table and no Alembic version: for the tests of the
    migrations themselves, which migrate it from scratch."""
    yield from own_database(request.param, tmp_path, new_database)
