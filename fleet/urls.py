"""The router process's URL configuration (`manage.py router` serves this instead of pantheon_site.urls): the
registry, the router's /v1/models, GET / and /health, the forwarded /v1 routes, and the session export
(fleet/session_relay.py); any other path is 404 not_found in the spec's envelope."""

from django.urls import path

from fleet import session_relay, views

urlpatterns = [
    path("", views.root),
    path("health", views.health),
    path("registry/register", views.register),
    path("registry/heartbeat", views.heartbeat),
    path("v1/models", views.list_models),
    path("admin/session/export", session_relay.export_view),
    path("v1/<path:path>", views.forwarded),
]

handler400 = "pantheon_site.errors.handler400"
handler403 = "pantheon_site.errors.handler403"
handler404 = "pantheon_site.errors.handler404"
handler500 = "pantheon_site.errors.handler500"
