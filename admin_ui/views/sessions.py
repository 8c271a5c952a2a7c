"""The sessions page: each served model's resident sessions (id, conversations, tokens, last use, watched), and
release, export (a file download of POST /admin/session/export's body) and restore (upload of such a file).

All go through inference/services/sessions.py, as the session routes and `manage.py release_session` do. Release
audits itself (session_release); export and restore are audited here (session_export, session_restore), each with
the signed-in user as actor.
"""

import asyncio

from django.http import HttpResponse
from django.views.decorators.http import require_POST

from admin_ui.views import common
from admin_ui.views.common import Notice, ui_call
from inference.services import sessions
from inference.services.serving import router_if_serving, serving_router
from inference.services.session_export import read_export
from pantheon_site.audit import user_actor
from pantheon_site.errors import BadSessionBlob, PantheonError


async def _tables() -> list[dict]:
    """One entry per served model: its sessions, or why it has none to show."""
    serving = router_if_serving()
    if serving is None:
        return []
    tables = []
    for name in sorted(serving.serving_names()):
        try:
            tables.append({"model": name, "sessions": (await sessions.list_sessions(serving, name))["data"]})
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
        await sessions.do_release_session(
            serving_router(), name=model, session_id=session_id, actor=user_actor(request)
        )
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice(f"Released session {session_id} of {model}.")])


@require_POST
async def export(request):
    model, session_id = request.POST.get("model", ""), request.POST.get("session_id", "")
    try:
        async with ui_call(request, "session_export", model=model) as call:
            model, body = await sessions.export_session(serving_router(), model, session_id)
            call.details = {"session_id": session_id}
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="session-{model}-{session_id}.json"'
    return response


@require_POST
async def restore(request):
    model, session_id = request.POST.get("model", ""), request.POST.get("session_id", "").strip()
    upload = request.FILES.get("file")
    try:
        async with ui_call(request, "session_restore", model=model) as call:
            if upload is None:
                raise BadSessionBlob("choose an exported session file", reason="no_file")
            target = await asyncio.to_thread(read_export, model, session_id, upload.read())
            result = await sessions.restore_session(
                serving_router(), model, target.session_id, target.blob, target.tokens
            )
            call.details = {"session_id": result["session_id"], "n_tok": result["n_tok"]}
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice(f"Restored session {result['session_id']} ({result['n_tok']} tokens).")])
