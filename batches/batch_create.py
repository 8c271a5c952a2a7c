"""Creating a batch, called alike by the API, manage.py and the UI: the options checked, the input file's lines
checked, and the batch recorded with one BatchLine per request, whose Celery task is sent once the rows are committed.

OpenAI checks a batch's input after accepting the batch: a batch whose input breaks the rules is created and ends
`failed` with `errors` (`{"object": "list", "data": [{"code", "message", "param", "line"}]}`). Here the check runs
while the batch is created, so such a batch is answered already `failed` (with `failed_at`), and has no lines. The
codes are OpenAI's where it has one: invalid_json_line, missing_required_parameter, invalid_value, url_mismatch,
duplicate_custom_id, empty_file, too_many_tasks.

Bad options (an unknown endpoint, a completion window or metadata out of bounds, an input file the caller cannot
see or that is not a batch file) are refused with 400 (404 for the file) and create nothing.

Like an upload, creation is in steps so the HTTP edge can read the file off the thread that /v1 requests share for
their database work: `check_batch_options` (no I/O), `visible_input` (database), `read_batch_input` (the file only),
`record_batch` (database). `do_create_batch` is all of them, for callers with a thread of their own.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from batches.files import content_path
from batches.jsonl import NotAnObject, lines, parse_object
from batches.models import Batch, BatchLine, BatchStatus, FilePurpose, StoredFile
from batches.services import is_storable_text, visible_file, visible_to
from pantheon_site.errors import InvalidRequest, NotFound
from pantheon_site.models import AccessToken

logger = logging.getLogger("pantheon.batches")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
# A completion window is a whole number of hours, 1 to WINDOW_MAX_HOURS: OpenAI's "24h", and others for a job that
# should give up sooner or may take longer on a small machine.
WINDOW = re.compile(r"^([1-9][0-9]{0,2})h$")
WINDOW_MAX_HOURS = 168
# OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
METADATA_MAX_PAIRS, METADATA_KEY_MAX_CHARS, METADATA_VALUE_MAX_CHARS = 16, 64, 512
CUSTOM_ID_MAX_CHARS = BatchLine._meta.get_field("custom_id").max_length
# The errors a failed batch lists: the first this many (a file broken on every line is described by its first ones).
MAX_LISTED_ERRORS = 100
LINES_PER_INSERT = 2000


@dataclass(frozen=True)
class BatchOptions:
    """A create call's options, checked."""

    input_file_id: str
    endpoint: str
    completion_window: str
    window: timedelta
    metadata: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class LineSpot:
    """Where a request lies in the input file: its line number, byte offset and length, and its custom_id."""

    number: int
    offset: int
    length: int
    custom_id: str


@dataclass
class BatchInput:
    """The input file read: the requests it holds, or the errors that make the batch fail."""

    spots: list[LineSpot] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def _bad(message: str, param: str, reason: str) -> InvalidRequest:
    return InvalidRequest(message, reason=reason, param=param, code="invalid_value")


def check_batch_options(
    *, input_file_id: Any, endpoint: Any, completion_window: Any = "24h", metadata: Any = None
) -> BatchOptions:
    """The options of a create call, checked (types too: they may come from a JSON body); raises InvalidRequest
    naming the field at fault."""
    if not isinstance(input_file_id, str) or not input_file_id:
        raise _bad("input_file_id must be the id of an uploaded file", "input_file_id", "batch_input_file")
    if endpoint not in ENDPOINTS:
        raise _bad(f"endpoint must be one of {', '.join(ENDPOINTS)} (got {endpoint!r:.80})", "endpoint", "endpoint")
    hours = WINDOW.match(completion_window) if isinstance(completion_window, str) else None
    if hours is None or int(hours[1]) > WINDOW_MAX_HOURS:
        raise _bad(
            f"completion_window must be a whole number of hours from 1h to {WINDOW_MAX_HOURS}h, such as 24h "
            f"(got {completion_window!r:.40})",
            "completion_window",
            "completion_window",
        )
    return BatchOptions(input_file_id, endpoint, completion_window, timedelta(hours=int(hours[1])), _metadata(metadata))


def _metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > METADATA_MAX_PAIRS:
        raise _bad(f"metadata must be an object of at most {METADATA_MAX_PAIRS} pairs", "metadata", "metadata")
    for key, value in metadata.items():
        if (
            not isinstance(key, str)
            or len(key) > METADATA_KEY_MAX_CHARS
            or not isinstance(value, str)
            or len(value) > METADATA_VALUE_MAX_CHARS
            or not (is_storable_text(key) and is_storable_text(value))
        ):
            raise _bad(
                f"metadata keys must be strings of at most {METADATA_KEY_MAX_CHARS} characters and its values strings "
                f"of at most {METADATA_VALUE_MAX_CHARS} (UTF-8, no NUL; key {key!r:.80})",
                "metadata",
                "metadata",
            )
    return dict(metadata)


def visible_input(input_file_id: str, viewer: AccessToken | None) -> StoredFile:
    """The input file, if the viewer may see it (NotFound otherwise) and it was uploaded for batches."""
    stored = visible_file(input_file_id, viewer)
    if stored.purpose != FilePurpose.BATCH:
        raise _bad(f"file {stored.id} has purpose {stored.purpose}, not batch", "input_file_id", "batch_input_purpose")
    return stored


