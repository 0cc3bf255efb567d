"""The command's start-up: its imports run with the cyclic collector off, and it is on again after (decision 79)."""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gateway.cli import COMMAND_MODULES, imports_without_gc, main
from gateway.default_policy import SHIPPED_POLICY
from tests import forked_gateway


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """This worker's collector and umask as they were, whatever a test froze, turned off or set
    (`main` sets the umask to 077: later tests of the worker would make private folders)."""
    was_enabled = gc.isenabled()
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)
    gc.unfreeze()
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_off_inside_and_on_after_with_what_was_built_frozen() -> None:
    gc.enable()
    with imports_without_gc():
        assert not gc.isenabled()
        built: list[list[int]] = [[] for _ in range(100)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(built)


def test_an_import_that_fails_still_turns_the_collector_back_on() -> None:
    gc.enable()
    with pytest.raises(ModuleNotFoundError), imports_without_gc():
        __import__("gateway.no_such_module")
    assert gc.isenabled()


def test_a_command_run_in_process_leaves_the_collector_on() -> None:
    gc.enable()
    assert main(["policy", "check", str(SHIPPED_POLICY)]) == 0
    assert gc.isenabled()


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_each_long_running_commands_module_imports(command: str) -> None:
    """A name that no longer imports would fail every start of the command, not only its own test."""
    assert importlib.import_module(COMMAND_MODULES[command]).__name__ == COMMAND_MODULES[command]


@pytest.fixture(scope="module")
def fresh_imports() -> dict[str, list[str]]:
    """What a new interpreter holds after importing what every command imports ("short": the MCP SDK's, if
    any), then `serve`'s too ("every": sqlalchemy.orm's, if any). The suite's fork helper is that interpreter
    (tests/forked_gateway.py), started by this process for the commands it forks: asking it costs nothing,
    where an interpreter of this fixture's own imported the same again (1.2 s of CPU). With forks off, that
    interpreter."""
    loaded = forked_gateway.loaded_modules()
    if loaded is None:
        code = (
            f"import json, sys, {', '.join(forked_gateway.PRELOADED)}\n"
            "commands = sorted(sys.modules)\n"
            "import gateway.server\n"
            "print(json.dumps({'commands': commands, 'serve': sorted(sys.modules)}))"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        loaded = json.loads(done.stdout)
    return {
        "short": sorted({name.split(".")[0] for name in loaded["commands"]} & {"mcp", "mcp_types"}),
        "every": sorted(name for name in loaded["serve"] if "sqlalchemy.orm" in name),
    }


def test_a_short_command_never_loads_the_mcp_sdk(fresh_imports: dict[str, list[str]]) -> None:
    """The CLI's commands (user, token, consent, upstream, audit) need no MCP: the SDK and its types cost about
    half of such a command's CPU. Only `serve`, and a policy's upstream servers, load them."""
    assert fresh_imports["short"] == []


def test_no_command_loads_sqlalchemys_orm(fresh_imports: dict[str, list[str]]) -> None:
    """The tables are Core `Table`s (gateway/db): declaring them as ORM models cost every command the ORM's
    import and its class set-up, about 80 ms of CPU of a `serve` and 40 ms of a `user list`."""
    assert fresh_imports["every"] == []
