"""The read tools (docs/clients.md; decisions 5 and 6): list_artifacts, get_evidence, get_artifact_content.

A run of a workspace the caller cannot see answers exactly as a run that does not exist,
so one tenant cannot learn another's run ids. Artifact names are plain file names inside
the run folder; the resolved path must stay inside it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.clock import iso_utc
from gateway.errors import InvalidParamsError, Reason
from gateway.runs import RunRecord, RunStore
from gateway.tools.outcome import ToolOutcome

DEFAULT_MAX_BYTES = 65536


def _visible_run(runs: RunStore, run_id: str, visible: tuple[str, ...] | None) -> RunRecord:
    record = runs.fetch(run_id)
    if record is None or (visible is not None and record.workspace not in visible):
        raise InvalidParamsError(Reason.RUN_NOT_FOUND, f"no run {run_id}")
    return record


def list_artifacts(runs: RunStore, arguments: Mapping[str, Any], visible: tuple[str, ...] | None) -> ToolOutcome:
    limit = int(arguments.get("limit", 20))
    records = runs.list(visible, limit)
    items = []
    for record in records:
        folder = runs.folder(record.run_id)
        files = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        items.append(
            {
                "run_id": record.run_id,
                "tool_name": record.tool_name,
                "user": record.user,
                "workspace": record.workspace,
                "created_at": iso_utc(record.created_at),
                "status": record.status,
                "exit_code": record.exit_code,
                "files": files,
            }
        )
    lines = [f"{i['run_id']}  {i['created_at']}  {i['workspace']}  {i['status']}" for i in items]
    return ToolOutcome("\n".join(lines) or "no runs", {"runs": items})


def get_evidence(runs: RunStore, arguments: Mapping[str, Any], visible: tuple[str, ...] | None) -> ToolOutcome:
    record = _visible_run(runs, str(arguments["run_id"]), visible)
    path = runs.folder(record.run_id) / "evidence.json"
    try:
        evidence = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidParamsError(Reason.EVIDENCE_NOT_FOUND, f"run {record.run_id} has no evidence") from exc
    return ToolOutcome(json.dumps(evidence, indent=2, sort_keys=True), {"run_id": record.run_id, **evidence})


def get_artifact_content(runs: RunStore, arguments: Mapping[str, Any], visible: tuple[str, ...] | None) -> ToolOutcome:
    record = _visible_run(runs, str(arguments["run_id"]), visible)
    name = str(arguments["name"])
    folder = runs.folder(record.run_id).resolve()
    path = (folder / name).resolve()
    if path.parent != folder or not path.is_file() or Path(name).name != name:
        raise InvalidParamsError(Reason.ARTIFACT_NOT_FOUND, f"run {record.run_id} has no artifact {name!r}")
    max_bytes = int(arguments.get("max_bytes", DEFAULT_MAX_BYTES))
    with path.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    truncated = len(data) > max_bytes
    text = data[:max_bytes].decode("utf-8", errors="replace")
    return ToolOutcome(
        text,
        {"run_id": record.run_id, "name": name, "bytes": min(len(data), max_bytes), "truncated": truncated},
    )
