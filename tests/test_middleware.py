"""The middleware every API request runs through does its work on the event loop: no hook hops to the sync thread
(one hop per hook cost each API request milliseconds on a busy host, docs/performance.md), the security and framing
headers are still set, and sessions and CSRF stay under /ui/."""

from asgiref.sync import SyncToAsync
from django.test import AsyncClient


async def test_an_api_request_passes_the_middleware_without_a_thread_hop(monkeypatch):
    hopped = []
    real_init = SyncToAsync.__init__

    def spy(self, func, *args, **kwargs):
        hopped.append(getattr(func, "__qualname__", repr(func)))
        real_init(self, func, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__init__", spy)
    response = await AsyncClient().get("/v1/models")
    assert response.status_code == 200 and response.json()["object"] == "list"
    assert [name for name in hopped if "Middleware" in name] == []
    assert response["X-Content-Type-Options"] == "nosniff" and response["X-Frame-Options"] == "DENY"
    assert not {"sessionid", "csrftoken"} & set(response.cookies)


async def test_the_ui_still_gets_its_session_and_csrf_cookie(db):
    response = await AsyncClient().get("/ui/login/")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies
    assert response["X-Frame-Options"] == "DENY"
