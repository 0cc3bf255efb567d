"""gateway/auth.py: token decoding, the lifetime check with an injected `now`, the stores, the keys."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import stat
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from sqlalchemy import Engine

from gateway.auth import (
    MAX_TOKEN_BYTES,
    REQUIRED_CLAIMS,
    VERIFIED_TOKENS,
    Authenticator,
    EnvToken,
    KeyRing,
    Principal,
    TokenStore,
    check_lifetime,
    decode_token,
    ensure_keys,
    env_token,
    issue_token,
    jti_of,
    load_keyring,
)
from gateway.clock import new_token_id
from gateway.errors import AuthRequiredError, ConfigError
from gateway.policy import AuthPolicy
from gateway.users import UserStore
from tests.fakes import T0, FakeClock

SECRET = b"s" * 64  # long enough for HS512, so pyjwt does not warn
AUTH = AuthPolicy()  # issuer and audience "mcp-gateway", HS256, leeway 30 s, max TTL 86400 s


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(65537, 2048)


@pytest.fixture(scope="module")
def keys(rsa_key: rsa.RSAPrivateKey) -> KeyRing:
    return KeyRing(SECRET, {"RS256": rsa_key, "EdDSA": ed25519.Ed25519PrivateKey.generate()})


def payload(**changes: Any) -> dict[str, Any]:
    """Valid claims for alice at T0, with `changes` applied (a value of ... drops the claim)."""
    claims: dict[str, Any] = {
        "sub": "alice",
        "iss": "mcp-gateway",
        "aud": "mcp-gateway",
        "iat": int(T0),
        "nbf": int(T0),
        "exp": int(T0) + 3600,
        "jti": "jti-1",
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not ...}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def hand_made(header: dict[str, Any], claims: dict[str, Any], key: bytes | None = None) -> str:
    """A JWT built without pyjwt, so it can carry what pyjwt refuses to produce."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    signature = b"" if key is None else hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


def reason_of(token: object, keys: KeyRing, auth: AuthPolicy = AUTH) -> str:
    with pytest.raises(AuthRequiredError) as caught:
        decode_token(token, keys, auth)
    assert caught.value.code == -32001
    return caught.value.reason


# --- decode_token --------------------------------------------------------------------------


def test_valid_token_decodes_to_its_claims(keys: KeyRing) -> None:
    token = jwt.encode(payload(ws="team-a"), SECRET, algorithm="HS256")

    assert decode_token(token, keys, AUTH) == payload(ws="team-a")


def test_valid_rs256_and_eddsa_tokens_decode(keys: KeyRing) -> None:
    auth = AuthPolicy(algorithms=("RS256", "EdDSA"))
    for alg in ("RS256", "EdDSA"):
        token = jwt.encode(payload(), keys.signing_key(alg), algorithm=alg)
        assert decode_token(token, keys, auth)["sub"] == "alice"


def test_signature_by_another_hmac_key_is_rejected(keys: KeyRing) -> None:
    token = jwt.encode(payload(), b"x" * 64, algorithm="HS256")

    assert reason_of(token, keys) == "bad_signature"


def test_signature_by_another_rsa_key_is_rejected(keys: KeyRing) -> None:
    other = rsa.generate_private_key(65537, 2048)
    token = jwt.encode(payload(), other, algorithm="RS256")

    assert reason_of(token, keys, AuthPolicy(algorithms=("RS256",))) == "bad_signature"


def test_tampered_payload_is_rejected(keys: KeyRing) -> None:
    header, _, signature = jwt.encode(payload(), SECRET, algorithm="HS256").split(".")
    forged = f"{header}.{b64url(json.dumps(payload(sub='root')).encode())}.{signature}"

    assert reason_of(forged, keys) == "bad_signature"


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
@pytest.mark.parametrize(
    "algorithms",
    [("HS256",), ("RS256",), ("HS256", "RS256")],
)
def test_alg_none_is_never_accepted(keys: KeyRing, alg: str, algorithms: tuple[str, ...]) -> None:
    token = hand_made({"alg": alg, "typ": "JWT"}, payload())

    assert token.endswith(".")  # the empty signature of an unsecured JWT
    assert reason_of(token, keys, AuthPolicy(algorithms=algorithms)) == "alg_not_allowed"


