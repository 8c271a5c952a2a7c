"""A batch's output and error files, written when it ends (finalizing, or cancelling before cancelled).

Each file's id is derived from the batch's id, so a task killed while writing and run again rewrites the same file
(the same lines: nothing is recorded once a batch finalizes) and finds or creates the same row: a batch never gets
two output files. A file is written only when it has lines, as OpenAI's; lines keep the input's order."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from django.conf import settings

from batches.models import Batch, BatchLine, FilePurpose, LineState, StoredFile


def batch_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's `kind` file ("output" or "error"), the same every time it is asked for."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


def input_path(batch: Batch) -> Path:
    return Path(settings.PANTHEON_FILES_DIR) / batch.input_file_id


def write_result_files(batch: Batch) -> tuple[str | None, str | None]:
    """Writes the batch's output file (succeeded lines) and error file (failed lines); returns their ids (None for
    a file with no line)."""
    folder = Path(settings.PANTHEON_FILES_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    drafts = {kind: folder / f".{batch_file_id(batch.id, kind)}.{os.getpid()}" for kind in ("output", "error")}
    counts = {"output": 0, "error": 0}
    with drafts["output"].open("wb") as output, drafts["error"].open("wb") as errors:
        recorded = BatchLine.objects.filter(batch=batch).exclude(state=LineState.PENDING).order_by("number")
        for state, result in recorded.values_list("state", "result").iterator(chunk_size=2000):
            kind, out = ("output", output) if state == LineState.SUCCEEDED else ("error", errors)
            out.write(json.dumps(result, separators=(",", ":")).encode() + b"\n")
            counts[kind] += 1
    ids: dict[str, str | None] = {}
    for kind, draft in drafts.items():
        if counts[kind] == 0:
            draft.unlink()
            ids[kind] = None
            continue
        file_id = batch_file_id(batch.id, kind)
        os.replace(draft, folder / file_id)
        StoredFile.objects.get_or_create(
            id=file_id,
            defaults={
                "filename": f"{batch.id}_{kind}.jsonl",
                "purpose": FilePurpose.BATCH_OUTPUT,
                "bytes": (folder / file_id).stat().st_size,
                "line_count": counts[kind],
                "owner_id": batch.owner_id,
            },
        )
        ids[kind] = file_id
    return ids["output"], ids["error"]
