"""gateway/start_failures.py: every step the sandbox can fail at has words and a fix; none is ever empty."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.start_failures import START_STEPS, VIEW_STEPS, describe_start_failure, describe_view_failure, start_step

SANDBOX = Path(__file__).resolve().parents[2] / "sandbox"
DOC = Path(__file__).resolve().parents[2] / "docs" / "error-codes.md"


def raised_slugs() -> set[str]:
    """Every `SandboxStartError("slug")` in the sandbox's source, up to any `:` detail."""
    pattern = re.compile(r'SandboxStartError\(f?"([a-z_]+)')
    return {slug for path in SANDBOX.rglob("*.py") for slug in pattern.findall(path.read_text(encoding="utf-8"))}


def test_every_step_the_sandbox_raises_has_words_a_fix_and_a_doc_row() -> None:
    slugs = raised_slugs()
    assert "spawn_failed" in slugs and "uid_pool_exhausted" in slugs  # the scan sees the sandbox
    assert sorted(slugs - set(START_STEPS) - set(VIEW_STEPS)) == []
    documented = DOC.read_text(encoding="utf-8")
    assert sorted(s for s in (*START_STEPS, *VIEW_STEPS) if f"`{s}`" not in documented) == []


def test_a_writing_runs_copy_has_its_own_words_and_no_other_step_does() -> None:
    """Decision 80: the copy's start failures are reasons of their own; every other step stays sandbox_start_failed."""
    assert set(VIEW_STEPS) == {"workspace_view_unavailable", "workspace_too_large_for_view", "workspace_copy_failed"}
    assert not set(VIEW_STEPS) & set(START_STEPS)
    said = describe_view_failure("workspace_view_unavailable")
    assert said is not None and "nothing ran; fix: run `mcp-gateway doctor`" in said
    assert describe_view_failure("spawn_failed") is None


@pytest.mark.parametrize(
    ("slug", "step", "words"),
    [
        (
            "spawn_failed",
            "spawn_failed",
            "the interpreter could not be started as the run's uid; fix: run `mcp-gateway",
        ),
        (
            "guarantee_unavailable:memory_total,syscall_filter",
            "guarantee_unavailable",
            "asks for (memory_total,syscall_filter); fix: run `mcp-gateway doctor`",
        ),
        ("something_new", "something_new", "the sandbox could not start the run (step something_new)"),
        ("", "unknown", "(step unknown)"),
    ],
)
def test_a_start_failure_names_its_step_and_what_to_do(slug: str, step: str, words: str) -> None:
    assert start_step(slug) == step
    assert words in describe_start_failure(slug)
