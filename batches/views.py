"""OpenAI's Files and Batch APIs, the HTTP edge only: parse, call batches/files.py, batch_create.py and services.py,
shape the objects (wire.py), map errors (pantheon_site/errors.py). docs/api/batches.md is the wire.

With PANTHEON_REQUIRE_CLIENT_TOKENS on, every route needs a client, trainer or operator token, and a token sees only
the files and batches it made (an operator's sees all): another's id is 404, as an id that does not exist. With it
off, no token is read and everything is visible.

The slow work (parsing a multipart upload, checking and copying up to PANTHEON_FILE_MAX_BYTES, reading a batch's
input file, sending a file's content) runs on threads of its own, never on the one thread /v1 requests share for
their database work (pantheon_site/asgi_handler.py); the database work runs there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

from asgiref.sync import sync_to_async
from django.core.exceptions import SuspiciousOperation
from django.http import JsonResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError

from batches import batch_create, files, services
from batches.models import Batch, StoredFile
from batches.wire import batch_object, file_object, list_body, page
from inference.api.serializers import parse_json_object
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import InvalidRequest, NotFound
from pantheon_site.methods import only

# OpenAI's page sizes: files up to 10,000 (all by default), batches 1 to 100 (20 by default).
FILE_PAGE = (10_000, 10_000)  # (default, most)
BATCH_PAGE = (20, 100)
CONTENT_CHUNK = 1024 * 1024


# -- files ---------------------------------------------------------------------------------------------------------


@only("GET", "POST")
async def file_collection(request):
    """POST /v1/files (upload, multipart) or GET /v1/files (list)."""
    if request.method == "POST":
        owner = await arequire_client_token(request, operation="file_upload")
        return JsonResponse(file_object(await _upload(request, owner)))
    viewer = await arequire_client_token(request, operation="file_list")
    query = request.GET
    limit = _limit(query.get("limit"), *FILE_PAGE)
    ascending = _order(query.get("order"))
    rows = services.visible_to(StoredFile.objects.all(), viewer)
    if query.get("purpose"):
        if not services.is_storable_text(query["purpose"]):
            raise InvalidRequest("purpose: not a purpose", reason="file_purpose", param="purpose")
        rows = rows.filter(purpose=query["purpose"])
    found, has_more = await sync_to_async(page)(rows, after=query.get("after"), limit=limit, ascending=ascending)
    return JsonResponse(list_body([file_object(f) for f in found], has_more))


async def _upload(request, owner) -> StoredFile:
    form, uploaded = await asyncio.to_thread(_form, request)
    purpose = form.get("purpose", "")
    filename = uploaded.name or ""
    seconds = _expiry(form)
    files.check_upload_options(purpose, filename, seconds)
    uploaded.seek(0)
    staged = await _stage(uploaded.file)
    try:
        return await sync_to_async(files.record_upload)(
            staged, filename=filename, purpose=purpose, owner=owner, expires_after_seconds=seconds
        )
    finally:
        staged.discard()  # gone already unless the request was cancelled before it was recorded


async def _stage(source: BinaryIO) -> files.StagedFile:
    """files.stage_upload on a thread of its own. If the request is cancelled meanwhile (the client went away), the
    thread still ends, and what it staged is discarded then."""
    work = asyncio.ensure_future(asyncio.to_thread(files.stage_upload, source))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        work.add_done_callback(_discard_staged)
        raise


def _discard_staged(work: asyncio.Future) -> None:
    if not work.cancelled() and work.exception() is None:
        work.result().discard()


def _form(request) -> tuple[Any, Any]:
    """The multipart form's fields and its `file` part; InvalidRequest for a body that is not such a form."""
    try:
        form, parts = request.POST, request.FILES
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise InvalidRequest(f"the body is not a readable multipart form: {exc}", reason="multipart") from None
    uploaded = parts.get("file")
    if uploaded is None:
        raise InvalidRequest(
            "the body must be a multipart form with a `file` part and a `purpose` field",
            reason="file_missing",
            param="file",
            code="missing_required_parameter",
        )
    return form, uploaded


