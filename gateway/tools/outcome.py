"""What a tool returns to the pipeline, before the server shapes it into a CallToolResult."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ResourceLink:
    uri: str
    name: str
    mime_type: str | None = None
    description: str | None = None


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    text: str
    structured: Mapping[str, Any] | None = None
    links: tuple[ResourceLink, ...] = field(default=())
    is_error: bool = False
    content: tuple[Mapping[str, Any], ...] | None = None
    """The content blocks as an upstream server gave them (JSON, passed on whole: docs/upstreams.md); None:
    `text` and `links` make the content."""
