"""Who reaches the UI: staff users only, every form behind CSRF, and a token's secret on its creation page alone."""

import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, get_resolver, reverse

from pantheon_site.models import AccessToken, AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery"


def ui_urls() -> list[str]:
    """Every UI route, with a made-up id where it takes one, and one path no route matches."""
    patterns = get_resolver().url_patterns
    ui = next(p for p in patterns if getattr(p, "namespace", None) == "ui")
    urls = []
    for pattern in ui.url_patterns:
        assert isinstance(pattern, URLPattern)
        kwargs = {name: 1 for name in pattern.pattern.converters}
        urls.append(reverse(f"ui:{pattern.name}", kwargs=kwargs))
    return [*urls, "/ui/no-such-page/"]


def text_of(response) -> str:
    if not response.streaming:
        return response.content.decode(errors="replace")

    async def collect() -> bytes:
        return b"".join([piece async for piece in response.streaming_content])

    return async_to_sync(collect)().decode(errors="replace")


@pytest.fixture
def staff():
    return get_user_model().objects.create_user("olga", password=PASSWORD, is_staff=True)


@pytest.fixture
def signed_in(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client


@pytest.mark.parametrize("method", ["get", "post"])
def test_anonymous_users_get_the_sign_in_page_for_every_ui_url(method):
    client = Client()
    for url in ui_urls():
        if url.startswith(reverse("ui:login")):
            continue
        response = getattr(client, method)(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/ui/login/?next="), url


def test_a_user_who_is_not_staff_cannot_sign_in_or_see_a_page():
    user = get_user_model().objects.create_user("pat", password=PASSWORD, is_staff=False)
    client = Client()
    response = client.post(reverse("ui:login"), {"username": "pat", "password": PASSWORD})
    assert response.status_code == 200 and "not a staff account" in response.content.decode()
    client.force_login(user)
    assert client.get(reverse("ui:tokens"))["Location"].startswith("/ui/login/")
    refused = AuditEvent.objects.get(operation="ui_sign_in")
    assert (refused.outcome, refused.actor_label) == ("refused", "pat")


def test_signing_in_leads_to_the_dashboard_and_is_audited(staff):
    client = Client()
    response = client.post(reverse("ui:login"), {"username": "olga", "password": PASSWORD, "next": "/ui/tokens/"})
    assert response.status_code == 302 and response["Location"] == "/ui/tokens/"
    assert client.get("/ui/tokens/").status_code == 200
    event = AuditEvent.objects.get(operation="ui_sign_in")
    assert (event.outcome, event.actor_kind, event.actor_label) == ("accepted", "user", "olga")


def test_a_form_post_without_a_csrf_token_is_refused_and_changes_nothing(staff):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    response = client.post(reverse("ui:tokens"), {"role": "client", "label": "sneaky"})
    assert response.status_code == 403
    assert "CSRF" in response.content.decode()
    assert not AccessToken.objects.filter(label="sneaky").exists()
    page = client.get(reverse("ui:tokens")).content.decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    accepted = client.post(reverse("ui:tokens"), {"role": "client", "label": "honest", "csrfmiddlewaretoken": csrf})
    assert accepted.status_code == 200 and AccessToken.objects.filter(label="honest").exists()


def test_the_api_takes_no_csrf_token_and_sets_no_cookie():
    client = Client(enforce_csrf_checks=True)
    response = client.post("/v1/chat/completions", data="{}", content_type="application/json")
    assert response.status_code != 403
    assert response.json()["error"]["type"] != "forbidden"
    assert not response.cookies


def test_a_token_secret_is_shown_once_on_its_creation_page_only(signed_in):
    created = signed_in.post(reverse("ui:tokens"), {"role": "operator", "label": "deploy-bot"})
    secret = re.search(r'<code id="token-secret">(pth_[^<]+)</code>', created.content.decode())[1]
    assert AccessToken.objects.get(label="deploy-bot").prefix == secret[:8]
    for url in ui_urls():
        assert secret not in text_of(signed_in.get(url)), url
    revoked = signed_in.post(reverse("ui:token-revoke"), {"label": "deploy-bot"}).content.decode()
    assert secret not in revoked and "revoked" in revoked


def test_token_actions_are_audited_with_the_user_as_actor(signed_in):
    signed_in.post(reverse("ui:tokens"), {"role": "client", "label": "app"})
    signed_in.post(reverse("ui:token-revoke"), {"label": "app"})
    signed_in.post(reverse("ui:token-revoke"), {"label": "nobody"})
    events = list(AuditEvent.objects.filter(operation__startswith="token_").order_by("id"))
    assert [(e.operation, e.outcome, e.actor_kind, e.actor_label) for e in events] == [
        ("token_create", "accepted", "user", "olga"),
        ("token_revoke", "accepted", "user", "olga"),
        ("token_revoke", "refused", "user", "olga"),
    ]
    assert AccessToken.objects.get(label="app").state() == "revoked"


def test_a_refused_create_says_why_in_words(signed_in):
    signed_in.post(reverse("ui:tokens"), {"role": "client", "label": "twice"})
    page = signed_in.post(reverse("ui:tokens"), {"role": "client", "label": "twice"}).content.decode()
    assert "already exists" in page
    assert AccessToken.objects.filter(label="twice").count() == 1


def test_an_unknown_ui_page_is_an_html_404_for_staff(signed_in):
    response = signed_in.get("/ui/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html") and "unknown route" in response.content.decode()
