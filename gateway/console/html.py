"""Markup escaped by construction: every string given to `el` is text, escaped; only `Safe` (what `el`
itself returns) passes as markup. Attribute values are escaped too, and attribute names are ours.
No page builds HTML from data any other way, and the page's script sets data with textContent."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape

Child = "str | int | float | Safe | None | Iterable[Child]"


class Safe(str):
    """Markup made by `el` (or the page's fixed skeleton): not escaped again."""

    __slots__ = ()


VOID = frozenset({"input", "meta", "link", "br", "hr", "img"})


def el(tag: str, attrs: Mapping[str, str | int | bool | None] | None = None, *children: object) -> Safe:
    """`<tag attrs>children</tag>`: strings escaped; an attribute None or False is left out, True is bare."""
    parts = [f"<{tag}"]
    for name, value in (attrs or {}).items():
        if value is None or value is False:
            continue
        attr = name.rstrip("_").replace("_", "-")
        parts.append(f" {attr}" if value is True else f' {attr}="{escape(str(value), quote=True)}"')
    parts.append(">")
    if tag in VOID:
        return Safe("".join(parts))
    parts.append(_children(children))
    parts.append(f"</{tag}>")
    return Safe("".join(parts))


def _children(children: Iterable[object]) -> str:
    out: list[str] = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, Safe):
            out.append(child)
        elif isinstance(child, str | int | float):
            out.append(escape(str(child), quote=False))
        elif isinstance(child, Iterable):
            out.append(_children(child))
        else:
            out.append(escape(str(child), quote=False))
    return "".join(out)


def join(*children: object) -> Safe:
    return Safe(_children(children))
