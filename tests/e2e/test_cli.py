"""The `mcp-gateway` commands as a person runs them: exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import jwt

from tests.harness import REPO


def gw(
    home: Path, *args: str, policy: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_GATEWAY")}
    command = [
        sys.executable,
        "-m",
        "gateway",
        "--home",
        str(home),
        "--policy",
        str(policy or REPO / "policy.yaml"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, input=stdin, timeout=60, check=False)


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
        ("token", "issue", "alice", "--ttl", "999999"),
        ("token", "issue", "alice", "--workspace", "elsewhere"),
        ("policy", "explain", "--user", "alice", "--tool", "run_pytest", "--args", "{not json"),
        ("audit", "export", "--since", "yesterday"),
    ):
        result = gw(home, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ((), ("user",), ("user", "add", "x"), ("token", "issue", "a", "--ttl", "ten"), ("frobnicate",)):
        result = gw(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)


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
    heavy = {"gateway.cli_commands", "sqlalchemy", "mcp", "yaml", "jwt"} & imported
    assert not heavy, f"--version imported {heavy}"