def test_alg_none_is_refused_even_if_a_policy_object_names_it(keys: KeyRing) -> None:
    # parse_policy never builds this, but decode_token must not depend on that.
    token = hand_made({"alg": "none"}, payload())

    assert reason_of(token, keys, AuthPolicy(algorithms=("none",))) == "alg_not_allowed"


@pytest.mark.parametrize(
    ("algorithms", "reason"),
    [
        pytest.param(("RS256",), "alg_not_allowed", id="hs256-not-in-policy"),
        pytest.param(("HS256", "RS256"), "bad_signature", id="hs256-checked-with-the-hmac-secret-only"),
    ],
)
def test_hs_rs_confusion_fails(
    keys: KeyRing, rsa_key: rsa.RSAPrivateKey, algorithms: tuple[str, ...], reason: str
) -> None:
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forged = hand_made({"alg": "HS256", "typ": "JWT"}, payload(sub="root"), key=public_pem)

    assert reason_of(forged, keys, AuthPolicy(algorithms=algorithms)) == reason


def test_algorithm_outside_the_policy_is_rejected(keys: KeyRing) -> None:
    token = jwt.encode(payload(), SECRET, algorithm="HS512")

    assert reason_of(token, keys) == "alg_not_allowed"


def test_allowed_algorithm_without_a_key_is_rejected() -> None:
    keys = KeyRing(SECRET, {})
    token = jwt.encode(payload(), ed25519.Ed25519PrivateKey.generate(), algorithm="EdDSA")

    assert reason_of(token, keys, AuthPolicy(algorithms=("HS256", "EdDSA"))) == "alg_not_allowed"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"iss": "someone-else"}, "wrong_issuer"),
        ({"aud": "someone-else"}, "wrong_audience"),
        ({"aud": ["someone-else", "another"]}, "wrong_audience"),
        ({"jti": 7}, "token_invalid"),
        ({"sub": 7}, "token_invalid"),
    ],
)
def test_wrong_claims_are_rejected(keys: KeyRing, changes: dict[str, Any], reason: str) -> None:
    token = jwt.encode(payload(**changes), SECRET, algorithm="HS256")

    assert reason_of(token, keys) == reason


@pytest.mark.parametrize("claim", REQUIRED_CLAIMS)
def test_missing_required_claim_is_rejected(keys: KeyRing, claim: str) -> None:
    token = jwt.encode(payload(**{claim: ...}), SECRET, algorithm="HS256")

    assert reason_of(token, keys) == "missing_claim"


def test_required_claims_are_the_spec_list() -> None:
    assert set(REQUIRED_CLAIMS) == {"sub", "iss", "aud", "iat", "exp", "jti"}


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        pytest.param(None, "token_missing", id="none"),
        pytest.param(12345, "token_missing", id="int"),
        pytest.param(b"a.b.c", "token_missing", id="bytes"),
        pytest.param({"token": "x"}, "token_missing", id="dict"),
        pytest.param("", "token_missing", id="empty"),
        pytest.param("not a jwt", "token_malformed", id="garbage"),
        pytest.param("a.b.c", "token_malformed", id="three-bad-parts"),
        pytest.param("x" * (MAX_TOKEN_BYTES + 1), "token_malformed", id="oversized"),
    ],
)
def test_unusable_token_values_are_rejected(keys: KeyRing, token: object, reason: str) -> None:
    assert reason_of(token, keys) == reason


def test_env_token_decodes_like_the_same_token_sent_in_params(keys: KeyRing) -> None:
    token = jwt.encode(payload(), SECRET, algorithm="HS256")

    assert decode_token(EnvToken(token), keys, AUTH) == decode_token(token, keys, AUTH)
    assert reason_of(EnvToken("not a jwt"), keys) == reason_of("not a jwt", keys) == "token_malformed"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_env_token_is_missing_and_names_the_variable(keys: KeyRing, value: str | None) -> None:
    environ = {} if value is None else {"MCP_GATEWAY_TOKEN": value}

    with pytest.raises(AuthRequiredError) as caught:
        decode_token(env_token(environ), keys, AUTH)
    assert caught.value.reason == "token_missing"
    assert caught.value.public_message() == "Authentication required: MCP_GATEWAY_TOKEN is not set for the gateway"


