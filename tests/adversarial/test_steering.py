"""Hostile suites that try to steer pytest from outside the workspace's own config, or through the arguments."""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.conftest import Arena, open_arena

PRELOAD = "/nonexistent/mcp-adv-preload.so"
HOSTILE_ENV = {
    "PYTEST_ADDOPTS": "-k addopts_honoured -p no:junitxml",
    "PYTEST_PLUGINS": "addopts_plugin_honoured",
    "PYTHONPATH": "/nonexistent/mcp-adv-pythonpath",
    "PYTHONSTARTUP": "/nonexistent/mcp-adv-startup.py",
    "LD_PRELOAD": PRELOAD,
}

PROBE = """
import os, sys
import pytest
from _kit import report

def test_probe(request):
    config = request.config
    report(
        inipath=str(config.inipath),
        rootpath=str(config.rootpath),
        keyword=config.option.keyword,
        addopts=config.getini("addopts"),
        pytest_file=pytest.__file__,
        conftests=sorted(m.__file__ for m in list(sys.modules.values())
                         if getattr(m, "__name__", "").endswith("conftest") and getattr(m, "__file__", None)),
        environ=sorted(os.environ),
        argv=sys.argv,
    )
"""

PASSING = "def test_passes():\n    assert True\n"

PARENT_INI = "[pytest]\naddopts = -k parent_ini_honoured -p parent_plugin_honoured\n"
PARENT_CONFTEST = (
    "print('PARENT_CONFTEST_LOADED', flush=True)\n"
    "import pytest\n\n"
    "@pytest.fixture(autouse=True)\n"
    "def parent_conftest_honoured():\n"
    "    pytest.fail('PARENT_CONFTEST_LOADED')\n"
)
SHADOW_PYTEST = "print('SHADOW_PYTEST_RAN 999 passed', flush=True)\nraise SystemExit(0)\n"


@pytest.fixture(scope="module")
def steering(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    """A workspace with no config of its own, hostile config in its parent, a hostile serve environment."""
    root = tmp_path_factory.mktemp("steering")
    # Whitelisting names that must never pass shows the gateway filters them, not just the policy.
    policy: dict[str, Any] = {"sandbox": {"env_whitelist": ["PATH", "LANG", "LC_ALL", *HOSTILE_ENV]}}
    with open_arena(root, policy=policy, serve_env=HOSTILE_ENV, keep_sample_config=False) as arena:
        parent = arena.workspace.parent  # hostile config just above the workspace
        (parent / "pytest.ini").write_text(PARENT_INI)
        (parent / "conftest.py").write_text(PARENT_CONFTEST)
        (parent / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-k parent_toml_honoured"\n')
        arena.write("pytest.py", SHADOW_PYTEST)
        arena.write("probe/test_probe.py", PROBE)
        arena.write("probe/test_passing.py", PASSING)
        yield arena


def probe(arena: Arena) -> tuple[dict[str, Any], Any]:
    run = arena.run("probe")
    counts = {k: run.structured[k] for k in ("passed", "failed", "errors", "skipped")}
    assert counts == {"passed": 1, "failed": 1, "errors": 0, "skipped": 0}, (counts, run.stdout[-2000:])
    return run.report(), run


def test_parent_directory_config_is_not_honoured(steering: Arena) -> None:
    found, run = probe(steering)
    parent = steering.workspace.parent
    assert found["rootpath"] == str(steering.workspace)
    assert found["inipath"] in ("None", "/dev/null"), found["inipath"]
    assert found["keyword"] == "" and found["addopts"] == []
    assert not any(Path(c).parent == parent for c in found["conftests"]), found["conftests"]
    assert "PARENT_CONFTEST_LOADED" not in run.stdout


def test_pytest_addopts_in_the_gateway_environment_does_not_apply(steering: Arena) -> None:
    found, run = probe(steering)
    assert found["keyword"] == "", "PYTEST_ADDOPTS reached pytest"
    assert run.artifact("junit.xml"), "PYTEST_ADDOPTS turned the junit plugin off"
    assert not set(HOSTILE_ENV) & set(found["environ"]), found["environ"]


def test_loader_and_interpreter_variables_do_not_pass(steering: Arena) -> None:
    found, run = probe(steering)
    assert PRELOAD not in run.artifact("stderr.txt").decode(errors="replace"), "LD_PRELOAD reached the loader"
    assert not any("mcp-adv-pythonpath" in arg for arg in found["argv"])
    assert "LD_PRELOAD" not in found["environ"] and "PYTHONPATH" not in found["environ"]


def test_a_workspace_pytest_py_does_not_shadow_pytest(steering: Arena) -> None:
    found, run = probe(steering)
    assert Path(found["pytest_file"]).is_relative_to(sysconfig.get_paths()["purelib"]), found["pytest_file"]
    assert "SHADOW_PYTEST_RAN" not in run.stdout
    assert run.structured["passed"] == 1, "the counts are not the real ones"


@pytest.mark.parametrize(
    "arguments",
    [
        {"test_path": "-p"},
        {"test_path": "--junitxml=/tmp/mcp-adv-pwned.xml"},
        {"test_path": "-oaddopts=-p evil"},
        {"test_path": "--rootdir=/"},
        {"test_path": "tests", "keyword": "-x"},
        {"test_path": "tests", "markers": "--co"},
        {"test_path": "../policy.yaml"},
        {"test_path": "/etc"},
        {"test_path": "tests/../../state"},
    ],
    ids=lambda a: "|".join(f"{k}={v}" for k, v in a.items()),
)
def test_option_like_and_escaping_arguments_are_refused_before_anything_runs(
    arena: Arena, arguments: dict[str, Any]
) -> None:
    artifacts = arena.gateway.home / "artifacts"
    before = set(artifacts.iterdir())
    run = arena.run(**arguments)
    assert run.error_code in (-32004, -32602), run.response
    assert set(artifacts.iterdir()) == before, "a run folder was made: something ran"
    assert not any(e["event_type"] in ("TOOL_STARTED", "SANDBOX_EXEC") for e in run.events)
    assert not Path("/tmp/mcp-adv-pwned.xml").exists()
