"""Users, their roles and workspaces (docs/operations.md, "Users": `user add/list/disable/set-role`)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, select, update
from sqlalchemy.exc import IntegrityError

from gateway import db
from gateway.clock import Clock


@cache
def _passwords() -> Any:
    """pbkdf2_sha256 needs no compiled extension; passwords are for the web console, so passlib loads at the
    first password, not at every command's start-up (decision 94)."""
    from passlib.context import CryptContext  # noqa: PLC0415

    return CryptContext(schemes=["pbkdf2_sha256"], pbkdf2_sha256__default_rounds=600_000)


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    role: str
    disabled: bool
    workspaces: tuple[str, ...]
    created_at: float


class UserError(Exception):
    """An expected failure of a user operation (exists, unknown...), with a one-line message."""


def check_user_name(name: str) -> None:
    """A user name is a token's `sub` and shows in the log and in `user list`: no control or format characters."""
    if not name or name != name.strip() or any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in name):
        raise UserError(f"user name {name!r} must be non-empty, without surrounding spaces or control characters")


def hash_password(password: str) -> str:
    return str(_passwords().hash(password))


def password_matches(password: str, password_hash: str) -> bool:
    return bool(_passwords().verify(password, password_hash))


NO_USER_HASH = "$pbkdf2-sha256$600000$pHSuVYoR4ty7l7J2DmHMuQ$x76uBoTXTHW/VvPMWFPSF7WA24UNOk5vydSFtQDllMo"
"""The hash of a random password nobody kept, at the rounds `hash_password` uses: what a sign-in without a
stored hash is checked against. A constant, not made at the first such sign-in, which then took twice as long
as any later one and told an unknown name from a known one."""


def no_password_matches(password: str) -> bool:
    """False, after the work of checking `password` against a stored hash: an unknown name, a disabled user
    or an empty password costs what a wrong password does."""
    _passwords().verify(password or "x", NO_USER_HASH)
    return False


FETCH_USER = (
    select(db.users, db.user_workspaces.c.workspace)
    .outerjoin(db.user_workspaces, db.user_workspaces.c.user_id == db.users.c.id)
    .where(db.users.c.name == bindparam("name"))
    .order_by(db.user_workspaces.c.workspace)
)


def user_from_rows(rows: Sequence[Any]) -> UserRecord | None:
    """The user FETCH_USER's rows describe (one per workspace), or None when there are none."""
    if not rows:
        return None
    first = rows[0]
    workspaces = tuple(r.workspace for r in rows if r.workspace is not None)
    return UserRecord(first.name, first.role, bool(first.disabled), workspaces, float(first.created_at))


class UserStore:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        self._clock = clock

    def add(self, name: str, role: str, workspaces: tuple[str, ...], password: str | None = None) -> UserRecord:
        check_user_name(name)
        now = self._clock.now()
        try:
            with self._engine.begin() as connection:
                user_id = connection.execute(
                    db.users.insert()
                    .values(
                        name=name,
                        role=role,
                        disabled=False,
                        password_hash=hash_password(password) if password else None,
                        created_at=now,
                    )
                    .returning(db.users.c.id)
                ).scalar_one()
                if workspaces:
                    connection.execute(
                        db.user_workspaces.insert(),
                        [{"user_id": user_id, "workspace": w} for w in workspaces],
                    )
        except IntegrityError as exc:
            raise UserError(f"user {name!r} already exists") from exc
        return UserRecord(name, role, False, workspaces, now)

    def fetch(self, name: str, connection: Connection | None = None) -> UserRecord | None:
        """The user, or None; pass `connection` to read inside a caller's transaction."""
        if connection is None:
            with self._read.connect() as own:
                return self.fetch(name, own)
        return user_from_rows(connection.execute(FETCH_USER, {"name": name}).all())

    def list(self) -> list[UserRecord]:
        with self._read.connect() as connection:
            rows = connection.execute(
                select(db.users, db.user_workspaces.c.workspace)
                .outerjoin(db.user_workspaces, db.user_workspaces.c.user_id == db.users.c.id)
                .order_by(db.users.c.name, db.user_workspaces.c.workspace)
            ).all()
        records: dict[str, UserRecord] = {}
        for r in rows:
            known = records.get(r.name)
            extra = (r.workspace,) if r.workspace is not None else ()
            if known is None:
                records[r.name] = UserRecord(r.name, r.role, bool(r.disabled), extra, float(r.created_at))
            else:
                records[r.name] = UserRecord(
                    known.name, known.role, known.disabled, known.workspaces + extra, known.created_at
                )
        return list(records.values())

    def disable(self, name: str) -> None:
        self._update(name, disabled=True)

    def set_role(self, name: str, role: str) -> None:
        self._update(name, role=role)

    def set_password(self, name: str, password: str) -> None:
        """Set the password the web console's sign-in checks (stored as a passlib hash, never the password)."""
        if not password:
            raise UserError("the password is empty")
        self._update(name, password_hash=hash_password(password))

    def fetch_password_hash(self, name: str) -> str | None:
        """The user's password hash, or None (no such user, or no password set)."""
        with self._read.connect() as connection:
            value = connection.execute(select(db.users.c.password_hash).where(db.users.c.name == name)).scalar()
        return None if value is None else str(value)

    def _update(self, name: str, **values: object) -> None:
        with self._engine.begin() as connection:
            result = connection.execute(update(db.users).where(db.users.c.name == name).values(**values))
        if result.rowcount == 0:
            raise UserError(f"no user named {name!r}")
