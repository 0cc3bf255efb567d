"""gateway/settings.py: flag > environment variable > default (docs/operations.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import DB_ENV, HOME_ENV, POLICY_ENV, resolve_settings

DEFAULT_HOME = Path("~/.mcp-gateway").expanduser()


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        pytest.param("/from/flag", "/from/env", Path("/from/flag"), id="flag-wins"),
        pytest.param(None, "/from/env", Path("/from/env"), id="env-next"),
        pytest.param(None, None, DEFAULT_HOME, id="default"),
        pytest.param(None, "", DEFAULT_HOME, id="empty-env-is-unset"),
        pytest.param("rel/home", "/from/env", Path("CWD/rel/home"), id="relative-flag"),
        pytest.param(None, "rel/env", Path("CWD/rel/env"), id="relative-env"),
        pytest.param("~/gw", None, Path("~/gw").expanduser(), id="tilde"),
    ],
)
def test_home(flag: str | None, env: str | None, expected: Path, tmp_path: Path) -> None:
    environ = {} if env is None else {HOME_ENV: env}

    settings = resolve_settings(home=flag, environ=environ, cwd=tmp_path)

    assert settings.home == Path(str(expected).replace("CWD", str(tmp_path)))
    assert settings.home.is_absolute()


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        pytest.param("postgresql+psycopg://f/db", "sqlite:///env.db", "postgresql+psycopg://f/db", id="flag-wins"),
        pytest.param(None, "sqlite:////srv/env.db", "sqlite:////srv/env.db", id="env-next"),
        pytest.param(None, None, "sqlite:///HOME/gateway.db", id="default-in-home"),
    ],
)
def test_db_url(flag: str | None, env: str | None, expected: str, tmp_path: Path) -> None:
    home = tmp_path / "state"
    environ = {} if env is None else {DB_ENV: env}

    settings = resolve_settings(home=str(home), db=flag, environ=environ, cwd=tmp_path)

    assert settings.db_url == expected.replace("HOME", str(home))


def test_default_db_follows_the_home_from_the_environment(tmp_path: Path) -> None:
    settings = resolve_settings(environ={HOME_ENV: str(tmp_path / "h")}, cwd=tmp_path)

    assert settings.db_url == f"sqlite:///{tmp_path / 'h' / 'gateway.db'}"


@pytest.mark.parametrize(
    ("flag", "env", "home_has_policy", "expected"),
    [
        pytest.param("/p/flag.yaml", "/p/env.yaml", True, "/p/flag.yaml", id="flag-wins"),
        pytest.param(None, "/p/env.yaml", True, "/p/env.yaml", id="env-beats-home-file"),
        pytest.param("rel/flag.yaml", None, False, "CWD/rel/flag.yaml", id="relative-flag"),
        pytest.param(None, "rel/env.yaml", False, "CWD/rel/env.yaml", id="relative-env"),
        pytest.param(None, None, True, "HOME/policy.yaml", id="home-file"),
        pytest.param(None, None, False, "HOME/policy.yaml", id="home-file-even-when-missing-never-the-cwd"),
        pytest.param(None, "", False, "HOME/policy.yaml", id="empty-env-is-unset"),
    ],
)
def test_policy_path(flag: str | None, env: str | None, home_has_policy: bool, expected: str, tmp_path: Path) -> None:
    home, cwd = tmp_path / "state", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    (cwd / "policy.yaml").write_text("version: 1\n", encoding="utf-8")  # e.g. the agent's, in its project
    if home_has_policy:
        (home / "policy.yaml").write_text("version: 1\n", encoding="utf-8")
    environ = {} if env is None else {POLICY_ENV: env}

    settings = resolve_settings(home=str(home), policy=flag, environ=environ, cwd=cwd)

    assert settings.policy_path == Path(expected.replace("HOME", str(home)).replace("CWD", str(cwd)))
    assert settings.policy_given == (flag or env or None)


def test_derived_paths_live_in_the_home(tmp_path: Path) -> None:
    settings = resolve_settings(home=str(tmp_path), environ={}, cwd=tmp_path)

    assert settings.artifacts_dir == tmp_path / "artifacts"
