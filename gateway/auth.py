"""Stage 2 of the pipeline (docs/architecture.md): a per-call JWT becomes a Principal, or -32001.

pyjwt checks the signature, the algorithm, `iss`, `aud` and the presence of the required
claims; the lifetime (`exp`, `nbf`, `iat`, the policy's max TTL) is checked here by a pure
function against the injected clock. The key is chosen by the algorithm family named in
the token's header, and only among the policy's algorithms, so an HS256 token can never be
checked against an RSA public key (the HS/RS confusion) and `alg: none` is never accepted.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import secrets
import threading
from collections import namedtuple
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite

from gateway import db
from gateway.clock import Clock
from gateway.db.errors import storage_errors
from gateway.errors import AuthRequiredError, ConfigError, Reason
from gateway.policy import AuthPolicy
from gateway.users import FETCH_USER, UserRecord, UserStore, user_from_rows

log = logging.getLogger("gateway.auth")

REQUIRED_CLAIMS = ("sub", "iss", "aud", "iat", "exp", "jti")
MAX_TOKEN_BYTES = 8192
WORKSPACE_CLAIM = "ws"
TOKEN_ENV = "MCP_GATEWAY_TOKEN"  # noqa: S105  (the variable's name, not a secret)
"""The server's own token: check_permission's, and a call's without `params.auth` under `auth.env_token`."""
SIGNING_KEY_FILE = "signing.key"
"""The HMAC secret in the state folder (every policy's HS* algorithms; `init` creates it)."""
_ASYMMETRIC_FILES = {"RS256": "signing-rs256.pem", "EdDSA": "signing-eddsa.pem"}


@dataclass(frozen=True, slots=True)
class Claims:
    sub: str
    jti: str
    iat: float
    exp: float
    nbf: float | None
    workspace: str | None


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: str
    workspaces: tuple[str, ...]
    token_workspace: str | None
    jti: str


# --- keys ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyRing:
    hmac_secret: bytes
    private_keys: Mapping[str, Any]

    def signing_key(self, alg: str) -> Any:
        return self.hmac_secret if alg.startswith("HS") else self.private_keys.get(alg)

    def verification_key(self, alg: str) -> Any:
        if alg.startswith("HS"):
            return self.hmac_secret
        private = self.private_keys.get(alg)
        return None if private is None else private.public_key()


def _create_exclusive(path: Path, data: bytes) -> None:
    """Write a new 0600 file; never replace an existing one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def ensure_keys(home: Path, algorithms: tuple[str, ...]) -> list[Path]:
    """Create the signing keys the policy's algorithms need; existing keys are kept. Returns new files."""
    created: list[Path] = []
    secret_path = home / SIGNING_KEY_FILE
    if not secret_path.exists():
        _create_exclusive(secret_path, secrets.token_hex(64).encode("ascii") + b"\n")
        created.append(secret_path)
    for alg, filename in _ASYMMETRIC_FILES.items():
        path = home / filename
        if alg in algorithms and not path.exists():
            from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  (decision 94: not at start-up)
            from cryptography.hazmat.primitives.asymmetric import ed25519, rsa  # noqa: PLC0415  (decision 94)

            key = rsa.generate_private_key(65537, 3072) if alg == "RS256" else ed25519.Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            _create_exclusive(path, pem)
            created.append(path)
    return created


def load_keyring(home: Path) -> KeyRing:
    secret_path = home / SIGNING_KEY_FILE
    try:
        secret = bytes.fromhex(secret_path.read_text(encoding="ascii").strip())
    except (OSError, ValueError) as exc:
        raise ConfigError("signing key missing or unreadable; run `mcp-gateway init`", str(secret_path)) from exc
    if len(secret) < 32:
        raise ConfigError("signing key is shorter than 32 bytes", str(secret_path))
    private: dict[str, Any] = {}
    for alg, filename in _ASYMMETRIC_FILES.items():
        path = home / filename
        if path.exists():
            from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  (decision 94: not at start-up)

            try:
                private[alg] = serialization.load_pem_private_key(path.read_bytes(), password=None)
            except (OSError, ValueError) as exc:
                raise ConfigError("private key unreadable", str(path)) from exc
    return KeyRing(secret, private)


# --- issuing ------------------------------------------------------------------------------


