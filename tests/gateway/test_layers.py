"""The floor plan of gateway/ and sandbox/, checked on the import graph (docs/architecture.md).

A room is a wing (`gateway/cli/`, `consent/`, `rules/`, `db/`, `console/`, `tools/`, `upstreams/`) or a module
directly in `gateway/`. Rooms sit in bands, top to bottom; a room imports only rooms of its own band
or lower, never one above, and no two rooms import each other, through any path. Every import
counts: at the top of a module, inside a function (the lazy ones), under `TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from types import MappingProxyType

import pytest

ROOT = Path(__file__).resolve().parents[2]
WINGS = ("cli", "consent", "rules", "db", "console", "tools", "upstreams", "proxy")

BANDS: tuple[tuple[str, ...], ...] = (
    ("__main__", "cli"),  # the commands
    ("server", "permission_prompt", "console"),  # the front ends: MCP over stdio, Claude Code's prompt, the web
    ("pipeline", "recovery", "policy_warnings"),  # a call's stages in order; the sweeps; the policy's review
    ("services", "scope", "approvals", "call_trail"),  # the composition root; the workspace; the approver; the trail
    ("calls", "open_calls"),  # the cards, and those a dead gateway left open
    ("tools", "consent", "upstreams", "auth", "budget", "preflight", "policy_trust"),  # the stages; upstream servers
    (
        "audit",
        "runs",
        "users",
        "liveness",
        "policy",
        "declarations",
        "upstream_policy",
        "programs",
        "tick_failures",
        "previews",
    ),  # stores, the policy
    # storage; text for people; the wire; the policy's YAML read as nodes with their lines
    # the egress proxy and the policy's network key
    ("db", "rbac", "visible", "transport", "default_policy", "state_access", "policy_nodes", "egress_policy", "proxy"),
    ("rules", "errors", "canonical", "progress", "logs", "start_failures", "clock", "settings"),  # the kernel
)
BAND_OF = {room: n for n, rooms in enumerate(BANDS) for room in rooms}


def modules(package: str) -> dict[str, Path]:
    """Every module of `package`, by dotted name (a package by its own name)."""
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(path: Path) -> Iterator[str]:
    """The dotted names `path` imports, at any depth of its code."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def room(module: str) -> str | None:
    """`gateway.consent.store` -> `consent`; `gateway.pipeline` -> `pipeline`; None for `gateway` itself."""
    parts = module.split(".")
    if parts[0] != "gateway" or len(parts) == 1:
        return None
    return parts[1]


def module_of(name: str, known: dict[str, Path]) -> str:
    """The module a dotted name lives in: `gateway.consent.store.Grant` -> `gateway.consent.store`."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


@functools.cache
def room_graph() -> Mapping[str, frozenset[str]]:
    """Which rooms each room imports. Parsed once per process (about 0.2 s of CPU): five tests read it."""
    known = modules("gateway")
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        here = room(module)
        if here is None:
            continue
        targets = graph.setdefault(here, set())
        for name in imported(path):
            there = room(module_of(name, known))
            if there is not None and there != here:
                targets.add(there)
    return MappingProxyType({here: frozenset(targets) for here, targets in graph.items()})


def test_every_room_has_a_band() -> None:
    rooms = {room(m) for m in modules("gateway")} - {None}
    assert rooms == set(BAND_OF), "a new module or wing: give it a band in BANDS (and a line in docs/architecture.md)"
    assert set(WINGS) <= rooms


def test_no_room_imports_a_room_above_it() -> None:
    upward = [
        f"{here} (band {BAND_OF[here]}) imports {there} (band {BAND_OF[there]})"
        for here, targets in room_graph().items()
        for there in targets
        if BAND_OF[there] < BAND_OF[here]
    ]
    assert upward == []


def test_no_two_rooms_import_each_other() -> None:
    try:
        tuple(TopologicalSorter(room_graph()).static_order())
    except CycleError as exc:
        pytest.fail(f"an import cycle between rooms: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize(
    ("wing", "may_import"),
    [
        ("rules", set()),  # pure readers of Claude Code's rules: nothing of the gateway
        ("db", {"errors", "logs"}),  # storage knows the kernel only
    ],
)
def test_the_low_wings_stay_low(wing: str, may_import: set[str]) -> None:
    assert room_graph()[wing] <= may_import


def test_only_the_entry_point_imports_the_commands() -> None:
    importers = {here for here, targets in room_graph().items() if "cli" in targets}
    assert importers == {"__main__"}


def test_the_sandbox_never_imports_the_gateway() -> None:
    leaks = [
        f"{module} imports {name}"
        for module, path in modules("sandbox").items()
        for name in imported(path)
        if name == "gateway" or name.startswith("gateway.")
    ]
    assert leaks == []
