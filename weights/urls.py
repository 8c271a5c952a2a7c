"""The /api/weights routes (weights/views.py)."""

from django.urls import path

from weights import views

urlpatterns = [
    path("api/weights/attach", views.attach),
    path("api/weights/detach", views.detach),
    path("api/weights/heartbeat", views.heartbeat),
    path("api/weights/quiesce", views.quiesce),
    path("api/weights/resume", views.resume),
    path("api/weights/commit-begin", views.commit_begin),
    path("api/weights/commit-end", views.commit_end),
    path("api/weights/clear-stale", views.clear_stale),
    path("api/weights/save", views.save),
    path("api/weights/load", views.load),
    path("api/weights/status", views.status),
    path("api/weights/lineage", views.lineage),
    path("api/weights/checkpoints", views.checkpoints),
]
