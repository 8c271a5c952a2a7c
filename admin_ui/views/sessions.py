"""The sessions page: each served model's resident sessions (id, conversations, tokens, last use, watched), and
release, export (a file download of POST /admin/session/export's body) and restore (upload of such a file).

All go through inference/services/sessions.py, as the session routes and `manage.py release_session` do. Release
audits itself (session_release); export and restore are audited here (session_export, session_restore), each with
the signed-in user as actor.
"""

import asyncio
import json

from django.http import HttpResponse
from django.views.decorators.http import require_POST

from admin_ui.views import common
from admin_ui.views.common import Notice, ui_call
from inference.api.session_requests import parse_restore_request
from inference.runtime.router import get_router, installed_router
from inference.services import sessions
from pantheon_site.audit import user_actor
from pantheon_site.errors import BadSessionBlob, PantheonError


async def _tables() -> list[dict]:
    """One entry per served model: its sessions, or why it has none to show."""
    router = installed_router()
    if router is None:
        return []
    tables = []
    for name in sorted(router.serving_names()):
        try:
            tables.append({"model": name, "sessions": (await sessions.list_sessions(router, name))["data"]})
        except PantheonError as error:
            tables.append({"model": name, "sessions": [], "error": error.message})
    return tables


async def _render(request, notices: list[Notice] | None = None):
    return common.page(request, "admin_ui/sessions.html", "sessions", notices, tables=await _tables())


async def page(request):
    return await _render(request)


@require_POST
async def release(request):
    model, session_id = request.POST.get("model", ""), request.POST.get("session_id", "")
    try:
        await sessions.do_release_session(get_router(), name=model, session_id=session_id, actor=user_actor(request))
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice(f"Released session {session_id} of {model}.")])


@require_POST
async def export(request):
    model, session_id = request.POST.get("model", ""), request.POST.get("session_id", "")
    try:
        async with ui_call(request, "session_export", model=model) as call:
            model, body = await sessions.export_session(get_router(), model, session_id)
            call.details = {"session_id": session_id}
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="session-{model}-{session_id}.json"'
    return response


def _restore_body(model: str, session_id: str, upload: bytes) -> bytes:
    """An export file as POST /session/restore's body, under `session_id` (empty: the file's own)."""
    try:
        exported = json.loads(upload)
        blob, tokens = exported["blob_b64"], exported["tokens"]
    except (ValueError, KeyError, TypeError):
        raise BadSessionBlob("the file is not a session export", reason="not_an_export") from None
    body = {"name": model, "session_id": session_id or exported.get("session_id", ""), "blob": blob, "tokens": tokens}
    return json.dumps(body).encode()


@require_POST
async def restore(request):
    model, session_id = request.POST.get("model", ""), request.POST.get("session_id", "").strip()
    upload = request.FILES.get("file")
    try:
        async with ui_call(request, "session_restore", model=model) as call:
            if upload is None:
                raise BadSessionBlob("choose an exported session file", reason="no_file")
            raw = _restore_body(model, session_id, upload.read())
            target = await asyncio.to_thread(parse_restore_request, raw, {})
            result = await sessions.restore_session(get_router(), model, target.session_id, target.blob, target.tokens)
            call.details = {"session_id": result["session_id"], "n_tok": result["n_tok"]}
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice(f"Restored session {result['session_id']} ({result['n_tok']} tokens).")])
