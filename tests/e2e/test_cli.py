"""The `mcp-gateway` commands as a person runs them: exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from tests import forked_gateway
from tests.harness import REPO


def gw(
    home: Path,
    *args: str,
    policy: Path | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`mcp-gateway --home HOME --policy POLICY ARGS` in a process of its own (forked: tests/forked_gateway.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")} | (env or {})
    argv = ["--home", str(home), "--policy", str(policy or REPO / "policy.yaml"), *args]
    return forked_gateway.run(argv, env=env, input=stdin, timeout=60)


def gw_without_policy(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`mcp-gateway --home HOME ARGS`: the policy is <home>/policy.yaml, as `init` writes it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")}
    return forked_gateway.run(["--home", str(home), *args], env=env, timeout=60)


def gw_started(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`gw` as a person's shell starts it: `python -m gateway`, a new interpreter importing everything."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")}
    command = [sys.executable, "-m", "gateway", "--home", str(home), "--policy", str(REPO / "policy.yaml"), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, input=stdin, timeout=60, check=False)


def test_a_forked_command_answers_as_a_started_one(tmp_path: Path) -> None:
    """`gw` forks each command from a helper with the gateway imported (tests/forked_gateway.py): for a sample of
    every kind of answer (success, text and JSON on stdout, a refusal, a usage error found after argparse,
    a warning on stderr, a missing state folder), the same exit status, stdout and stderr as `python -m gateway`."""
    started, forked = tmp_path / "started", tmp_path / "forked"
    risky = tmp_path / "risky.yaml"
    risky.write_text((REPO / "policy.yaml").read_text().replace("network: false", "network: true"))
    for args, stdin in (
        (("init",), None),
        (("user", "add", "alice", "--role", "USER"), None),
        (("user", "add", "bob", "--role", "VIEWER", "--password-stdin"), "s3cret\n"),
        (("user", "add", "alice", "--role", "USER"), None),
        (("user", "list"), None),
        (("user", "list", "--format", "json"), None),
        (("token", "issue", "alice", "--ttl", "0"), None),
        (("consent", "list", "--user", "alcie"), None),
        (("policy", "check", str(risky)), None),
        (("policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", '{"test_path":"../x"}'), None),
        (("audit", "verify"), None),
        (("--db", "garbage", "user", "list"), None),
    ):
        by_exec = gw_started(started, *args, stdin=stdin)
        by_fork = gw(forked, *args, stdin=stdin)
        assert (by_fork.returncode, by_fork.stdout, by_fork.stderr.replace(str(forked), "HOME")) == (
            by_exec.returncode, by_exec.stdout, by_exec.stderr.replace(str(started), "HOME"),
        ), args  # fmt: skip
    nothing = tmp_path / "nothing-here"
    by_exec, by_fork = gw_started(nothing, "user", "list"), gw(nothing, "user", "list")
    assert (by_fork.returncode, by_fork.stderr) == (by_exec.returncode, by_exec.stderr) == (1, by_exec.stderr)


def test_init_is_idempotent_and_keeps_the_key(tmp_path: Path) -> None:
    home = tmp_path / "state"
    first = gw(home, "init")
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""
    key = home / "signing.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    before = key.read_bytes()
    assert gw(home, "init").returncode == 0
    assert key.read_bytes() == before
    assert (home / "gateway.db").is_file() and (home / "artifacts").is_dir()


def test_users_and_tokens_round_trip(tmp_path: Path) -> None:
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    assert gw(home, "user", "add", "bob", "--role", "VIEWER", "--password-stdin", stdin="s3cret\n").returncode == 0
    listing = gw(home, "user", "list").stdout.splitlines()
    assert listing == ["alice\tUSER\tactive\tdefault", "bob\tVIEWER\tactive\tdefault"]
    issued = gw(home, "token", "issue", "alice", "--ttl", "120")
    assert issued.returncode == 0
    token = issued.stdout.strip()
    assert issued.stdout == token + "\n", "the token alone on stdout"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["sub"] == "alice" and claims["exp"] - claims["iat"] == 120
    assert {"iss", "aud", "iat", "exp", "jti", "nbf"} <= set(claims)
    assert gw(home, "user", "set-role", "alice", "ADMIN").returncode == 0
    assert gw(home, "user", "disable", "bob").returncode == 0
    assert gw(home, "user", "list").stdout.splitlines() == [
        "alice\tADMIN\tactive\tdefault",
        "bob\tVIEWER\tdisabled\tdefault",
    ]
    revoked = gw(home, "token", "revoke", claims["jti"])
    assert revoked.returncode == 0 and claims["jti"] in revoked.stderr
    events = [line for line in gw(home, "audit", "export").stdout.splitlines()]
    assert any('"TOKEN_ISSUED"' in e for e in events) and any('"TOKEN_REVOKED"' in e for e in events)
    assert all(token not in e and "s3cret" not in e for e in events)


def test_refused_operations_exit_1_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    for args in (
        ("user", "add", "alice", "--role", "USER"),
        ("user", "add", "carol", "--role", "SUPERUSER"),
        ("user", "add", "carol", "--role", "USER", "--workspace", "nowhere"),
        ("user", "disable", "nobody"),
        ("user", "set-role", "alice", "KING"),
        ("token", "issue", "nobody"),
        ("token", "issue", "alice", "--workspace", "elsewhere"),
    ):
        result = gw(home, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ((), ("user",), ("user", "add", "x"), ("token", "issue", "a", "--ttl", "ten"), ("frobnicate",)):
        result = gw(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)


def test_values_read_after_argparse_are_usage_errors_naming_the_flag(tmp_path: Path) -> None:
    """Dates, durations, JSON, lifetimes, ports, paths, URLs and names of the wrong form: exit 2, as
    argparse answers an int that is not one, in one line that names the flag and the form it takes."""
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    for args, flag, form in (
        (("audit", "export", "--since", "garbage"), "--since", "ISO 8601"),
        (("audit", "export", "--since", "2026-13-45"), "--since", "ISO 8601"),
        (("audit", "export", "--since", "99999-01-01T00:00:00"), "--since", "ISO 8601"),
        (("consent", "grant", "alice", "run_pytest", "--deny", "--expires-in", "5x"), "--expires-in", "7d"),
        (("consent", "grant", "alice", "run_pytest", "--deny", "--expires-in", "0"), "--expires-in", "7d"),
        (("consent", "grant", "alice", "run_pytest", "--deny", "--expires-in", "9" * 400 + "d"), "--expires-in", ""),
        (("consent", "grant", "alice", "run_pytest", "--deny", "--args", "{not json"), "--args", "JSON object"),
        (("consent", "grant", "alice", "run_pytest", "--deny", "--args", "[1]"), "--args", "JSON object"),
        (("policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", "{not json"), "--args", "JSON"),
        (("policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", '"x"'), "--args", "JSON object"),
        (("policy", "explain", "--user", "alice", "--tool", "run_pytest", "--workspace", "w"), "--workspace", "--role"),
        (("token", "issue", "alice", "--ttl", "0"), "--ttl", "max_ttl_s"),
        (("token", "issue", "alice", "--ttl", "-5"), "--ttl", "max_ttl_s"),
        (("token", "issue", "alice", "--ttl", "999999"), "--ttl", "max_ttl_s"),
        (("token", "revoke", "a.b.c"), "TOKEN_OR_JTI", "token issue"),
        (("user", "add", "bad\x1bname", "--role", "USER"), "NAME", "control characters"),
        (("console", "--port", "99999"), "--port", "0 to 65535"),
        (("console", "--port", "-1"), "--port", "0 to 65535"),
        (
            ("console", "--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(tmp_path / "none.key")),
            "--tls-cert",
            "PEM",
        ),
        (("console", "--tls-cert", str(not_a_folder), "--tls-key", str(not_a_folder)), "--tls-cert", "PEM"),
        (("--db", "garbage", "user", "list"), "--db", "sqlite:///"),
        (("--home", str(not_a_folder), "user", "list"), "--home", "not a folder"),
    ):
        result = gw(home, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert flag in result.stderr and form in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
        if args[0] != "console" or "--port" not in args:  # argparse's own: a usage line, then the error
            assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    bare = tmp_path / "bare"
    for args, flag in (
        (("init", "--workspace", str(tmp_path / "nowhere")), "--workspace"),
        (("init", "--workspace", str(not_a_folder)), "--workspace"),
    ):
        result = gw_without_policy(bare, *args)
        assert result.returncode == 2 and flag in result.stderr and "folder" in result.stderr, (args, result.stderr)
    from_env = gw(home, "user", "list", env={"MCP_GATEWAY_DB": "not a url"})
    assert from_env.returncode == 2 and "MCP_GATEWAY_DB" in from_env.stderr, from_env.stderr


def test_names_and_ids_that_match_nothing_exit_1_saying_so(tmp_path: Path) -> None:
    """A typo must never read as success (or, for `policy explain`, as a refusal a CI gate expects)."""
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    token = gw(home, "token", "issue", "alice").stdout.strip()
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    elsewhere = tmp_path / "elsewhere"
    assert (
        gw(elsewhere, "init").returncode == 0
        and gw(elsewhere, "user", "add", "alice", "--role", "USER").returncode == 0
    )
    foreign = gw(elsewhere, "token", "issue", "alice").stdout.strip()
    for args, words in (
        (("token", "revoke", jti[:-1]), "nothing revoked"),
        (("token", "revoke", jti + "x"), "audit export"),
        (("token", "revoke", foreign), "not issued here"),
        (("consent", "revoke", "99"), "no stored decision 99"),
        (("consent", "list", "--user", "alcie"), "no user named 'alcie'"),
        (("consent", "grant", "alcie", "run_pytest", "--deny"), "unknown user 'alcie'"),
        (("user", "disable", "alcie"), "no user named 'alcie'"),
        (("user", "set-role", "alcie", "USER"), "no user named 'alcie'"),
        (("user", "passwd", "alcie"), "no user named 'alcie'"),
        (("token", "issue", "alcie"), "no user named 'alcie'"),
    ):
        result = gw(home, *args, stdin="pw\n")
        assert result.returncode == 1, (args, result.stderr)
        assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    events = gw(home, "audit", "export").stdout
    assert '"TOKEN_REVOKED"' not in events, "nothing matched: nothing revoked, nothing logged"
    still = gw(home, "policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", '{"test_path":"t"}')
    assert still.returncode in (0, 3) and "alcie" not in still.stderr


@pytest.mark.parametrize(
    ("args", "stage", "code"),
    [
        (("--user", "alcie", "--tool", "run_pytest"), "authenticate", "-32001"),
        (("--user", "alice", "--tool", "run_pytets"), "authorize", "-32602"),
        (("--role", "USER", "--tool", "run_pytets"), "authorize", "-32602"),
    ],
)
def test_policy_explain_of_an_unknown_user_or_tool_is_the_refusal_the_call_would_get(
    tmp_path: Path, args: tuple[str, ...], stage: str, code: str
) -> None:
    """The dry run answers as the call would: refused (exit 3), at the stage that names the unknown name."""
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    explained = gw(home, "policy", "explain", *args, "--args", '{"test_path":"tests"}')
    assert explained.returncode == 3, explained.stdout + explained.stderr
    refused = [line for line in explained.stdout.splitlines() if code in line]
    assert refused and refused[0].split()[0] == stage, explained.stdout
    assert "Traceback" not in explained.stderr


def test_token_revoke_by_jti_by_token_and_again(tmp_path: Path) -> None:
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    first, second = (gw(home, "token", "issue", "alice").stdout.strip() for _ in range(2))
    jti = jwt.decode(first, options={"verify_signature": False})["jti"]
    by_jti = gw(home, "token", "revoke", jti)
    assert by_jti.returncode == 0 and f"revoked token {jti}" in by_jti.stderr
    again = gw(home, "token", "revoke", first)
    assert again.returncode == 0 and "revoked already" in again.stderr, again.stderr
    assert gw(home, "token", "revoke", second).returncode == 0
    assert gw(home, "audit", "export").stdout.count('"TOKEN_REVOKED"') == 2, "once per token"


def test_commands_before_init_fail_cleanly(tmp_path: Path) -> None:
    result = gw(tmp_path / "nothing-here", "user", "list")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "init" in result.stderr


def test_policy_check_valid_warnings_and_invalid(tmp_path: Path) -> None:
    ok = gw(tmp_path, "policy", "check")
    assert ok.returncode == 0 and "valid (0 warnings)" in ok.stdout
    risky = tmp_path / "risky.yaml"
    risky.write_text(
        (REPO / "policy.yaml")
        .read_text()
        .replace("enabled: true", "enabled: false")
        .replace("network: false", "network: true")
        .replace("allowed_paths: []", "allowed_paths: [/]")
        .replace("env_whitelist: [PATH, LANG, LC_ALL]", "env_whitelist: [PATH, AWS_SECRET_ACCESS_KEY]")
    )
    warned = gw(tmp_path, "policy", "check", str(risky))
    assert warned.returncode == 0
    for needle in ("sandbox.enabled is false", "network", "'/'", "AWS_SECRET_ACCESS_KEY"):
        assert needle in warned.stderr, needle
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (REPO / "policy.yaml").read_text().replace("  VIEWER: [ARTIFACT_READ]", "  VIEWER: [ARTIFACT_READ, DELETE_ALL]")
    )
    bad = gw(tmp_path, "policy", "check", str(broken))
    assert bad.returncode == 1
    line = broken.read_text().splitlines().index("  VIEWER: [ARTIFACT_READ, DELETE_ALL]") + 1
    assert bad.stderr.startswith(f"{broken}:{line}: ") and "DELETE_ALL" in bad.stderr


def test_policy_explain_walks_the_stages(tmp_path: Path) -> None:
    home = tmp_path / "state"
    assert gw(home, "init").returncode == 0
    assert gw(home, "user", "add", "vic", "--role", "VIEWER").returncode == 0
    assert gw(home, "user", "add", "alice", "--role", "USER").returncode == 0
    viewer = gw(home, "policy", "explain", "--user", "vic", "--tool", "run_pytest", "--args", '{"test_path":"tests"}')
    assert viewer.returncode == 3, "refused: exit 3, for a CI gate"
    assert "authorize    -32003 missing_permission" in viewer.stdout
    assert viewer.stdout.strip().endswith("refused with -32003")
    escaping = gw(
        home, "policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", '{"test_path":"../x"}'
    )
    assert "policy       -32004 path_outside_workspace" in escaping.stdout
    assert escaping.returncode == 3
    fine = gw(home, "policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", '{"test_path":"tests"}')
    assert fine.stdout.strip().endswith("would run")
    assert fine.returncode == 0
    assert [line.split()[0] for line in fine.stdout.splitlines()[:-1]] == [
        "authenticate", "authorize", "policy", "validate", "preflight", "budget", "sandbox", "consent",
    ]  # fmt: skip


def test_version_prints_the_version_without_loading_the_commands(tmp_path: Path) -> None:
    from gateway import __version__

    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gateway", "--version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{__version__}\n"
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if "|" in line}
    heavy = {"gateway.cli.commands", "sqlalchemy", "mcp", "yaml", "jwt"} & imported
    assert not heavy, f"--version imported {heavy}"