def issue_token(
    keys: KeyRing,
    auth: AuthPolicy,
    user: str,
    *,
    now: float,
    ttl_s: int,
    jti: str,
    workspace: str | None = None,
) -> str:
    import jwt  # noqa: PLC0415  (decision 94: pyjwt and cryptography load at the first token, not at start-up)

    if ttl_s <= 0 or ttl_s > auth.max_ttl_s:
        raise ConfigError(f"--ttl must be between 1 and the policy's max_ttl_s ({auth.max_ttl_s})")
    alg = auth.algorithms[0]
    key = keys.signing_key(alg)
    if key is None:
        raise ConfigError(f"no signing key for {alg}; run `mcp-gateway init` with this policy")
    payload: dict[str, Any] = {
        "sub": user,
        "iss": auth.issuer,
        "aud": auth.audience,
        "iat": int(now),
        "nbf": int(now),
        "exp": int(now) + ttl_s,
        "jti": jti,
    }
    if workspace is not None:
        payload[WORKSPACE_CLAIM] = workspace
    return jwt.encode(payload, key, algorithm=alg)


def jti_of(token: str) -> str:
    """The `jti` a token names, its signature unchecked: what `token revoke` revokes (it trusts nothing else).

    ValueError, worded for the operator, when the text is no JWT or names no string `jti`.
    """
    import jwt  # noqa: PLC0415  (decision 94: pyjwt and cryptography load at the first token, not at start-up)

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise ValueError("that is not a readable token") from exc
    jti = claims.get("jti")
    if isinstance(jti, str):
        return jti
    raise ValueError("the token has no jti")


# --- verifying ----------------------------------------------------------------------------


@cache
def _pyjwt_reasons() -> tuple[tuple[type[Exception], Reason], ...]:
    import jwt  # noqa: PLC0415  (decision 94: pyjwt and cryptography load at the first token, not at start-up)

    return (
        (jwt.InvalidSignatureError, Reason.BAD_SIGNATURE),
        (jwt.InvalidAudienceError, Reason.WRONG_AUDIENCE),
        (jwt.InvalidIssuerError, Reason.WRONG_ISSUER),
        (jwt.MissingRequiredClaimError, Reason.MISSING_CLAIM),
        (jwt.InvalidAlgorithmError, Reason.ALG_NOT_ALLOWED),
        (jwt.InvalidKeyError, Reason.BAD_SIGNATURE),
        (jwt.DecodeError, Reason.TOKEN_MALFORMED),
    )


@dataclass(frozen=True, slots=True)
class EnvToken:
    """The server's MCP_GATEWAY_TOKEN standing in for a call's missing `params.auth` (policy `auth.env_token`).

    Verified like any token at every call; only its absence is told apart, so that the refusal
    names the variable rather than `params.auth`. Its value never shows in a repr.
    """

    value: str | None = field(repr=False)


def env_token(environ: Mapping[str, str]) -> EnvToken:
    return EnvToken(environ.get(TOKEN_ENV, "").strip() or None)


def decode_token(token: object, keys: KeyRing, auth: AuthPolicy) -> dict[str, Any]:
    """Signature, algorithm, issuer, audience and required claims; lifetime is `check_lifetime`'s."""
    import jwt  # noqa: PLC0415  (decision 94: pyjwt and cryptography load at the first token, not at start-up)

    if isinstance(token, EnvToken):
        if token.value is None:
            raise AuthRequiredError(Reason.TOKEN_MISSING, f"{TOKEN_ENV} is not set for the gateway")
        token = token.value
    if not isinstance(token, str) or not token:
        raise AuthRequiredError(Reason.TOKEN_MISSING, "params.auth.token is required")
    if len(token) > MAX_TOKEN_BYTES:
        raise AuthRequiredError(Reason.TOKEN_MALFORMED, "the token is too long")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise AuthRequiredError(Reason.TOKEN_MALFORMED, "the token is not a JWT") from exc
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in auth.algorithms:
        raise AuthRequiredError(Reason.ALG_NOT_ALLOWED, "the token's algorithm is not allowed by the policy")
    key = keys.verification_key(alg)
    if key is None:
        raise AuthRequiredError(Reason.ALG_NOT_ALLOWED, "no verification key for the token's algorithm")
    try:
        return jwt.decode(
            token,
            key,
            algorithms=[alg],
            audience=auth.audience,
            issuer=auth.issuer,
            options={
                "require": list(REQUIRED_CLAIMS),
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
            },
        )
    except jwt.PyJWTError as exc:
        for kind, reason in _pyjwt_reasons():
            if isinstance(exc, kind):
                raise AuthRequiredError(reason, "the token was rejected") from exc
        raise AuthRequiredError(Reason.TOKEN_INVALID, "the token was rejected") from exc


