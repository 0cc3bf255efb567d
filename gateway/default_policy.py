"""The shipped default policy (docs/policy.md) and `init`'s copy of it at `<home>/policy.yaml` (docs/operations.md).

The copy keeps the shipped file's comments (it documents itself) and changes only the
workspaces: each becomes absolute, so that the copy names the same folders from its new place
(a relative root is read against the policy file's own folder), and `default` becomes the
folder given to `init --workspace`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import yaml

from gateway.errors import ConfigError
from gateway.policy_nodes import compose

SHIPPED_POLICY = Path(__file__).resolve().parent / "shipped" / "policy.yaml"
"""The documented default: in a checkout a link to the repository's `policy.yaml`, next to a link to its
`examples/`; a wheel carries copies of both (package data), so its relative workspace
(`examples/sample_project`) resolves to the sample project wherever the package is installed."""
_PLAIN = re.compile(r"^/[A-Za-z0-9_./-]*$")


def default_policy_text(shipped: Path, workspace: Path | None = None) -> str:
    """The shipped policy's text with every workspace root absolute; `default` = `workspace` when given."""
    text = shipped.read_text(encoding="utf-8")
    root = compose(text)
    section = _value_of(root, "workspaces")
    if not isinstance(section, yaml.MappingNode):
        raise ConfigError("the shipped policy has no workspaces mapping", str(shipped))
    names = {key.value for key, _ in section.value if isinstance(key, yaml.ScalarNode)}
    if workspace is not None and "default" not in names:
        raise ConfigError(f"the shipped policy has no 'default' workspace to point at {workspace}", str(shipped))
    edits: list[tuple[int, int, str]] = []
    for key, value in section.value:
        if not isinstance(key, yaml.ScalarNode) or not isinstance(value, yaml.ScalarNode):
            continue
        if key.value == "default" and workspace is not None:
            folder = workspace
        else:
            # Real path: in a checkout the shipped folder is a link to the repository's (a pinned
            # workspace may hold no link); in a wheel it is already one.
            folder = (shipped.parent / value.value).resolve()
        edits.append((value.start_mark.index, value.end_mark.index, _scalar(str(folder))))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def write_new_policy(path: Path, text: str) -> None:
    """Create `path` (0600, never over an existing file or through a link) holding `text`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def _value_of(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


def _scalar(text: str) -> str:
    """A YAML scalar for a path: plain when it is plainly a path, else double-quoted (JSON's escapes are YAML's)."""
    return text if _PLAIN.fullmatch(text) else json.dumps(text)
