"""The batches page: every batch newest first (status, why it waits, times, request counts, a progress bar, links
to its output and error files), filtered by status, paged by keyset; and cancel.

The rows are batches/batch_rows.py's, read as an operator reads them (viewer None: every batch). The list is a
partial that polls itself while any batch still has work in it, and stops once none has. Cancel runs
batches/services.py's do_cancel_batch, as POST /v1/batches/{id}/cancel does, audited as batch_cancel with the
signed-in user as actor. A file's content is served under /ui/ to the signed-in staff user, as
GET /v1/files/{id}/content serves it to a token: a plain link to /v1 would need a bearer token the browser does not
send when client tokens are required.
"""

from urllib.parse import urlencode

from django.http import FileResponse, Http404
from django.views.decorators.http import require_GET, require_POST

from admin_ui.views import common
from admin_ui.views.common import Notice, ui_call
from batches.batch_rows import BatchPage, any_active, batch_page
from batches.files import content_path
from batches.models import BatchStatus
from batches.services import do_cancel_batch, visible_file
from pantheon_site.errors import PantheonError

PAGE_SIZE = 25


def _query(status: str, after: str) -> str:
    """A list's query string: its status filter and cursor, those that are set."""
    return urlencode({name: value for name, value in (("status", status), ("after", after)) if value})


def _listing(request, notices: list[Notice]) -> dict:
    """The list under the query string's status and cursor; one it cannot read shows why, over an empty list."""
    status, after = request.GET.get("status", "").strip(), request.GET.get("after", "").strip()
    try:
        listing = batch_page(None, limit=PAGE_SIZE, after=after, status=status)
    except PantheonError as error:
        notices.append(Notice(error.message, "error"))
        listing = BatchPage([], has_more=False)
    return {
        "listing": listing,
        "status": status,
        "statuses": BatchStatus.values,
        "query": _query(status, after),
        "older_query": _query(status, listing.rows[-1].object["id"]) if listing.has_more else "",
        "paged": bool(after),
        "polling": any_active(None),
    }


def _render(request, notices: list[Notice] | None = None, template: str = "admin_ui/batches.html"):
    notices = list(notices or [])
    context = _listing(request, notices)
    return common.page(request, template, "batches", notices, **context)


@require_GET
def page(request):
    return _render(request)


@require_GET
def live(request):
    """The list alone, which the page polls while a batch is active."""
    return _render(request, template="admin_ui/batches_live.html")


@require_POST
def cancel(request):
    batch_id = request.POST.get("batch_id", "")
    try:
        with ui_call(request, "batch_cancel") as call:
            call.details = {"batch_id": batch_id}
            batch = do_cancel_batch(batch_id, None)
            call.details["status"] = batch.status
    except PantheonError as error:
        return _render(request, [Notice(error.message, "error")])
    return _render(request, [Notice(f"Batch {batch.id} is {batch.status}: lines in flight finish, no other starts.")])


@require_GET
def file_content(request, file_id: str):
    """A batch's input, output or error file, as GET /v1/files/{id}/content answers an operator."""
    try:
        stored = visible_file(file_id, None)
        handle = content_path(stored.id).open("rb")
    except (PantheonError, OSError):
        raise Http404(f"no file {file_id!r}") from None
    return FileResponse(handle, content_type="application/jsonl", filename=stored.filename)
