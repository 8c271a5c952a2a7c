"""Every state-changing route needs a token of the right role (or, under /ui/, a signed-in staff user and a CSRF
token), found by walking the URL configuration rather than listed by hand: a route added without a check fails here.

A route is state-changing for every method other than GET, HEAD and OPTIONS that it accepts: the methods its
`pantheon_site.methods.only` declares (`http_methods`), a DRF view's handlers, or every one for a view that declares
none. Each is called on a running server with a model loaded, with no token, with a local `manage.py` credential that
is not the server's, and with a token of every role the route's family does not admit, and must be refused (401, 403;
the UI's sign-in page or its CSRF refusal) in the route's envelope, while the database and the served models stay as
they were and every audit event written is a refusal.
"""

from __future__ import annotations

import re

import httpx
import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import close_old_connections
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from pantheon_site.auth import CLIENT_ROLES
from pantheon_site.local_credential import new_admin_secret
from pantheon_site.models import AuditChainHead, AuditEvent, Role
from pantheon_site.tokens import do_create_token
from tests.inference.conftest import serving_db, start_server  # noqa: F401  (the fixtures)
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
ROLES = tuple(Role.values)

# The roles a token needs, by the route's path (the first prefix that matches). A route under a prefix not named here
# fails the test until its family's rule is written down.
ADMITTED_ROLES = (
    ("/admin/", (Role.OPERATOR,)),
    ("/api/weights/clear-stale", (Role.OPERATOR,)),
    ("/api/weights/", (Role.TRAINER, Role.OPERATOR)),
    ("/v1/", CLIENT_ROLES),
    ("/session/", CLIENT_ROLES),
)

# Routes open on purpose, each with the reason. With PANTHEON_REQUIRE_CLIENT_TOKENS off (the default) the client
# routes take no token, as the spec's server took none: generating, and managing one's own sessions and responses.
OPEN_WITHOUT_CLIENT_TOKENS = {
    "/v1/chat/completions": "generation is open unless PANTHEON_REQUIRE_CLIENT_TOKENS is set",
    "/v1/completions": "generation is open unless PANTHEON_REQUIRE_CLIENT_TOKENS is set",
    "/v1/embeddings": "generation is open unless PANTHEON_REQUIRE_CLIENT_TOKENS is set",
    "/v1/responses": "generation is open unless PANTHEON_REQUIRE_CLIENT_TOKENS is set",
    "/v1/responses/<str:response_id>": "a client's stored response (DELETE forgets it), open like /v1/responses",
    "/v1/files": "uploading a batch input file, open like /v1 unless client tokens are required",
    "/v1/files/<str:file_id>": "a client's file (DELETE deletes it), open like /v1/files",
    "/v1/batches": "creating a batch, open like /v1 unless client tokens are required",
    "/v1/batches/<str:batch_id>/cancel": "a client's batch, open like /v1/batches",
    "/session/restore": "a client restores its own session, open like /v1 unless client tokens are required",
    "/session/release": "a client releases its own session, open like /v1 unless client tokens are required",
}
# Under /ui/, the sign-in form itself takes no session (it makes one); its CSRF check still applies.
UI_SIGN_IN = "/ui/login/"


def routes() -> list[tuple[str, object]]:
    """Every (route, view) of the URL configuration, nested includes walked, as `/prefix/<conv:name>` strings."""
    found = []

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                assert isinstance(pattern, URLPattern)
                found.append((prefix + str(pattern.pattern), pattern.callback))

    walk(get_resolver().url_patterns, "/")
    return found


def concrete(route: str) -> str:
    """A path the route matches: each converter filled with a value of its kind."""
    return re.sub(r"<(?:(\w+):)?\w+>", lambda m: "1" if m[1] == "int" else "x", route)


def unsafe_methods(view) -> list[str]:
    """The unsafe methods `view` accepts: those it declares (`only`), a DRF view's handlers, else all of them."""
    declared = getattr(view, "http_methods", None)
    if declared is None and hasattr(view, "cls"):  # a DRF APIView (the OpenAPI document's): the methods it handles
        declared = {m.upper() for m in view.cls.http_method_names if hasattr(view.cls, m)}
    return [m for m in UNSAFE_METHODS if declared is None or m in declared]


def admitted_roles(path: str) -> tuple[str, ...]:
    for prefix, roles in ADMITTED_ROLES:
        if path.startswith(prefix):
            return roles
    pytest.fail(f"{path}: no rule says which roles may call it (ADMITTED_ROLES)")


def assert_refused(response: httpx.Response, status: int, where: str) -> None:
    """A 401/403 in the envelope of the route's family."""
    assert response.status_code == status, f"{where}: {response.status_code} {response.text[:300]}"
    body = response.json()
    if response.url.path.startswith("/api/weights/"):
        expected = {401: "WEIGHTS_UNAUTHORIZED", 403: "WEIGHTS_FORBIDDEN"}[status]
        assert body["success"] is False and body["error"]["code"] == expected, where
    else:
        assert body["error"]["type"] == {401: "unauthorized", 403: "forbidden"}[status], where
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer", where


BOOKKEEPING = {"last_used_at", "last_heartbeat", "updated_at"}  # times the server moves on its own


