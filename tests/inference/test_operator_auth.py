"""/admin/* called with the running server's local credential (what `manage.py` uses): one audit event per call,
attributed to the OS user the command names, accepted or refused like a token's call."""

import pytest
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import JsonResponse
from django.urls import path

from inference.api.operator_auth import admin_route
from pantheon_site.errors import UnloadFailed
from pantheon_site.local_credential import ACTOR_HEADER, install_local_secret, new_admin_secret
from pantheon_site.models import AuditEvent
from pantheon_site.urls import handler404, handler500  # noqa: F401  (this test urlconf uses the project's)


@admin_route("model_unload")
async def unload(request):
    request.audit.model = request.GET.get("model", "")
    if request.GET.get("fail"):
        raise UnloadFailed("model 'm' is not loaded", status=404, reason="not_loaded")
    request.audit.details = {"aborted": 0}
    return JsonResponse({"unloaded": request.audit.model})


urlpatterns = [path("admin/unload", unload)]
pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def local_secret():
    secret = new_admin_secret()
    install_local_secret(secret)
    yield secret
    install_local_secret(None)


def events() -> list[tuple]:
    fields = ("operation", "outcome", "error_type", "reason", "actor_kind", "actor_label", "model", "details")
    found = list(AuditEvent.objects.order_by("id").values_list(*fields))
    close_old_connections()
    return found


async def test_local_calls_are_audited_as_the_commands_user(async_client, local_secret):
    headers = {"Authorization": f"Bearer {local_secret}", ACTOR_HEADER: "alice"}
    assert (await async_client.get("/admin/unload", {"model": "m"}, headers=headers)).status_code == 200
    assert (await async_client.get("/admin/unload", {"model": "m", "fail": "1"}, headers=headers)).status_code == 404
    stale = {"Authorization": f"Bearer {new_admin_secret()}", ACTOR_HEADER: "alice"}
    assert (await async_client.get("/admin/unload", {"model": "m"}, headers=stale)).status_code == 401
    assert await sync_to_async(events)() == [
        ("model_unload", "accepted", "", "", "cli", "alice", "m", {"aborted": 0}),
        (
            "model_unload",
            "refused",
            "unload_failed",
            "not_loaded",
            "cli",
            "alice",
            "m",
            {"message": "model 'm' is not loaded"},
        ),
        (
            "model_unload",
            "refused",
            "unauthorized",
            "local_secret_unknown",
            "anonymous",
            "",
            "",
            {"message": "a valid bearer token is required"},
        ),
    ]
