"""A PostgreSQL test database goes to the next test of its process only as its template was
(tests/pg_cluster.py, `recycle`): rows emptied and the migrations' rows back, and dropped instead
when the test changed anything else in it (schema, grants, the server's roles). On the suite's
real server, one database at a time."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import make_url

from tests import pg_cluster
from tests.pg_cluster import Baseline, clone_database, read_baseline, recycle, suite_server, template_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def base() -> Iterator[str]:
    """The suite's server, with no clean database of this process waiting: each test starts from a copy.
    Those waiting are set aside meanwhile and handed back to the process's next tests afterwards (where
    dropping them cost a DROP DATABASE here and a copy for a later test)."""
    url = suite_server()
    template_database(url)  # the template and its baseline exist from here on
    waiting = pg_cluster._clean.pop(url, [])
    yield url
    pg_cluster._clean.setdefault(url, []).extend(waiting)


def execute(url: str, *statements: str) -> None:
    parts = make_url(url)
    with psycopg.connect(host=parts.host, port=parts.port, user=parts.username, dbname=parts.database) as connection:
        for statement in statements:
            connection.execute(statement)


def baseline(base: str) -> Baseline:
    return pg_cluster._baselines[base]


def as_template(base: str, url: str) -> bool:
    """Whether the database at `url` holds what the template does (the server's roles aside: a test of
    another worker may hold one of its own meanwhile)."""
    return replace(read_baseline(base, url), roles="") == replace(baseline(base), roles="")


def test_rows_a_test_wrote_are_gone_and_the_seeded_rows_back(base: str) -> None:
    url = clone_database(base)
    tables = baseline(base).tables
    sequences = baseline(base).sequences
    assert baseline(base).rows, "the migrations seed rows (the audit head, Alembic's version)"
    assert sequences, "the template has sequences whose state must come back"
    statements = [f"SELECT nextval('{name}') FROM generate_series(1, 7)" for name, _, _ in sequences]
    statements += [f"DELETE FROM {table}" for table in tables]  # the seeded rows too
    execute(url, *statements)
    assert not as_template(base, url)
    before = pg_cluster.reuse_counts["reused"]
    recycle(base, url)
    assert pg_cluster.reuse_counts["reused"] == before + 1
    again = clone_database(base)
    assert again != url, "renamed: a process of the last test connecting by the old name finds nothing"
    assert as_template(base, again)
    pg_cluster.drop_database(base, again)


def test_rows_in_a_referenced_table_alone_are_gone_and_a_seeded_row_rewritten_as_it_was_stays(base: str) -> None:
    """`recycle` empties only the tables holding rows, and a seeded one only when its rows are not the template's
    byte for byte: a table referencing an emptied one goes with it (TRUNCATE refuses to empty it alone)."""
    url = clone_database(base)
    assert ("public.users", "public.user_workspaces") in baseline(base).references
    execute(
        url,
        "INSERT INTO users (name, role, disabled, created_at) VALUES ('left', 'admin', false, 0)",
        "UPDATE alembic_version SET version_num = version_num",
    )
    assert not as_template(base, url)
    before = pg_cluster.reuse_counts["reused"]
    recycle(base, url)
    assert pg_cluster.reuse_counts["reused"] == before + 1
    again = clone_database(base)
    assert again != url
    assert as_template(base, again)
    pg_cluster.drop_database(base, again)


SCHEMA_CHANGES = {
    "a column": ["ALTER TABLE {table} ADD COLUMN extra integer"],
    "a dropped column": ["ALTER TABLE {table} ADD COLUMN extra integer", "ALTER TABLE {table} DROP COLUMN extra"],
    "a default": ["ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT 7"],
    "an index": ["CREATE INDEX extra_index ON {table} ({column})"],
    "a table": ["CREATE TABLE extra (x integer)"],
    "a dropped table": ["DROP TABLE {table} CASCADE"],
    "a function": ["CREATE FUNCTION extra() RETURNS integer LANGUAGE sql AS 'SELECT 1'"],
    "a trigger": [
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'",
        "CREATE TRIGGER refuse BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION refuse()",
    ],
    "a sequence's step": ["ALTER SEQUENCE {sequence} INCREMENT BY 5"],
    "a new sequence": ["CREATE SEQUENCE extra_sequence"],
    "a grant": ["GRANT SELECT ON {table} TO PUBLIC"],
    "a schema": ["CREATE SCHEMA extra"],
    "a view": ["CREATE VIEW extra AS SELECT 1 AS one"],
    "a type": ["CREATE TYPE extra AS ENUM ('a')"],
    "row security": ["ALTER TABLE {table} ENABLE ROW LEVEL SECURITY"],
    "a database setting": ["ALTER DATABASE {database} SET work_mem = '8MB'"],
    "a large object": ["SELECT lo_create(0)"],
    "a temporary table's schema": ["CREATE TEMPORARY TABLE extra (x integer)"],
}


@pytest.mark.parametrize("change", SCHEMA_CHANGES)
def test_a_database_whose_schema_a_test_changed_is_dropped_and_the_next_is_a_fresh_copy(base: str, change: str) -> None:
    url = clone_database(base)
    table = next(table for table in baseline(base).tables if "alembic" not in table)
    parts = {
        "table": table,
        "column": "id",
        "sequence": baseline(base).sequences[0][0],
        "database": f'"{make_url(url).database}"',
    }
    execute(url, *(statement.format(**parts) for statement in SCHEMA_CHANGES[change]))
    before = pg_cluster.reuse_counts["schema changed"]
    recycle(base, url)
    assert pg_cluster.reuse_counts["schema changed"] == before + 1, change
    assert not pg_cluster._clean.get(base), "nothing of it waits for the next test"
    fresh = clone_database(base)
    assert as_template(base, fresh)
    pg_cluster.drop_database(base, fresh)


def test_a_role_a_test_left_on_the_server_is_not_let_pass(base: str) -> None:
    url = clone_database(base)
    role = f"gw_test_role_{make_url(url).database}"
    execute(url, f'CREATE ROLE "{role}"')
    try:
        before = pg_cluster.reuse_counts["roles changed"]
        recycle(base, url)
        assert pg_cluster.reuse_counts["roles changed"] == before + 1
        assert not pg_cluster._clean.get(base)
    finally:
        execute(base, f'DROP ROLE "{role}"')


def test_a_connection_the_test_left_open_is_ended_and_cannot_reach_the_next_test(base: str) -> None:
    url = clone_database(base)
    parts = make_url(url)
    stray = psycopg.connect(host=parts.host, port=parts.port, user=parts.username, dbname=parts.database)
    try:
        stray.execute("INSERT INTO alembic_version VALUES ('stray')")
        stray.commit()
        recycle(base, url)
        with pytest.raises(psycopg.OperationalError):
            stray.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            execute(url, "SELECT 1")
    finally:
        stray.close()
    again = clone_database(base)
    assert as_template(base, again)
    pg_cluster.drop_database(base, again)


@pytest.mark.parametrize(
    ("folder", "room", "in_memory"),
    [("/dev/shm", 1, True), ("/dev/shm", 1 << 60, False), ("/nonexistent-shm", 1, False)],
    ids=["memory with room", "memory without room", "no memory folder"],
)
def test_a_clusters_folder_is_in_memory_only_where_there_is_room(
    monkeypatch: pytest.MonkeyPatch, folder: str, room: int, in_memory: bool
) -> None:
    if in_memory and not Path(folder).is_dir():
        pytest.skip(f"no {folder} here")
    monkeypatch.setattr(pg_cluster, "MEMORY_FOLDER", Path(folder))
    monkeypatch.setattr(pg_cluster, "MEMORY_ROOM", room)
    made = pg_cluster.data_folder("mcp-gw-pg-test-")
    try:
        assert made.is_dir()
        assert made.name.startswith("mcp-gw-pg-test-")
        assert (made.parent == Path(folder)) is in_memory
        assert in_memory or made.parent == Path(tempfile.gettempdir())
    finally:
        made.rmdir()