def database_state() -> dict:
    """Every row of every table but the audit log and the UI's sessions, without the times that move by themselves."""
    state = {}
    for model in apps.get_models():
        if model in (AuditEvent, AuditChainHead, Session):
            continue
        fields = [f.attname for f in model._meta.concrete_fields if f.name not in BOOKKEEPING]
        state[model._meta.label] = list(model.objects.order_by("pk").values_list(*fields))
    close_old_connections()
    return state


def served_state(server, operator: str) -> list:
    rows = httpx.get(server.url + "/admin/models", headers=bearer(operator)).json()["data"]
    weights = httpx.get(server.url + "/api/health/detailed").json()["weights"]
    return [[(row["id"], row["state"]) for row in rows], weights]


@pytest.fixture
def tokens(transactional_db) -> dict[str, str]:
    return {role: do_create_token(role, f"{role}-probe")[1] for role in ROLES}


@pytest.fixture
def one_server(start_server):  # noqa: F811
    """`one_server(**env)`: a server for this test alone, stopped when it ends (servers on one database all mirror
    their workers into it, so another one still running would move the rows this test watches)."""
    started = []
    yield lambda **env: started.append(start_server(**env)) or started[-1]
    for server in started:
        server.stop()


def loaded_server(one_server, stories_hf_dir, operator: str, **env: str):
    server = one_server(**env)
    body = {"path": str(stories_hf_dir), "name": "stories"}
    loaded = httpx.post(server.url + "/admin/models/load", json=body, headers=bearer(operator), timeout=120)
    assert loaded.status_code == 200, loaded.text
    return server


def refused_only_since(first_event: int) -> set[str]:
    outcomes = set(AuditEvent.objects.filter(pk__gt=first_event).values_list("outcome", flat=True))
    close_old_connections()
    return outcomes


@pytest.mark.parametrize("client_tokens", [True, False], ids=["client-tokens", "open-v1"])
def test_every_state_changing_api_route_refuses_a_missing_or_wrong_role_token(
    one_server, stories_hf_dir, tokens, client_tokens
):
    server = loaded_server(
        one_server, stories_hf_dir, tokens[Role.OPERATOR], PANTHEON_REQUIRE_CLIENT_TOKENS=str(client_tokens).lower()
    )
    open_routes = {} if client_tokens else OPEN_WITHOUT_CLIENT_TOKENS
    api_routes = [(r, v) for r, v in routes() if not r.startswith("/ui/")]
    assert set(open_routes) <= {r for r, _ in api_routes}, "an open route named above no longer exists"
    before, served_before = database_state(), served_state(server, tokens[Role.OPERATOR])
    last_event = AuditEvent.objects.order_by("pk").last().pk
    probed = 0
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for route, view in api_routes:
            if route in open_routes:
                continue
            path = concrete(route)
            for method in UNSAFE_METHODS:
                accepted = method in unsafe_methods(view)
                response = http.request(method, path, json={})
                if not accepted:  # the method is refused as "unknown route", before any token is read
                    assert response.status_code == 404, f"{method} {path}"
                    continue
                probed += 1
                assert_refused(response, 401, f"{method} {path} without a token")
                forged = http.request(method, path, json={}, headers=bearer(new_admin_secret()))
                assert_refused(forged, 401, f"{method} {path} with a local credential of no running server")
                for role in set(ROLES) - set(admitted_roles(path)):
                    wrong = http.request(method, path, json={}, headers=bearer(tokens[role]))
                    assert_refused(wrong, 403, f"{method} {path} with a {role} token")
    assert probed >= 10  # the walk found the operator and weights routes
    assert refused_only_since(last_event) == {"refused"}
    assert database_state() == before
    assert served_state(server, tokens[Role.OPERATOR]) == served_before


def ui_session(user) -> str:
    """The session cookie of `user` signed in (the server shares this test's database and secret key)."""
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_every_state_changing_ui_route_needs_a_staff_session_and_a_csrf_token(one_server):
    server = one_server()
    staff = get_user_model().objects.create_user("olga", password="correct horse battery", is_staff=True)
    visitor = get_user_model().objects.create_user("pat", password="correct horse battery", is_staff=False)
    sessions = {"anonymous": None, "not staff": ui_session(visitor), "staff": ui_session(staff)}
    ui_routes = [r for r, _ in routes() if r.startswith("/ui/")]
    assert UI_SIGN_IN in ui_routes and len(ui_routes) >= 10
    before = database_state()
    with httpx.Client(base_url=server.url, timeout=30, follow_redirects=False) as http:
        for route in ui_routes:
            path = concrete(route)
            for method in UNSAFE_METHODS:
                for who, session in sessions.items():
                    cookies = {"Cookie": f"sessionid={session}"} if session else {}
                    response = http.request(method, path, data={"label": "x", "role": "client"}, headers=cookies)
                    where = f"{method} {path} as {who}"
                    if who == "staff" or path == UI_SIGN_IN:
                        # signed in, or on the sign-in form: the form's CSRF token is missing, nothing happens
                        assert response.status_code == 403 and "CSRF" in response.text, where
                    else:
                        assert response.status_code == 302, where
                        assert response.headers["location"].startswith(UI_SIGN_IN + "?next="), where
    assert database_state() == before
