"""The Files API's write paths, called alike by the API, manage.py and the UI: uploading a file and deleting one.

A file's content is `PANTHEON_FILES_DIR/<id>`, written once. An upload is copied to a temporary name in that folder
(a dot file) while each line is checked, synced, and renamed to its id in the transaction that records its row, so a
crash leaves either nothing under an id or the whole file; at worst a dot file, or a content file whose row was
never committed, which no route shows. A refused upload (a malformed line, too large, a bad option) leaves neither a
row nor a file.

An upload is two steps so the HTTP edge can run the slow one (reading and checking up to PANTHEON_FILE_MAX_BYTES)
off the thread that /v1 requests share for their database work: `stage_upload` touches no database, `record_upload`
only the database. `do_upload_file` is both, for callers with a thread of their own.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from batches.jsonl import NotAnObject, parse_object, read_lines
from batches.models import ACTIVE_STATUSES, Batch, FilePurpose, StoredFile
from batches.services import is_storable_text, visible_to
from pantheon_site.errors import InvalidRequest, NotFound, RequestTooLarge
from pantheon_site.models import AccessToken

# What a client may upload: batch input. batch_output files are written by the batches themselves.
UPLOAD_PURPOSES = (FilePurpose.BATCH,)
# OpenAI's bounds on expires_after[seconds]: one hour to thirty days.
EXPIRY_SECONDS = (3600, 30 * 24 * 3600)
FILENAME_MAX_CHARS = StoredFile._meta.get_field("filename").max_length


def content_path(file_id: str) -> Path:
    """Where a file's content is kept."""
    return settings.PANTHEON_FILES_DIR / file_id


@dataclass
class StagedFile:
    """An upload checked and written under a temporary name, not yet a file anyone sees."""

    path: Path
    bytes: int
    line_count: int

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def check_upload_options(purpose: str, filename: str, expires_after_seconds: int | None) -> None:
    """The upload's options, checked before any byte is read; raises InvalidRequest naming the field."""
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(
            f"purpose must be one of {', '.join(UPLOAD_PURPOSES)} (got {purpose!r})",
            reason="file_purpose",
            param="purpose",
            code="invalid_value",
        )
    if not filename or len(filename) > FILENAME_MAX_CHARS or not is_storable_text(filename):
        raise InvalidRequest(
            f"the file needs a name of 1 to {FILENAME_MAX_CHARS} characters (UTF-8, no NUL)",
            reason="file_name",
            param="file",
        )
    low, high = EXPIRY_SECONDS
    if expires_after_seconds is not None and not low <= expires_after_seconds <= high:
        raise InvalidRequest(
            f"expires_after[seconds] must be between {low} and {high}",
            reason="file_expiry",
            param="expires_after[seconds]",
            code="invalid_value",
        )


def stage_upload(source: BinaryIO) -> StagedFile:
    """Copies `source` (a batch input file) to a temporary name under PANTHEON_FILES_DIR, checking as it goes that
    every non-blank line is a JSON object and that the file is within PANTHEON_FILE_MAX_BYTES. Raises InvalidRequest
    (the first malformed line, by number) or RequestTooLarge, leaving nothing behind. No database access."""
    limit = settings.PANTHEON_FILE_MAX_BYTES
    settings.PANTHEON_FILES_DIR.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".upload-", dir=settings.PANTHEON_FILES_DIR)
    staged = StagedFile(Path(name), 0, 0)
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk, line in read_lines(source):
                staged.bytes += len(chunk)
                if staged.bytes > limit:
                    raise RequestTooLarge(
                        f"the file is larger than the server's limit of {limit} bytes (PANTHEON_FILE_MAX_BYTES)",
                        reason="file_too_large",
                        param="file",
                    )
                if line is not None:
                    _check_line(line.raw, line.number)
                    staged.line_count += 1
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        staged.discard()
        raise
    return staged


def _check_line(raw: bytes, number: int) -> None:
    try:
        parse_object(raw)
    except NotAnObject as exc:
        raise InvalidRequest(
            f"line {number} of the file is not a JSON object: {exc}; every non-blank line of a batch file must be one",
            reason="malformed_jsonl",
            param="file",
            code="invalid_json_line",
        ) from None


def record_upload(
    staged: StagedFile,
    *,
    filename: str,
    purpose: str,
    owner: AccessToken | None,
    expires_after_seconds: int | None = None,
) -> StoredFile:
    """Makes a staged upload a file: its row and its content under its id, in one transaction. The staged file is
    gone afterwards, whatever happened."""
    now = timezone.now()
    expires_at = now + timedelta(seconds=expires_after_seconds) if expires_after_seconds is not None else None
    try:
        with transaction.atomic():
            stored = StoredFile.objects.create(
                filename=filename,
                purpose=purpose,
                bytes=staged.bytes,
                line_count=staged.line_count,
                created_at=now,
                expires_at=expires_at,
                owner=owner,
            )
            os.replace(staged.path, content_path(stored.id))
    finally:
        staged.discard()
    _sync_folder()
    return stored


def do_upload_file(
    source: BinaryIO,
    *,
    filename: str,
    purpose: str,
    owner: AccessToken | None,
    expires_after_seconds: int | None = None,
) -> StoredFile:
    """Uploads a file: checks the options and every line, then stores it (see the module's docstring). Raises
    InvalidRequest or RequestTooLarge, having stored nothing."""
    check_upload_options(purpose, filename, expires_after_seconds)
    staged = stage_upload(source)
    return record_upload(
        staged, filename=filename, purpose=purpose, owner=owner, expires_after_seconds=expires_after_seconds
    )


def do_delete_file(file_id: str, viewer: AccessToken | None) -> None:
    """Deletes a file the viewer may see: its row, then (once that is committed) its content. Refused with
    InvalidRequest (code file_in_use) while a batch that has not ended reads it as its input; a batch that ended
    keeps the id of its deleted input file, as OpenAI's does. NotFound for a file the viewer cannot see."""
    with transaction.atomic():
        # Locked, so a batch being created on this file (batch_create.record_batch locks it too) either sees it
        # gone or is seen here.
        stored = None
        if is_storable_text(file_id):
            stored = visible_to(StoredFile.objects.select_for_update(), viewer).filter(pk=file_id).first()
        if stored is None:
            raise NotFound(f"no file {file_id!r}", reason="file_not_found")
        reader = Batch.objects.filter(input_file_id=file_id, status__in=ACTIVE_STATUSES).first()
        if reader is not None:
            raise InvalidRequest(
                f"file {file_id} is the input of batch {reader.id}, which is {reader.status}: cancel the batch or "
                "wait for it to end before deleting the file",
                reason="file_in_use",
                param="file_id",
                code="file_in_use",
            )
        stored.delete()
        transaction.on_commit(lambda: content_path(file_id).unlink(missing_ok=True))


def _sync_folder() -> None:
    """Makes the rename that put a file in place durable (best effort: not every file system can sync a folder)."""
    with contextlib.suppress(OSError):
        handle = os.open(settings.PANTHEON_FILES_DIR, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