def check_lifetime(payload: Mapping[str, Any], now: float, auth: AuthPolicy) -> Claims:
    """Validate claim types and the token's lifetime against `now` (pure)."""
    return check_window(claims_of(payload), now, auth)


def claims_of(payload: Mapping[str, Any]) -> Claims:
    """The claims' types checked (pure): what a token says, before its lifetime is judged."""
    sub, jti = payload.get("sub"), payload.get("jti")
    iat, exp, nbf = payload.get("iat"), payload.get("exp"), payload.get("nbf")
    workspace = payload.get(WORKSPACE_CLAIM)
    if not isinstance(sub, str) or not sub or not isinstance(jti, str) or not jti:
        raise AuthRequiredError(Reason.CLAIM_INVALID, "sub and jti must be non-empty strings")
    numbers = [iat, exp] + ([] if nbf is None else [nbf])
    # NaN compares false with everything, so a NaN `exp` would never expire: finite numbers only.
    if any(isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n) for n in numbers):
        raise AuthRequiredError(Reason.CLAIM_INVALID, "iat, exp and nbf must be finite numbers")
    if workspace is not None and not isinstance(workspace, str):
        raise AuthRequiredError(Reason.CLAIM_INVALID, "ws must be a string")
    iat, exp = float(payload["iat"]), float(payload["exp"])
    nbf = None if nbf is None else float(nbf)
    return Claims(sub, jti, iat, exp, nbf, workspace)


def check_window(claims: Claims, now: float, auth: AuthPolicy) -> Claims:
    """The token's lifetime against `now` and the policy's max TTL (pure); `claims` when it is within them."""
    iat, exp, nbf = claims.iat, claims.exp, claims.nbf
    leeway = auth.leeway_s
    if now > exp + leeway:
        raise AuthRequiredError(Reason.TOKEN_EXPIRED, "the token has expired")
    if nbf is not None and now + leeway < nbf:
        raise AuthRequiredError(Reason.TOKEN_NOT_YET_VALID, "the token is not valid yet")
    if now + leeway < iat:
        raise AuthRequiredError(Reason.TOKEN_NOT_YET_VALID, "the token was issued in the future")
    if exp - iat > auth.max_ttl_s:
        raise AuthRequiredError(Reason.TOKEN_TTL_TOO_LONG, "the token outlives the policy's max_ttl_s")
    return claims


def require_active_user(user: UserRecord | None, claims: Claims, revoked: bool) -> Principal:
    if revoked:
        raise AuthRequiredError(Reason.TOKEN_REVOKED, "the token has been revoked")
    if user is None:
        raise AuthRequiredError(Reason.USER_UNKNOWN, "the token's user does not exist")
    if user.disabled:
        raise AuthRequiredError(Reason.USER_DISABLED, "the token's user is disabled")
    return Principal(user.name, user.role, user.workspaces, claims.workspace, claims.jti)


class Unknown(enum.Enum):
    TOKEN = "unknown"  # noqa: S105  (a marker, not a password)


UNKNOWN_TOKEN = Unknown.TOKEN
"""`TokenStore.fetch_revoked_at` of a jti no row holds."""

_FETCH_REVOCATION = select(db.tokens.c.revoked_at).where(db.tokens.c.jti == bindparam("jti"))
_FETCH_CALLER = FETCH_USER.add_columns(_FETCH_REVOCATION.scalar_subquery().label("token_revoked_at"))
"""The token's user and its revocation in one statement: one round trip per call on PostgreSQL."""


_CallerRow = namedtuple("_CallerRow", [column.name for column in _FETCH_CALLER.selected_columns])  # type: ignore[misc]  # fields from the statement
"""A row of `_FETCH_CALLER` as the driver's cursor gave it, read by name (`user_from_rows`)."""

VERIFIED_TOKENS = 256
"""Verified tokens an Authenticator remembers (each at most MAX_TOKEN_BYTES: 2 MiB at most)."""


