"""A throwaway PostgreSQL server for the suite's `postgres` tests (a pytest plugin, tests/conftest.py).

When MCP_GATEWAY_TEST_PG_URL is not set and this machine has PostgreSQL's server programs
(Debian's `postgresql` package: `make test` installs it when run as root, as CI does), the
session starts its own cluster: `initdb` into a temporary folder (in memory when /dev/shm has room,
`data_folder`), a server on a free 127.0.0.1
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
on the copy finds the newest revision and does nothing. After the test the copy is put back as the
template was and kept for the process's next test (`recycle`: renamed, emptied, the migrations' rows
back), unless the test changed its schema or the server's roles (a fingerprint read from the catalog,
`Baseline`): then it is dropped and the next test gets a new copy. 2026-11-28, `make unit` at load 1-4:
the server's CPU 12.3 s against 20.5 s with a copy and a drop per test (177 of 198 reused). A test of the migrations themselves asks
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
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


MEMORY_FOLDER = Path("/dev/shm")
MEMORY_ROOM = 2 << 30
"""Free space /dev/shm must have for the cluster to go there (2 GiB: `make unit` leaves about 0.3 GiB)."""


def data_folder(prefix: str) -> Path:
    """A new folder for a cluster's files: in /dev/shm (tmpfs) when it is there with MEMORY_ROOM free, else in
    the temporary folder. On the disk, deleting the suite's cluster at the end (about 11,000-20,000 files) took
    1-10 s of the run's wall time depending on the disk's other load; in memory about 0.1 s. A container's
    /dev/shm is often 64 MiB: the cluster then stays on the disk (decision 107)."""
    try:
        room = os.statvfs(MEMORY_FOLDER)
    except OSError:
        room = None
    if (
        room is not None
        and room.f_bavail * room.f_frsize >= MEMORY_ROOM
        and os.access(MEMORY_FOLDER, os.W_OK | os.X_OK)
    ):
        return Path(tempfile.mkdtemp(prefix=prefix, dir=MEMORY_FOLDER))
    return Path(tempfile.mkdtemp(prefix=prefix))


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


_REAPER = """
import os, shutil, subprocess, sys
pg_ctl, data, outcome, user = sys.argv[1:]
sys.stdin.buffer.read()
if os.path.exists(os.path.join(data, "data", "postmaster.pid")):
    subprocess.run([pg_ctl, "-D", os.path.join(data, "data"), "-m", "immediate", "stop"], user=user or None,
                   capture_output=True, timeout=60, check=False)
shutil.rmtree(data, ignore_errors=True)
shutil.rmtree(outcome, ignore_errors=True)
"""
_reapers: list[subprocess.Popen[bytes]] = []
"""The processes that stop and delete this session's cluster if the session dies without doing it (`start_reaper`)."""


def start_reaper(programs: Path, data: Path, outcome_folder: Path) -> subprocess.Popen[bytes]:
    """A process that waits for the end of its standard input, then stops the cluster in `data` (if its server
    runs) and deletes `data` and `outcome_folder`: when this process is killed (SIGKILL, or SIGTERM, which pytest
    does not catch), the kernel closes the pipe and the cluster goes with it, where it stayed running with its
    folder (in memory, `data_folder`). In a session of its own, so a signal to the run's process group does
    not end it first. On an orderly end `pytest_unconfigure` stops and deletes the cluster itself, then closes
    the pipe and waits for the reaper, which finds nothing left (decision 107)."""
    user = "postgres" if os.geteuid() == 0 else ""
    argv = [sys.executable, "-I", "-c", _REAPER, str(programs / "pg_ctl"), str(data), str(outcome_folder), user]
    reaper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    _reapers.append(reaper)
    return reaper


_inherited_reapers: list[subprocess.Popen[bytes]] = []
"""The reapers of the process this one was forked from: kept, never waited for (not this process's children)."""


