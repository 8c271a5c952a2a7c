"""Stored files, batches and their lines: what the Files and Batch APIs show and what a batch's Celery task records.

A batch's progress lives here, one row per input line (`BatchLine`), so a batch resumes after any restart at the
first line that has no result, and a line whose result is recorded is never run again (the result is written with a
conditional update: `state` moves from pending exactly once). Which Celery task runs a batch is decided by a lease on
the batch row (`lease_owner`, `lease_until`), taken and renewed with conditional updates, so two tasks never run the
same batch at once and one whose worker died is replaced once its lease runs out.
"""

import secrets

from django.db import models
from django.utils import timezone


def _public_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def new_file_id() -> str:
    return _public_id("file-")


def new_batch_id() -> str:
    return _public_id("batch_")


class FilePurpose(models.TextChoices):
    """What a file is for: `batch` (an uploaded input), `batch_output` (a batch's output or error file)."""

    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"


class StoredFile(models.Model):
    """OpenAI's file object. The content is `PANTHEON_FILES_DIR/<id>` (written once, never changed); the row is
    its metadata. `owner` is the client token that uploaded it (null: uploaded with client tokens off, or written
    by a batch whose owner was null); a client token sees only its own files, an operator sees all.
    `line_count` is the number of JSONL lines an input file holds (checked at upload)."""

    id = models.CharField(primary_key=True, max_length=40, default=new_file_id, editable=False)
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    bytes = models.BigIntegerField()
    line_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="pruned by the periodic work after this")
    owner = models.ForeignKey(
        "pantheon_site.AccessToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"], name="file_owner_created")]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class BatchStatus(models.TextChoices):
    """OpenAI's batch statuses. validating: the input is being checked; in_progress: lines run; finalizing: the
    output and error files are being written; completed; failed (the input was refused); expired (the completion
    window ended first; what ran is kept); cancelling (lines in flight finish, no new one starts); cancelled."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


# The statuses a Celery task still has work in; the others are terminal.
ACTIVE_STATUSES = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING)
# The statuses a cancel moves to cancelling (batches/services.py do_cancel_batch); the UI offers Cancel on these.
CANCELLABLE_STATUSES = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


class Batch(models.Model):
    """OpenAI's batch object, plus what runs it: `waiting_reason` (why no line runs now: weights_torn,
    weights_held, model_reloading, server_busy, server_unavailable; blank while lines run) and the lease.
    `request_counts` are `total_count`, `completed_count` and `failed_count`, updated in the transaction that
    records each line. `errors` is the batch-level error list OpenAI returns for a refused input (a list of
    {code, message, param, line})."""

    id = models.CharField(primary_key=True, max_length=40, default=new_batch_id, editable=False)
    endpoint = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=16, default="24h")
    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING)
    # The input file may be deleted once no active batch reads it (batches/files.py refuses before); the batch keeps
    # its id, as OpenAI's does, so the column is not a database constraint.
    input_file = models.ForeignKey(StoredFile, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    output_file = models.ForeignKey(StoredFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error_file = models.ForeignKey(StoredFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    metadata = models.JSONField(null=True, blank=True)
    errors = models.JSONField(null=True, blank=True)
    owner = models.ForeignKey(
        "pantheon_site.AccessToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    total_count = models.PositiveIntegerField(default=0)
    completed_count = models.PositiveIntegerField(default=0)
    failed_count = models.PositiveIntegerField(default=0)
    waiting_reason = models.CharField(max_length=32, blank=True)
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(help_text="created_at + completion_window")
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="batch_owner_created"),
            models.Index(fields=["status", "lease_until"], name="batch_status_lease"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class LineState(models.TextChoices):
    """A line's progress: pending until its result is recorded, then succeeded (a 2xx answer, in the output
    file) or failed (in the error file), once."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class BatchLine(models.Model):
    """One input line of a batch: where it is in the input file (`number`, 1-based, and its byte `offset` and
    `length`), its `custom_id`, how many times it was sent to a model (`attempts`, counted before each send) and, once
    recorded, its output line (`result`: OpenAI's {id, custom_id, response, error}, with the X-miLLM-Model value in
    response.headers)."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    number = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    offset = models.BigIntegerField()
    length = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=LineState.choices, default=LineState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    recorded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "number"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "number"], name="one_row_per_line"),
            models.UniqueConstraint(fields=["batch", "custom_id"], name="custom_id_unique_in_batch"),
        ]
        indexes = [models.Index(fields=["batch", "state", "number"], name="line_batch_state")]

    def __str__(self) -> str:
        return f"{self.batch_id} line {self.number} ({self.state})"
