"""A migrated SQLite database for a test, copied from one template per process (decision 76).

Migrating a new SQLite file runs every Alembic revision (about 35 ms of CPU on a quiet machine),
and the unit tests build a few hundred such files. Each process (each pytest-xdist worker)
migrates one template file, with the gateway's own `make_engine` and `migrate`, on first use; a
test's file is then a byte copy of it (about 1 ms), which `migrated` finds at the newest revision
and leaves alone. The PostgreSQL counterpart is tests/pg_cluster.py (`clone_database`).

A copy is what a fresh migration leaves, byte for byte: the migrations write no clock, id or
path (the audit head's genesis row is a constant), and the template's WAL is checkpointed
into the file when its engine closes. It is created as SQLite creates a database file (mode 0644
less the umask), so a test that checks the file's mode sees what `init` leaves.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sqlalchemy import Engine, make_url

from gateway.db import make_engine, migrate, schema_is_current

_template: list[Path] = []
"""This process's migrated template file, once made."""
SQLITE_FILE_MODE = 0o644
"""The mode SQLite gives a database file it creates (SQLITE_DEFAULT_FILE_PERMISSIONS), before the umask."""


def template_file() -> Path:
    """This process's migrated template file, made on first use (removed when the process exits)."""
    if not _template:
        folder = tempfile.TemporaryDirectory(prefix="mcp-gw-sqlite-template-")
        path = Path(folder.name) / "template.db"
        engine = make_engine(f"sqlite:///{path}")
        try:
            migrate(engine)
        finally:
            engine.dispose()
        leftovers = [side for side in ("-wal", "-shm") if Path(f"{path}{side}").exists()]
        if leftovers:
            raise RuntimeError(f"the template's {', '.join(leftovers)} outlived its engine: a copy would miss writes")
        _template.append(path)
        _keep.append(folder)
    return _template[0]


_keep: list[tempfile.TemporaryDirectory[str]] = []
"""The template's folder, deleted with the process (TemporaryDirectory's own finalizer)."""


def copy_migrated(url: str) -> None:
    """When `url` names a SQLite file that does not exist yet, make it a copy of the migrated template.

    Anything else (PostgreSQL, a file already there, SQLite in memory) is left alone."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    target = Path(parsed.database)
    if target.exists():
        return
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SQLITE_FILE_MODE)
    with open(descriptor, "wb") as out, template_file().open("rb") as source:
        shutil.copyfileobj(source, out)


def migrated(engine: Engine) -> None:
    """`migrate(engine)`, but nothing when the database stands at the newest revision already (a copy of a
    template, SQLite's or PostgreSQL's), which plain SQL tells in about 1 ms (`schema_is_current`): Alembic
    loads every revision's script to find there is nothing to do (about 10 ms)."""
    if not schema_is_current(engine):
        migrate(engine)