class TokenStore:
    """Issued and revoked token ids (`jti`); the tokens themselves are never stored."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._read = db.reader(engine)

    def record_issued(self, jti: str, user: str, issued_at: float, expires_at: float) -> None:
        with self._engine.begin() as connection:
            connection.execute(
                db.tokens.insert().values(jti=jti, user_name=user, issued_at=issued_at, expires_at=expires_at)
            )

    def revoke(self, jti: str, now: float) -> None:
        """Revoke a jti, known or not (a token minted elsewhere with our key is revocable too)."""
        values = {"jti": jti, "revoked_at": now}
        dialect = self._engine.dialect.name
        insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(db.tokens).values(**values)
        statement = insert.on_conflict_do_update(index_elements=["jti"], set_={"revoked_at": now})
        with self._engine.begin() as connection:
            connection.execute(statement)

    def fetch_revoked_at(self, jti: str) -> float | Unknown | None:
        """When the jti was revoked (None: it is not), or `UNKNOWN_TOKEN` when this gateway never issued
        nor revoked it: `token revoke` of a typo must not look like success."""
        with self._read.connect() as connection:
            row = connection.execute(_FETCH_REVOCATION, {"jti": jti}).one_or_none()
        return UNKNOWN_TOKEN if row is None else row.revoked_at

    def is_revoked(self, jti: str, connection: Connection | None = None) -> bool:
        if connection is None:
            with self._read.connect() as own:
                return self.is_revoked(jti, own)
        revoked_at = connection.execute(_FETCH_REVOCATION, {"jti": jti}).scalar_one_or_none()
        return revoked_at is not None


class Authenticator:
    """Token -> Principal, reading revocation and the user's role from the database at each call."""

    def __init__(
        self, engine: Engine, keys: KeyRing, auth: AuthPolicy, *, tokens: TokenStore, users: UserStore, clock: Clock
    ) -> None:
        self._engine = engine
        self._read = db.reader(engine)
        # The statement compiled once, run on a bare driver cursor (decisions 62, 92): PostgreSQL's in
        # autocommit (db.autocommit_cursor), SQLite's with named parameters (db.sqlite_read_cursor).
        self._on_postgres = db.on_postgres(engine)
        dialect = engine.dialect if self._on_postgres else sqlite.dialect(paramstyle="named")
        self._caller_sql = str(_FETCH_CALLER.compile(dialect=dialect))
        self._keys = keys
        self._verified: dict[str, Claims] = {}
        """Tokens whose signature, algorithm, issuer, audience and claims `decode_token` and `claims_of` accepted
        with these keys and this policy, and their claims (decision 92): the same bytes verify the same way
        again, so a hit skips pyjwt. Their lifetime is checked at every call; revocation and the user are read."""
        self._remembering = threading.Lock()
        self._auth = auth
        self._tokens = tokens
        self._users = users
        self._clock = clock

    def authenticate(self, token: object) -> Principal:
        claims = check_window(self._verify(token), self._clock.now(), self._auth)
        with storage_errors(
            "the user database could not be read (database_unavailable)",
            log=log,
            detail="the user database could not be read",
        ):
            rows = self._fetch_caller(claims)
            # No user: no row to carry the revocation, which is still the first reason to name.
            revoked = rows[0].token_revoked_at is not None if rows else self._tokens.is_revoked(claims.jti)
        return require_active_user(user_from_rows(rows), claims, revoked)

    @property
    def remembered(self) -> int:
        """How many verified tokens this Authenticator remembers now (at most VERIFIED_TOKENS)."""
        return len(self._verified)

    def _verify(self, token: object) -> Claims:
        """`decode_token` then `claims_of`, remembered for a token they accepted (a refusal is never remembered)."""
        if isinstance(token, str):
            known = self._verified.get(token)
            if known is not None:
                return known
        claims = claims_of(decode_token(token, self._keys, self._auth))
        if isinstance(token, str):
            with self._remembering:  # the database threads authenticate side by side
                if len(self._verified) >= VERIFIED_TOKENS:
                    del self._verified[next(iter(self._verified))]  # the oldest: bounded, whatever callers send
                self._verified[token] = claims
        return claims

    def _fetch_caller(self, claims: Claims) -> Sequence[Any]:
        """The token's user (a row per workspace) with the token's revocation: one statement, one round trip."""
        params = {"name": claims.sub, "jti": claims.jti}
        cursor_of = db.autocommit_cursor if self._on_postgres else db.sqlite_read_cursor
        with cursor_of(self._engine) as cursor:
            return [_CallerRow(*row) for row in cursor.execute(self._caller_sql, params).fetchall()]