def _forget_reapers() -> None:
    """In a process forked from the one that started the reapers (a forked worker): its copy of each reaper's
    pipe is closed, so that only the controller's end keeps a reaper waiting."""
    while _reapers:
        reaper = _reapers.pop()
        if reaper.stdin is not None:
            reaper.stdin.close()
        _inherited_reapers.append(reaper)


os.register_at_fork(after_in_child=_forget_reapers)


def _end_reapers() -> None:
    while _reapers:
        reaper = _reapers.pop()
        if reaper.stdin is not None:
            reaper.stdin.close()
        reaper.wait(timeout=scaled(START_S) + 10)


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
    data = data_folder("mcp-gw-pg-own-")
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
    data = data_folder("mcp-gw-pg-")
    port = _free_port()
    outcome = Path(tempfile.mkdtemp(prefix="mcp-gw-pg-outcome-")) / "outcome"
    start_reaper(programs, data, outcome.parent)
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
    _end_reapers()


def session_server_pids() -> set[int]:
    """The pids of the servers this session started (each postmaster's: its own processes are its children), and
    of the reaper that stops them if the session dies (`start_reaper`)."""
    pids = {reaper.pid for reaper in _reapers if reaper.poll() is None}
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


def _admin(base_url: str, *statements: str) -> None:
    """Run one statement that cannot run in a transaction (CREATE/DROP DATABASE) on `base_url`'s server.

    On one connection per process, kept between statements: each PostgreSQL connection is a server
    process of its own, whose start costs the server about 7 ms of CPU, and every test on PostgreSQL
    creates and drops a database. A connection the server closed meanwhile is replaced (pre-ping)."""
    if base_url not in _admins:
        _admins[base_url] = create_engine(
            make_url(base_url), isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0, pool_pre_ping=True
        )
    with _admins[base_url].connect() as connection:
        for statement in statements:
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
        _baselines[base_url] = read_baseline(base_url, url)
        _admin(base_url, f'ALTER DATABASE "{make_url(url).database}" WITH ALLOW_CONNECTIONS false')
        _templates[base_url] = url
    return _templates[base_url]


