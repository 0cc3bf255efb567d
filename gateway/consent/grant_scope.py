"""How far a stored decision for particular arguments reaches (decision 44): allow narrowly, deny widely.

An Allow always made for some arguments answers those very arguments only (their `args_hash`).
A Deny always made for some arguments answers every call it could be about:

- when it names path arguments (a tool's `path_arguments`, the file or folder of Claude Code's
  file tools), every call whose path, in any spelling, is that path, lies under it or holds it
  (`tests` runs what is in `tests/integration`), whatever its other arguments;
- otherwise, every call that has each argument it names with the same value, whatever else the
  call carries (a Bash command with another `description`).

A path is compared by meaning, not by text (`normal_path`): pytest's `::node` suffix dropped,
`.` and empty parts gone, `..` applied, no trailing `/`. A call's spellings are the path as
written and, where the caller can resolve it, the path it really reaches (symlinks followed),
both relative to the workspace (run_pytest) or absolute (Claude Code's tools).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gateway.canonical import canonical_json


def normal_path(value: str) -> str | None:
    """`value` in one spelling; None when it cannot be one (empty, or a relative path climbing above its start).

    `tests//integration/./`, `./tests/integration` and `tests/integration/x.py/..` are all
    `tests/integration`; `tests/x.py::test_a[1]` is `tests/x.py`; the start of a relative path is `.`.
    """
    text = value.split("::", 1)[0]
    if not text:
        return None
    absolute = text.startswith("/")
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            elif not absolute:
                return None
            continue
        parts.append(part)
    joined = "/".join(parts)
    return "/" + joined if absolute else joined or "."


def overlaps(a: str, b: str) -> bool:
    """Whether one (normal) path is the other or lies under it: a call on either reaches into the other."""
    if a.startswith("/") != b.startswith("/"):
        return True  # never compared in practice (callers spell both alike); if it happens, deny
    if a == b or "." in (a, b) or "/" in (a, b):
        return True
    return a.startswith(b + "/") or b.startswith(a + "/")


def deny_covers(
    granted: Mapping[str, Any], arguments: Mapping[str, Any], spellings: Mapping[str, Collection[str]]
) -> bool:
    """Whether a Deny always made for `granted` answers a call with `arguments`.

    `spellings` holds, for each path argument of the tool, the call's spellings of it (empty when it
    has none that can be compared: that argument then counts as covered).
    """
    paths = [name for name in granted if name in spellings]
    if paths:
        for name in paths:
            value = granted[name]
            mine = normal_path(value) if isinstance(value, str) else None
            call = spellings[name]
            if mine is not None and call and not any(overlaps(spelled, mine) for spelled in call):
                return False
        return True
    return all(name in arguments and canonical_json(arguments[name]) == canonical_json(value)
               for name, value in granted.items())  # fmt: skip


def workspace_spellings(root: str, value: str, realpath: Callable[[str], str] = os.path.realpath) -> frozenset[str]:
    """A workspace-relative path argument's spellings: as written, and where it really leads under the root."""
    spelled = {normal_path(value)}
    real_root = realpath(root)
    real = os.path.relpath(realpath(os.path.join(root, value.split("::", 1)[0])), real_root)
    if real != ".." and not real.startswith("../"):
        spelled.add(normal_path(real))
    return frozenset(s for s in spelled if s is not None)


def absolute_spellings(
    root: str, value: str | None, realpath: Callable[[str], str] = os.path.realpath
) -> frozenset[str]:
    """A Claude Code path argument's spellings, absolute: as written (relative to the workspace, `~` expanded;
    absent: the workspace itself) and where it really leads."""
    text = root if value is None else os.path.expanduser(value)
    absolute = text if text.startswith("/") else os.path.join(root, text)
    spelled = {normal_path(absolute), normal_path(realpath(absolute))}
    return frozenset(s for s in spelled if s is not None)


def normal_grant_arguments(
    arguments: Mapping[str, Any], path_names: Collection[str], root: str | None = None
) -> dict[str, Any]:
    """A Deny's arguments as stored: its path arguments in their normal spelling, relative to the workspace
    (`root` None) or absolute (`root` given: a relative one is read against it). ValueError when one has none."""
    out = dict(arguments)
    for name in path_names:
        value = out.get(name)
        if name not in out:
            continue
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a path (a string)")  # noqa: TRY004  (a bad value, reported as one)
        if root is not None:
            text = os.path.expanduser(value)
            normal = normal_path(text if text.startswith("/") else os.path.join(root, text))
        elif value.startswith("/"):
            raise ValueError(f"{name} must be relative to the workspace, as the tool takes it")
        else:
            normal = normal_path(value)
        if normal is None:
            raise ValueError(f"{name} {value!r} leaves the workspace")
        out[name] = normal
    return out
