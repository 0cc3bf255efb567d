"""Canonical JSON and the argument hash of the audit log (sorted keys, no spaces, UTF-8; docs/operations.md)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def is_text(value: str) -> bool:
    """Whether a string is Unicode text that UTF-8 can encode (no lone surrogates, which `json` accepts)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def args_hash(arguments: Any) -> str:
    return sha256_hex(canonical_json(arguments if arguments is not None else {}))