def test_env_token_never_shows_its_value() -> None:
    token = jwt.encode(payload(), SECRET, algorithm="HS256")

    assert token not in repr(EnvToken(token)) and token not in str(EnvToken(token))


def test_oversized_but_otherwise_valid_token_is_rejected(keys: KeyRing) -> None:
    token = jwt.encode(payload(pad="p" * MAX_TOKEN_BYTES), SECRET, algorithm="HS256")

    assert reason_of(token, keys) == "token_malformed"


def token_of_length(length: int) -> str:
    """A valid HS256 token exactly `length` characters long (base64 steps by 1 or 2, so vary two claims)."""
    for jti_length in (1, 2, 3):
        for pad in range(length * 3 // 4 - 400, length * 3 // 4):
            token = jwt.encode(payload(pad="p" * pad, jti="j" * jti_length), SECRET, algorithm="HS256")
            if len(token) == length:
                return token
    raise AssertionError(f"no token of length {length}")


def test_token_at_the_size_limit_is_accepted(keys: KeyRing) -> None:
    token = token_of_length(MAX_TOKEN_BYTES)

    assert decode_token(token, keys, AUTH)["sub"] == "alice"


# --- check_lifetime ------------------------------------------------------------------------

EXP = T0 + 3600


@pytest.mark.parametrize(
    ("now", "changes"),
    [
        pytest.param(T0, {}, id="at-issue"),
        pytest.param(EXP, {}, id="at-exp"),
        pytest.param(EXP + 30, {}, id="exp-plus-leeway"),
        pytest.param(T0 - 30, {}, id="nbf-minus-leeway"),
        pytest.param(T0, {"nbf": ...}, id="no-nbf"),
        pytest.param(T0, {"nbf": int(T0) + 30, "iat": int(T0)}, id="nbf-within-leeway"),
        pytest.param(T0, {"iat": int(T0) + 30, "nbf": ...}, id="iat-within-leeway"),
        pytest.param(T0, {"exp": int(T0) + 86400}, id="ttl-exactly-max"),
        pytest.param(T0, {"iat": T0 + 0.5, "exp": EXP + 0.25, "nbf": T0 - 0.5}, id="float-times"),
    ],
)
def test_lifetime_accepts(now: float, changes: dict[str, Any]) -> None:
    claims = check_lifetime(payload(**changes), now, AUTH)

    assert claims.sub == "alice"
    assert claims.jti == "jti-1"


@pytest.mark.parametrize(
    ("now", "changes", "reason"),
    [
        pytest.param(EXP + 30.001, {}, "token_expired", id="just-beyond-leeway"),
        pytest.param(EXP + 31, {}, "token_expired", id="beyond-leeway"),
        pytest.param(EXP + 10**6, {}, "token_expired", id="long-expired"),
        pytest.param(T0 - 30.001, {}, "token_not_yet_valid", id="before-nbf-minus-leeway"),
        pytest.param(T0, {"nbf": int(T0) + 31}, "token_not_yet_valid", id="nbf-in-future"),
        pytest.param(T0, {"iat": int(T0) + 31, "nbf": ...}, "token_not_yet_valid", id="iat-in-future"),
        pytest.param(T0, {"exp": int(T0) + 86401}, "token_ttl_too_long", id="ttl-over-max"),
        pytest.param(T0, {"sub": ""}, "claim_invalid", id="empty-sub"),
        pytest.param(T0, {"sub": ...}, "claim_invalid", id="no-sub"),
        pytest.param(T0, {"jti": ""}, "claim_invalid", id="empty-jti"),
        pytest.param(T0, {"jti": 3}, "claim_invalid", id="int-jti"),
        pytest.param(T0, {"exp": "9999999999"}, "claim_invalid", id="string-exp"),
        pytest.param(T0, {"exp": True}, "claim_invalid", id="bool-exp"),
        pytest.param(T0, {"iat": None}, "claim_invalid", id="null-iat"),
        pytest.param(T0, {"nbf": "0"}, "claim_invalid", id="string-nbf"),
        pytest.param(T0, {"exp": float("nan")}, "claim_invalid", id="nan-exp"),
        pytest.param(T0, {"iat": float("nan")}, "claim_invalid", id="nan-iat"),
        pytest.param(T0, {"nbf": float("nan")}, "claim_invalid", id="nan-nbf"),
        pytest.param(T0, {"exp": float("inf")}, "claim_invalid", id="infinite-exp"),
        pytest.param(T0, {"iat": float("-inf")}, "claim_invalid", id="minus-infinite-iat"),
        pytest.param(T0, {"ws": 5}, "claim_invalid", id="int-workspace"),
    ],
)
def test_lifetime_rejects(now: float, changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(AuthRequiredError) as caught:
        check_lifetime(payload(**changes), now, AUTH)

    assert caught.value.reason == reason


def test_lifetime_uses_the_policys_leeway() -> None:
    strict = AuthPolicy(leeway_s=0)

    check_lifetime(payload(), EXP, strict)
    with pytest.raises(AuthRequiredError, match="token_expired"):
        check_lifetime(payload(), EXP + 0.001, strict)


def test_lifetime_returns_typed_claims() -> None:
    claims = check_lifetime(payload(ws="team-a"), T0, AUTH)

    assert (claims.iat, claims.exp, claims.nbf, claims.workspace) == (T0, EXP, T0, "team-a")
    assert check_lifetime(payload(nbf=...), T0, AUTH).nbf is None


def test_a_token_signed_with_a_nan_expiry_does_not_live_forever(keys: KeyRing) -> None:
    # pyjwt's JSON decoder reads NaN; only the lifetime check stands between it and "never expires".
    token = jwt.encode(payload(exp=float("nan")), SECRET, algorithm="HS256")

    with pytest.raises(AuthRequiredError) as caught:
        check_lifetime(decode_token(token, keys, AUTH), T0 + 10**9, AUTH)
    assert caught.value.reason == "claim_invalid"


# --- issue_token ---------------------------------------------------------------------------


@pytest.mark.parametrize("ttl_s", [0, -1, AUTH.max_ttl_s + 1])
def test_issue_refuses_a_ttl_outside_the_policy(keys: KeyRing, ttl_s: int) -> None:
    with pytest.raises(ConfigError, match="--ttl"):
        issue_token(keys, AUTH, "alice", now=T0, ttl_s=ttl_s, jti="j")


@pytest.mark.parametrize("algorithms", [("HS256",), ("RS256",), ("EdDSA", "HS256")])
def test_issued_token_round_trips(keys: KeyRing, algorithms: tuple[str, ...]) -> None:
    auth = AuthPolicy(algorithms=algorithms)
    token = issue_token(keys, auth, "alice", now=T0, ttl_s=AUTH.max_ttl_s, jti="j9", workspace="team-a")

    assert jwt.get_unverified_header(token)["alg"] == algorithms[0]
    claims = check_lifetime(decode_token(token, keys, auth), T0, auth)
    assert (claims.sub, claims.jti, claims.workspace, claims.exp) == ("alice", "j9", "team-a", T0 + AUTH.max_ttl_s)


def test_issue_without_a_key_for_the_algorithm_fails() -> None:
    with pytest.raises(ConfigError, match="no signing key for RS256"):
        issue_token(KeyRing(SECRET, {}), AuthPolicy(algorithms=("RS256",)), "alice", now=T0, ttl_s=60, jti="j")


# --- TokenStore ----------------------------------------------------------------------------


def test_token_store_revocation(engine: Engine) -> None:
    tokens = TokenStore(engine)
    tokens.record_issued("issued", "alice", T0, T0 + 60)

    assert not tokens.is_revoked("issued")
    assert not tokens.is_revoked("never-seen")

    tokens.revoke("issued", T0 + 1)
    tokens.revoke("minted-elsewhere", T0 + 2)

    assert tokens.is_revoked("issued")
    assert tokens.is_revoked("minted-elsewhere")
    assert not tokens.is_revoked("never-seen")


def test_revoking_twice_keeps_the_token_revoked(engine: Engine) -> None:
    tokens = TokenStore(engine)

    tokens.revoke("j", T0)
    tokens.revoke("j", T0 + 5)

    assert tokens.is_revoked("j")


# --- Authenticator -------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def users(engine: Engine, clock: FakeClock) -> UserStore:
    store = UserStore(engine, clock)
    store.add("alice", "USER", ("team-a", "team-b"))
    return store


@pytest.fixture
def authenticator(keys: KeyRing, engine: Engine, users: UserStore, clock: FakeClock) -> Authenticator:
    return Authenticator(engine, keys, AUTH, tokens=TokenStore(engine), users=users, clock=clock)


def token_for(keys: KeyRing, user: str, jti: str = "j1", workspace: str | None = None) -> str:
    return issue_token(keys, AUTH, user, now=T0, ttl_s=600, jti=jti, workspace=workspace)


def test_authenticate_gives_the_principal(authenticator: Authenticator, keys: KeyRing) -> None:
    principal = authenticator.authenticate(token_for(keys, "alice", workspace="team-b"))

    assert principal == Principal("alice", "USER", ("team-a", "team-b"), "team-b", "j1")


def test_unknown_user_is_rejected(authenticator: Authenticator, keys: KeyRing) -> None:
    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(token_for(keys, "mallory"))
    assert caught.value.reason == "user_unknown"


def test_disabled_user_is_rejected_at_the_next_call(
    authenticator: Authenticator, keys: KeyRing, users: UserStore
) -> None:
    token = token_for(keys, "alice")
    authenticator.authenticate(token)

    users.disable("alice")

    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(token)
    assert caught.value.reason == "user_disabled"


def test_revoked_jti_is_rejected(authenticator: Authenticator, keys: KeyRing, engine: Engine) -> None:
    revoked, other = token_for(keys, "alice", "j-revoked"), token_for(keys, "alice", "j-other")
    TokenStore(engine).revoke("j-revoked", T0)

    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(revoked)
    assert caught.value.reason == "token_revoked"
    assert authenticator.authenticate(other).jti == "j-other"


def test_role_is_read_at_each_call(authenticator: Authenticator, keys: KeyRing, users: UserStore) -> None:
    token = token_for(keys, "alice")
    assert authenticator.authenticate(token).role == "USER"

    users.set_role("alice", "VIEWER")

    assert authenticator.authenticate(token).role == "VIEWER"


def test_authenticator_reads_the_injected_clock(authenticator: Authenticator, keys: KeyRing, clock: FakeClock) -> None:
    token = token_for(keys, "alice")  # valid from T0 to T0 + 600, leeway 30
    clock.set(T0 + 630)
    authenticator.authenticate(token)

    clock.advance(1)

    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(token)
    assert caught.value.reason == "token_expired"


def test_a_token_revoked_after_it_was_accepted_is_refused_at_the_next_call(
    authenticator: Authenticator, keys: KeyRing, engine: Engine
) -> None:
    # The verified token is remembered (decision 92); its revocation is read at every call all the same.
    token = token_for(keys, "alice", "j-later")
    assert authenticator.authenticate(token).jti == "j-later"
    assert authenticator.authenticate(token).jti == "j-later"

    TokenStore(engine).revoke("j-later", T0)

    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(token)
    assert caught.value.reason == "token_revoked"


@pytest.mark.parametrize("part", [0, 1, 2])
def test_a_remembered_token_changed_in_any_part_is_verified_anew(
    authenticator: Authenticator, keys: KeyRing, part: int
) -> None:
    token = token_for(keys, "alice")
    authenticator.authenticate(token)
    parts = token.split(".")
    forged = payload(sub="mallory") if part == 1 else None
    if forged is not None:
        parts[1] = b64url(json.dumps(forged).encode())
    else:
        parts[part] = parts[part][:-2] + ("AA" if not parts[part].endswith("AA") else "BB")
    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(".".join(parts))
    assert caught.value.reason in {"bad_signature", "token_malformed"}


def test_remembered_tokens_are_bounded_and_a_refusal_is_never_remembered(
    authenticator: Authenticator, keys: KeyRing
) -> None:
    for index in range(VERIFIED_TOKENS + 40):
        authenticator.authenticate(token_for(keys, "alice", f"j{index}"))
    assert authenticator.remembered == VERIFIED_TOKENS
    bad = token_for(keys, "alice")[:-2] + "AA"
    for _ in range(2):
        with pytest.raises(AuthRequiredError):
            authenticator.authenticate(bad)
    assert authenticator.remembered == VERIFIED_TOKENS
    first = token_for(keys, "alice", "j0")  # pushed out long ago: verified again, and accepted
    assert authenticator.authenticate(first).jti == "j0"


def test_authenticator_checks_the_signature_first(authenticator: Authenticator) -> None:
    with pytest.raises(AuthRequiredError) as caught:
        authenticator.authenticate(hand_made({"alg": "none"}, payload()))
    assert caught.value.reason == "alg_not_allowed"


# --- keys ----------------------------------------------------------------------------------


def test_ensure_keys_creates_a_private_signing_key_once(tmp_path: Path) -> None:
    key_path = tmp_path / "signing.key"

    assert ensure_keys(tmp_path, ("HS256",)) == [key_path]
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    first = key_path.read_bytes()
    assert len(load_keyring(tmp_path).hmac_secret) >= 32

    assert ensure_keys(tmp_path, ("HS256",)) == []
    assert key_path.read_bytes() == first


def test_ensure_keys_never_overwrites_an_existing_key(tmp_path: Path) -> None:
    key_path = tmp_path / "signing.key"
    mine = (b"ab" * 40) + b"\n"
    key_path.write_bytes(mine)

    assert ensure_keys(tmp_path, ("HS256",)) == []
    assert key_path.read_bytes() == mine
    assert load_keyring(tmp_path).hmac_secret == bytes.fromhex("ab" * 40)


def test_ensure_keys_adds_a_key_pair_for_a_public_key_algorithm(tmp_path: Path) -> None:
    ensure_keys(tmp_path, ("HS256",))
    hmac_key = (tmp_path / "signing.key").read_bytes()

    created = ensure_keys(tmp_path, ("HS256", "EdDSA"))

    assert created == [tmp_path / "signing-eddsa.pem"]
    assert stat.S_IMODE(created[0].stat().st_mode) == 0o600
    assert (tmp_path / "signing.key").read_bytes() == hmac_key
    assert not (tmp_path / "signing-rs256.pem").exists()
    ring = load_keyring(tmp_path)
    assert set(ring.private_keys) == {"EdDSA"}
    assert ensure_keys(tmp_path, ("HS256", "EdDSA")) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "signing key missing"),
        (b"not hex\n", "signing key missing or unreadable"),
        (b"ab" * 31 + b"\n", "shorter than 32 bytes"),
    ],
)
def test_load_keyring_refuses_a_bad_signing_key(tmp_path: Path, content: bytes | None, message: str) -> None:
    if content is not None:
        (tmp_path / "signing.key").write_bytes(content)

    with pytest.raises(ConfigError, match=message):
        load_keyring(tmp_path)


def test_token_ids_never_look_like_options() -> None:
    # `mcp-gateway token revoke JTI`: a jti starting with "-" would be read as a flag (it was, 1 in 32).
    ids = {new_token_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[0-9a-f]{32}", jti) for jti in ids)


def test_jti_of_reads_the_jti_without_the_key() -> None:
    token = jwt.encode({"jti": "j-1", "sub": "alice"}, b"another key " * 4, algorithm="HS256")
    assert jti_of(token) == "j-1"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("a.b.c", "that is not a readable token"),
        (jwt.encode({"sub": "x"}, SECRET, algorithm="HS256"), "the token has no jti"),
    ],
)
def test_jti_of_refuses_what_names_no_jti(token: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        jti_of(token)