def clone_database(base_url: str) -> str:
    """A database as this process's migrated template is, on the server of `base_url`; its URL: one a
    test of this process used and `recycle` put back as the template's, else a new copy of the template."""
    if _clean.get(base_url):
        return _clean[base_url].pop()
    name = f"gw_test_{os.getpid()}_{next(_names)}"
    template = make_url(template_database(base_url)).database
    _admin(base_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


_clean: dict[str, list[str]] = {}
"""Databases `recycle` put back as the template's, for this process's next tests (base URL -> their URLs)."""
_baselines: dict[str, Baseline] = {}
"""What this process's template on each server holds (base URL -> it), read once it is migrated."""
reuse_counts: Counter[str] = Counter()
"""How each database a test used ended (`recycle`): "reused" or why it was dropped."""

# The schema of a database as the catalog has it, one query per kind of object, each row a text: what a
# test can change besides rows. Named by their names, not their oids, except the last query: every object
# made since the template (a copy keeps the template's oids, the server numbers each new object from a
# counter shared by every database), whatever its catalog, even one made and dropped again under its name.
_USER_NAMESPACE = "nspname NOT IN ('pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg\\_toast%'"
_SCHEMA_QUERIES = (
    "SELECT format('schema %s owner %s acl %s', nspname, pg_get_userbyid(nspowner), nspacl) FROM pg_namespace",
    f"""SELECT format('relation %s.%s kind %s owner %s persistence %s rls %s/%s options %s acl %s replica %s',
        n.nspname, c.relname, c.relkind, pg_get_userbyid(c.relowner), c.relpersistence, c.relrowsecurity,
        c.relforcerowsecurity, c.reloptions, c.relacl, c.relreplident)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NAMESPACE}""",
    f"""SELECT format('column %s.%s.%s #%s %s not null %s default %s identity %s generated %s acl %s dropped %s',
        n.nspname, c.relname, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull,
        pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attacl, a.attisdropped)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attnum > 0 AND {_USER_NAMESPACE}""",
    f"""SELECT format('index %s', pg_get_indexdef(i.indexrelid)) FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NAMESPACE}""",
    """SELECT format('constraint %s on %s/%s: %s deferrable %s/%s valid %s', conname, conrelid::regclass,
        contypid::regtype, pg_get_constraintdef(oid), condeferrable, condeferred, convalidated) FROM pg_constraint
        WHERE connamespace IN (SELECT oid FROM pg_namespace WHERE nspname NOT IN ('pg_catalog', 'information_schema'))""",
    """SELECT format('trigger %s enabled %s', pg_get_triggerdef(oid), tgenabled) FROM pg_trigger WHERE NOT tgisinternal""",
    f"""SELECT format('function %s.%s(%s) kind %s returns %s volatile %s definer %s config %s acl %s owner %s body %s',
        n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), p.prokind, p.prorettype::regtype,
        p.provolatile, p.prosecdef, p.proconfig, p.proacl, pg_get_userbyid(p.proowner), md5(p.prosrc))
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER_NAMESPACE}""",
    """SELECT format('sequence %s type %s start %s step %s range %s..%s cache %s cycle %s', seqrelid::regclass,
        seqtypid::regtype, seqstart, seqincrement, seqmin, seqmax, seqcache, seqcycle) FROM pg_sequence""",
    """SELECT format('rule %s', pg_get_ruledef(r.oid)) FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')""",
    """SELECT format('policy %s on %s %s permissive %s roles %s using %s check %s', polname, polrelid::regclass,
        polcmd, polpermissive, polroles, pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid))
        FROM pg_policy""",
    """SELECT format('enum %s %s %s', enumtypid::regtype, enumsortorder, enumlabel) FROM pg_enum""",
    """SELECT format('extension %s %s', extname, extversion) FROM pg_extension""",
    """SELECT format('database acl %s connections %s/%s settings %s', d.datacl, d.datallowconn, d.datconnlimit,
        (SELECT array_agg(s.setconfig::text ORDER BY s.setrole) FROM pg_db_role_setting s WHERE s.setdatabase = d.oid))
        FROM pg_database d WHERE d.datname = current_database()""",
    """SELECT format('default acl %s %s %s', defaclrole::regrole, defaclnamespace, defaclacl) FROM pg_default_acl""",
    # Every catalog of this database with an oid column (found in the catalog itself, not listed here).
    """SELECT format('SELECT %L || '' '' || oid FROM pg_catalog.%I WHERE oid >= 16384', c.relname, c.relname)
        FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'oid'
        WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r' AND NOT c.relisshared""",
)
_ROLES_QUERY = """SELECT format('role %s super %s login %s createdb %s createrole %s member of %s', r.rolname,
    r.rolsuper, r.rolcanlogin, r.rolcreatedb, r.rolcreaterole,
    (SELECT array_agg(m.roleid::regrole::text ORDER BY 1) FROM pg_auth_members m WHERE m.member = r.oid))
    FROM pg_roles r"""
"""The server's roles (pg_roles is the cluster's, not a database's): one a test made and left is a leak."""


@dataclass(frozen=True)
class Baseline:
    """A migrated template as `recycle` puts a used copy back to: its schema, the server's roles, its rows
    (what the migrations seed: COPY's text, per table) and where each of its sequences stands; and its
    foreign keys (referenced table, referencing table), which TRUNCATE needs to empty a table."""

    schema: str
    roles: str
    tables: tuple[str, ...]
    rows: tuple[tuple[str, bytes], ...]
    sequences: tuple[tuple[str, int, bool], ...]
    references: tuple[tuple[str, str], ...]


def _fingerprint_query(connection: psycopg.Connection[tuple[Any, ...]]) -> str:
    """One statement reading the schema's and the roles' fingerprints (md5 of their sorted rows): one round
    trip, about 3 ms of the server's CPU where a query per kind and per catalog took 10 ms."""
    queries = list(_SCHEMA_QUERIES[:-1])
    queries += [row[0] for row in connection.execute(_SCHEMA_QUERIES[-1])]
    schema = " UNION ALL ".join(f"({query})" for query in queries)
    return (
        f"SELECT (SELECT md5(string_agg(line, E'\\n' ORDER BY line)) FROM ({schema}) AS schema (line)),"
        f" (SELECT md5(string_agg(line, E'\\n' ORDER BY line)) FROM ({_ROLES_QUERY}) AS roles (line))"
    )


_fingerprint_queries: dict[str, str] = {}
"""`_fingerprint_query` on each server (base URL -> it): the catalogs are the server's, the same in every database."""


def _fingerprints(base_url: str, connection: psycopg.Connection[tuple[Any, ...]]) -> tuple[str, str]:
    """The schema's and the server's roles' fingerprints, as seen from `connection` (a database on `base_url`)."""
    if base_url not in _fingerprint_queries:
        _fingerprint_queries[base_url] = _fingerprint_query(connection)
    row = connection.execute(_fingerprint_queries[base_url]).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def _tables(connection: psycopg.Connection[tuple[Any, ...]]) -> tuple[str, ...]:
    query = f"""SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n
        ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND {_USER_NAMESPACE} AND nspname NOT LIKE 'pg\\_temp%'
        ORDER BY 1"""
    return tuple(row[0] for row in connection.execute(query))


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    parts = make_url(url)
    return psycopg.connect(
        host=parts.host, port=parts.port, user=parts.username, password=parts.password, dbname=parts.database
    )


def _references(connection: psycopg.Connection[tuple[Any, ...]]) -> tuple[tuple[str, str], ...]:
    query = """SELECT DISTINCT format('%I.%I', rn.nspname, r.relname), format('%I.%I', n.nspname, c.relname)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_class r ON r.oid = k.confrelid JOIN pg_namespace rn ON rn.oid = r.relnamespace
        WHERE k.contype = 'f' ORDER BY 1, 2"""
    return tuple((str(referenced), str(referencing)) for referenced, referencing in connection.execute(query))


def _copied_out(connection: psycopg.Connection[tuple[Any, ...]], table: str) -> bytes:
    """The rows of `table` as COPY's text, in the order the table holds them."""
    data = bytearray()
    with connection.cursor().copy(f"COPY {table} TO STDOUT") as copy:
        for chunk in copy:
            data += chunk
    return bytes(data)


def read_baseline(base_url: str, url: str) -> Baseline:
    """What the database at `url` (on `base_url`'s server) holds, as `Baseline` has it."""
    with _connect(url) as connection:
        tables = _tables(connection)
        rows = []
        for table in tables:
            data = _copied_out(connection, table)
            if data:
                rows.append((table, data))
        sequences = tuple(
            (f"{schema}.{name}", int(last), bool(called))
            for schema, name, last, called in connection.execute(
                "SELECT schemaname, sequencename, COALESCE(last_value, start_value), last_value IS NOT NULL"
                " FROM pg_sequences ORDER BY 1, 2"
            )
        )
        schema, roles = _fingerprints(base_url, connection)
        return Baseline(schema, roles, tables, tuple(rows), sequences, _references(connection))


def _tables_to_empty(connection: psycopg.Connection[tuple[Any, ...]], baseline: Baseline) -> list[str]:
    """The tables `recycle` must empty, in `baseline`'s order: each table with a row, but a seeded one whose rows
    are the template's (its COPY text, byte for byte), and every table referencing one of those (TRUNCATE
    empties a referenced table only with them).

    Read once every session of the test has ended (`recycle` ends them, and the server has no prepared
    transactions: max_prepared_transactions is 0), so a table found empty holds no row of the test's
    (decision 107)."""
    seeded = dict(baseline.rows)
    plain = [table for table in baseline.tables if table not in seeded]
    stale = {table for table, data in seeded.items() if _copied_out(connection, table) != data}
    if plain:
        found = connection.execute("SELECT " + ", ".join(f"EXISTS (SELECT FROM {table})" for table in plain)).fetchone()
        assert found is not None
        stale.update(table for table, filled in zip(plain, found, strict=True) if filled)
    while more := {referencing for referenced, referencing in baseline.references if referenced in stale} - stale:
        stale |= more
    return [table for table in baseline.tables if table in stale]


def recycle(base_url: str, url: str) -> None:
    """After a test: `url`'s database back as its template's (`clone_database` hands it to the next test),
    or dropped when the test changed anything but rows in it (`Baseline`; counted in `reuse_counts`).

    Renamed first: a process of the test's still connecting to it (a stray gateway) finds no database by
    that name. Then every table holding a row is emptied (TRUNCATE; a copy and a drop cost the server 25-70
    ms), the migrations' rows are copied back where they changed and every sequence set where the template's
    stands. Only the tables with rows (`_tables_to_empty`): TRUNCATE makes new files for each table it empties
    and for its indexes, and a test writes to a few of the 15 tables; a test's connection, its rows and the
    recycling cost the server 25 ms where they cost 31 ms emptying all (median of 6 rounds of 25, interleaved,
    load 5)."""
    baseline = _baselines.get(base_url)
    if baseline is None:
        drop_database(base_url, url)
        reuse_counts["no template"] += 1
        return
    old = make_url(url).database
    name = f"gw_test_{os.getpid()}_{next(_names)}"
    try:
        _admin(
            base_url,
            f'ALTER DATABASE "{old}" WITH ALLOW_CONNECTIONS false',
            f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = '{old}'",
            f'ALTER DATABASE "{old}" RENAME TO "{name}"',
            f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true',
        )
    except Exception:  # in use still, or renamed by the test: dropped as before
        drop_database(base_url, url)
        reuse_counts["not renamed"] += 1
        return
    renamed = make_url(base_url).set(database=name).render_as_string(hide_password=False)
    why = None
    try:
        with _connect(renamed) as connection:
            schema, roles = _fingerprints(base_url, connection)
            if schema != baseline.schema:
                why = "schema changed"
            elif roles != baseline.roles:
                why = "roles changed"
            else:
                emptied = _tables_to_empty(connection, baseline)
                if emptied:
                    connection.execute("TRUNCATE " + ", ".join(emptied) + " RESTART IDENTITY")
                for table, data in baseline.rows:
                    if table in emptied:
                        with connection.cursor().copy(f"COPY {table} FROM STDIN") as copy:
                            copy.write(data)
                if baseline.sequences:
                    settings = ", ".join("setval(%s, %s, %s)" for _ in baseline.sequences)
                    connection.execute(f"SELECT {settings}", [value for entry in baseline.sequences for value in entry])
    except psycopg.Error as exc:
        why = f"not emptied: {type(exc).__name__}"
    if why is not None:
        drop_database(base_url, renamed)
        reuse_counts[why] += 1
        return
    reuse_counts["reused"] += 1
    _clean.setdefault(base_url, []).append(renamed)


def _deleted_whole(base_url: str) -> bool:
    """Whether `base_url` is the session's own cluster, which the controller stops and deletes whole at its
    end (`pytest_unconfigure`): a database dropped there first is only work (0.4-1.1 s of a worker's end,
    one DROP DATABASE each for its template and the copies it kept)."""
    return bool(os.environ.get(OUTCOME_VARIABLE)) and base_url == os.environ.get(URL_VARIABLE)


def drop_templates() -> None:
    """Drop this process's templates (a server named by hand keeps nothing of the suite's; the session's own
    is deleted whole, `_deleted_whole`), then close its admin connections."""
    while _templates:
        base_url, url = _templates.popitem()
        kept = _clean.pop(base_url, [])
        if _deleted_whole(base_url):
            continue
        drop_database(base_url, url)
        for clean in kept:
            drop_database(base_url, clean)
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
    if make is clone_database:
        recycle(base, url)
    else:
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
