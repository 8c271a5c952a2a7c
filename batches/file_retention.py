"""Expired files go: the StoredFile row and its content under PANTHEON_FILES_DIR, once past `expires_at`.

A batch's output and error files get an `expires_at` when they have none: their creation plus
PANTHEON_BATCH_OUTPUT_RETENTION_DAYS (OpenAI keeps them 30 days by default; 0 keeps them), stamped on the row so
the Files API shows when each goes. An input file an active batch still reads is kept past its expiry until the
batch ends (an ended batch keeps its input_file_id, as OpenAI's does, whether or not the file is still there).
Deleting a row clears the output_file / error_file of the batch that wrote it (their FK is SET_NULL), as a
client's DELETE does. The row goes first and the content after its transaction commits: a crash between leaves an
orphaned file on disk, never a row whose content is gone; the same prune then removes such orphans (and the drafts a
killed upload or finalize left) once nothing has written them for PANTHEON_FILE_ORPHAN_GRACE_S.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from batches.models import ACTIVE_STATUSES, Batch, FilePurpose, StoredFile

logger = logging.getLogger("pantheon.batches")


@dataclass
class FilePrune:
    """What one prune did: the ids it deleted, those past expiry it kept (read by an active batch), how many output
    files it stamped with an expiry, and the orphaned content files it removed."""

    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    stamped: int = 0
    orphans: list[str] = field(default_factory=list)  # names of content files no row named, removed


def stamp_output_expiry(retention_days: float | None = None) -> int:
    """Gives each batch output or error file without an expiry `created_at + retention_days` (default
    PANTHEON_BATCH_OUTPUT_RETENTION_DAYS; 0: they are kept); returns how many rows it stamped."""
    days = settings.PANTHEON_BATCH_OUTPUT_RETENTION_DAYS if retention_days is None else retention_days
    if days <= 0:
        return 0
    unstamped = StoredFile.objects.filter(purpose=FilePurpose.BATCH_OUTPUT, expires_at__isnull=True)
    return unstamped.update(expires_at=F("created_at") + timedelta(days=days))


def prune_expired_files(*, now: datetime | None = None) -> FilePrune:
    """Stamps the output files' expiry, then deletes every file past its `expires_at` that no active batch reads,
    row and content."""
    now = now or timezone.now()
    result = FilePrune(stamped=stamp_output_expiry())
    in_use = Batch.objects.filter(status__in=ACTIVE_STATUSES).values("input_file_id")
    expired = StoredFile.objects.filter(expires_at__lte=now)
    result.kept.extend(expired.filter(pk__in=in_use).values_list("pk", flat=True))
    for file_id in expired.exclude(pk__in=in_use).values_list("pk", flat=True):
        with transaction.atomic():
            # Checked again under the row's lock: a batch may have started reading it meanwhile.
            row = StoredFile.objects.select_for_update().filter(pk=file_id, expires_at__lte=now).first()
            if row is None:
                continue
            if Batch.objects.filter(status__in=ACTIVE_STATUSES, input_file_id=file_id).exists():
                result.kept.append(file_id)
                continue
            row.delete()
            transaction.on_commit(lambda file_id=file_id: _remove_content(file_id))
        result.deleted.append(file_id)
    result.orphans = remove_orphans(now)
    return result


def remove_orphans(now: datetime) -> list[str]:
    """Removes the files under PANTHEON_FILES_DIR that no StoredFile row names and that nothing has written for
    PANTHEON_FILE_ORPHAN_GRACE_S: content whose row was deleted by a prune that crashed before the unlink, and the
    drafts (dot-files) a killed upload or finalize left. The grace spares what is being written now: an upload's
    content is renamed into place before its row commits, and a finalize writes its drafts before renaming them.
    Returns the names removed."""
    folder = Path(settings.PANTHEON_FILES_DIR)
    if not folder.is_dir():
        return []
    cutoff = now.timestamp() - settings.PANTHEON_FILE_ORPHAN_GRACE_S
    stale = sorted(path.name for path in folder.iterdir() if path.is_file() and path.stat().st_mtime < cutoff)
    named: set[str] = set()
    for start in range(0, len(stale), 500):  # a bounded IN list per query, whatever the folder holds
        named.update(StoredFile.objects.filter(pk__in=stale[start : start + 500]).values_list("pk", flat=True))
    removed = []
    for name in stale:
        if name in named:
            continue
        try:
            (folder / name).unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("could not remove the orphaned file %s: %s", folder / name, exc)
            continue
        removed.append(name)
    return removed


def _remove_content(file_id: str) -> None:
    path = settings.PANTHEON_FILES_DIR / file_id
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("could not remove the content of pruned file %s (%s): %s", file_id, path, exc)
