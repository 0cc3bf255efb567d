"""The four MCP behaviour hints of a tool's annotations, each with its MCP default (docs/consent.md,
"Risk tiers and expiry"): what the risk tier and every prompt read a missing hint as."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

HINT_DEFAULTS: Mapping[str, bool] = MappingProxyType(
    {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": True}
)
"""The hints in the order a prompt shows them, and what a missing (or not boolean) one means."""


def hint(annotations: Mapping[str, Any], name: str) -> bool:
    """One hint as consent reads it: its value when it is a boolean, else its MCP default."""
    value = annotations.get(name)
    return value if isinstance(value, bool) else HINT_DEFAULTS[name]


def is_given(annotations: Mapping[str, Any], name: str) -> bool:
    """Whether the tool says the hint itself (a boolean), rather than leaving it to its default."""
    return isinstance(annotations.get(name), bool)