def _expiry(form) -> int | None:
    """expires_after[seconds], when the form sets expires_after (its anchor must be created_at, as OpenAI's)."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequest(
            "expires_after[anchor] must be created_at", reason="file_expiry", param="expires_after[anchor]"
        )
    try:
        return int(seconds or "")
    except ValueError:
        raise InvalidRequest(
            "expires_after[seconds] must be a whole number of seconds",
            reason="file_expiry",
            param="expires_after[seconds]",
        ) from None


@only("GET", "DELETE")
async def file_item(request, file_id: str):
    """GET /v1/files/{id} (the file object) or DELETE /v1/files/{id}."""
    if request.method == "DELETE":
        viewer = await arequire_client_token(request, operation="file_delete")
        await sync_to_async(files.do_delete_file)(file_id, viewer)
        return JsonResponse({"id": file_id, "object": "file", "deleted": True})
    viewer = await arequire_client_token(request, operation="file_read")
    return JsonResponse(file_object(await sync_to_async(services.visible_file)(file_id, viewer)))


@only("GET")
async def file_content(request, file_id: str):
    """GET /v1/files/{id}/content: the file's bytes."""
    viewer = await arequire_client_token(request, operation="file_read")
    stored = await sync_to_async(services.visible_file)(file_id, viewer)
    try:
        handle = await asyncio.to_thread(files.content_path(stored.id).open, "rb")
    except FileNotFoundError:  # deleted since the row was read
        raise NotFound(f"no file {file_id!r}", reason="file_not_found") from None
    response = StreamingHttpResponse(_chunks(handle), content_type="application/jsonl")
    response["Content-Length"] = str(stored.bytes)
    response["Content-Disposition"] = f'attachment; filename="{_header_safe(stored.filename)}"'
    return response


async def _chunks(handle: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(handle.read, CONTENT_CHUNK):
            yield chunk
    finally:
        handle.close()


def _header_safe(name: str) -> str:
    return "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)


# -- batches -------------------------------------------------------------------------------------------------------


@only("GET", "POST")
async def batch_collection(request):
    """POST /v1/batches (create) or GET /v1/batches (list, newest first)."""
    if request.method == "POST":
        owner = await arequire_client_token(request, operation="batch_create")
        return JsonResponse(batch_object(await _create(request, owner)))
    viewer = await arequire_client_token(request, operation="batch_list")
    limit = _limit(request.GET.get("limit"), *BATCH_PAGE)
    rows = services.visible_to(Batch.objects.all(), viewer)
    found, has_more = await sync_to_async(page)(rows, after=request.GET.get("after"), limit=limit)
    return JsonResponse(list_body([batch_object(b) for b in found], has_more))


async def _create(request, owner) -> Batch:
    body = parse_json_object(request.body)
    if body.get("output_expires_after") is not None:
        raise InvalidRequest(
            "output_expires_after is not supported: output files are kept until deleted",
            reason="output_expires_after",
            param="output_expires_after",
        )
    options = batch_create.check_batch_options(
        input_file_id=body.get("input_file_id"),
        endpoint=body.get("endpoint"),
        completion_window=body.get("completion_window", "24h"),
        metadata=body.get("metadata"),
    )
    await sync_to_async(batch_create.visible_input)(options.input_file_id, owner)
    found = await asyncio.to_thread(batch_create.read_batch_input, options.input_file_id, options.endpoint)
    return await sync_to_async(batch_create.record_batch)(options, found, owner)


@only("GET")
async def batch_item(request, batch_id: str):
    """GET /v1/batches/{id}."""
    viewer = await arequire_client_token(request, operation="batch_read")
    return JsonResponse(batch_object(await sync_to_async(services.visible_batch)(batch_id, viewer)))


@only("POST")
async def batch_cancel(request, batch_id: str):
    """POST /v1/batches/{id}/cancel: the batch, cancelling (or as it was, if it was cancelling or cancelled)."""
    viewer = await arequire_client_token(request, operation="batch_cancel")
    return JsonResponse(batch_object(await sync_to_async(services.do_cancel_batch)(batch_id, viewer)))


# -- query parameters ----------------------------------------------------------------------------------------------


def _limit(raw: str | None, default: int, most: int) -> int:
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise InvalidRequest(f"limit must be a whole number from 1 to {most}", reason="page_limit", param="limit")
    return limit


def _order(raw: str | None) -> bool:
    """Whether `order` asks for the oldest first (asc); desc, the default, is the newest first."""
    if raw not in (None, "asc", "desc"):
        raise InvalidRequest("order must be asc or desc", reason="page_order", param="order")
    return raw == "asc"