def read_batch_input(input_file_id: str, endpoint: str) -> BatchInput:
    """Reads the input file's lines and checks each request: a JSON object with `custom_id` (a string, unique in the
    file), `method` "POST", `url` the batch's endpoint and `body` an object. No database access."""
    found = BatchInput()
    seen: dict[str, int] = {}
    count = 0
    try:
        stream = content_path(input_file_id).open("rb")
    except FileNotFoundError:  # deleted since its row was read
        raise NotFound(f"no file {input_file_id!r}", reason="file_not_found") from None
    with stream:
        for line in lines(stream):
            count += 1
            if count > settings.PANTHEON_BATCH_MAX_LINES:
                limit = settings.PANTHEON_BATCH_MAX_LINES
                message = f"the input file holds more than {limit} requests (PANTHEON_BATCH_MAX_LINES)"
                return BatchInput(errors=[_error("too_many_tasks", message, None, None)])
            try:
                custom_id = _request_id(line.raw, line.number, endpoint, seen)
            except _BadLine as bad:
                if len(found.errors) < MAX_LISTED_ERRORS:
                    found.errors.append(bad.entry)
                continue
            if not found.errors:
                found.spots.append(LineSpot(line.number, line.offset, line.length, custom_id))
    if count == 0:
        found.errors.append(_error("empty_file", "the input file holds no requests", None, None))
    if found.errors:
        found.spots = []
    return found


class _BadLine(Exception):
    """A request line that breaks the rules; `entry` is its entry in the batch's `errors`."""

    def __init__(self, code: str, message: str, param: str | None, line: int):
        super().__init__(message)
        self.entry = _error(code, message, param, line)


def _request_id(raw: bytes, number: int, endpoint: str, seen: dict[str, int]) -> str:
    """The custom_id of a good request line, added to `seen` (custom_id -> its line); raises _BadLine naming what is
    wrong with it."""
    try:
        request = parse_object(raw)
    except NotAnObject as exc:
        raise _BadLine("invalid_json_line", f"this line is not a JSON object: {exc}", None, number) from None
    for name in ("custom_id", "method", "url", "body"):
        if name not in request:
            raise _BadLine("missing_required_parameter", f"this request has no {name}", name, number)
    custom_id = request["custom_id"]
    if (
        not isinstance(custom_id, str)
        or not 1 <= len(custom_id) <= CUSTOM_ID_MAX_CHARS
        or not is_storable_text(custom_id)
    ):
        message = f"custom_id must be a string of 1 to {CUSTOM_ID_MAX_CHARS} characters (UTF-8, no NUL)"
        raise _BadLine("invalid_value", message, "custom_id", number)
    if request["method"] != "POST":
        raise _BadLine("invalid_value", f"method must be POST (got {request['method']!r:.40})", "method", number)
    if request["url"] != endpoint:
        message = f"the url of this request ({request['url']!r:.80}) is not the batch's endpoint {endpoint}"
        raise _BadLine("url_mismatch", message, "url", number)
    if not isinstance(request["body"], dict):
        raise _BadLine("invalid_value", "body must be a JSON object", "body", number)
    if custom_id in seen:
        message = f"custom_id {custom_id!r:.80} is also the custom_id of line {seen[custom_id]}; each must be unique"
        raise _BadLine("duplicate_custom_id", message, "custom_id", number)
    seen[custom_id] = number
    return custom_id


def _error(code: str, message: str, param: str | None, line: int | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def record_batch(options: BatchOptions, found: BatchInput, viewer: AccessToken | None) -> Batch:
    """Records the batch: `failed` with its errors, or `validating` with one pending BatchLine per request, whose
    Celery task is sent once the transaction commits. NotFound if the input file was deleted meanwhile."""
    now = timezone.now()
    with transaction.atomic():
        # Locked as files.do_delete_file locks it: the file is not deleted under a batch being created.
        locked = visible_to(StoredFile.objects.select_for_update(), viewer).filter(pk=options.input_file_id)
        if not locked.exists():
            raise NotFound(f"no file {options.input_file_id!r}", reason="file_not_found")
        batch = Batch(
            endpoint=options.endpoint,
            completion_window=options.completion_window,
            input_file_id=options.input_file_id,
            metadata=options.metadata,
            owner=viewer,
            created_at=now,
            expires_at=now + options.window,
        )
        if found.errors:
            batch.status, batch.failed_at = BatchStatus.FAILED, now
            batch.errors = {"object": "list", "data": found.errors}
            batch.save(force_insert=True)
            return batch
        batch.total_count = len(found.spots)
        batch.save(force_insert=True)
        BatchLine.objects.bulk_create(
            (
                BatchLine(batch=batch, number=s.number, custom_id=s.custom_id, offset=s.offset, length=s.length)
                for s in found.spots
            ),
            batch_size=LINES_PER_INSERT,
        )
        transaction.on_commit(lambda: dispatch(batch.id))
    return batch


def dispatch(batch_id: str) -> None:
    """Sends the batch's Celery task. A broker that cannot be reached is logged, not raised: the batch stays
    `validating` and the runner's periodic sweep starts it later."""
    from batches.tasks import run_batch  # celery's task module, imported when a batch is sent

    try:
        run_batch.delay(batch_id)
    except Exception:
        logger.warning(
            "batch %s: its task could not be sent; the periodic sweep will start it", batch_id, exc_info=True
        )


def do_create_batch(
    *,
    input_file_id: str,
    endpoint: str,
    completion_window: str = "24h",
    metadata: dict[str, str] | None = None,
    viewer: AccessToken | None,
) -> Batch:
    """Creates a batch owned by `viewer` (see the module's docstring): InvalidRequest or NotFound for bad options,
    else the batch, `validating` (its task sent on commit) or `failed` with `errors`."""
    options = check_batch_options(
        input_file_id=input_file_id, endpoint=endpoint, completion_window=completion_window, metadata=metadata
    )
    visible_input(options.input_file_id, viewer)
    return record_batch(options, read_batch_input(options.input_file_id, options.endpoint), viewer)
