"""The serving control plane's routes (spec: "Routes"). Any other path is 404 not_found (pantheon_site.urls)."""

from django.urls import path

from inference.api import admin, completions, embeddings, health, openai, responses, sessions

urlpatterns = [
    path("", health.health),
    path("api/health/detailed", health.health_detailed),
    path("v1/models", openai.list_models),
    path("v1/chat/completions", openai.chat_completions),
    path("v1/completions", completions.completions),
    path("v1/embeddings", embeddings.embeddings),
    path("v1/responses", responses.create),
    path("v1/responses/<str:response_id>", responses.stored),
    path("admin/models", admin.list_instances),
    path("admin/models/load", admin.load),
    path("admin/models/unload", admin.unload),
    path("admin/dies", admin.list_dies),
    path("admin/sessions", sessions.list_sessions),
    path("admin/session/export", sessions.export),
    path("session/restore", sessions.restore),
    path("session/release", sessions.release),
    path("session/estimate", sessions.estimate),
    path("session/watch", sessions.watch),
]
