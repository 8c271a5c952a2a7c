"""The router process's URL configuration (`manage.py router` serves this instead of pantheon_site.urls): the
registry, the router's /v1/models, GET / and /health, and the forwarded /v1 routes; any other path is 404 not_found
in the spec's envelope."""

from django.urls import path

from fleet import views

urlpatterns = [
    path("", views.root),
    path("health", views.health),
    path("registry/register", views.register),
    path("registry/heartbeat", views.heartbeat),
    path("v1/models", views.list_models),
    path("v1/<path:path>", views.forwarded),
]

handler400 = "pantheon_site.errors.handler400"
handler403 = "pantheon_site.errors.handler403"
handler404 = "pantheon_site.errors.handler404"
handler500 = "pantheon_site.errors.handler500"
