"""The operator UI's pages, all under /ui/ (pantheon_site/urls.py); every one needs a signed-in staff user
(admin_ui/middleware.py)."""

from django.urls import path

from admin_ui.views import audit, batches, dashboard, models, playground, sessions, signin, tokens, weights

app_name = "ui"

urlpatterns = [
    path("login/", signin.StaffLoginView.as_view(), name="login"),
    path("logout/", signin.sign_out, name="logout"),
    path("", dashboard.page, name="dashboard"),
    path("live/", dashboard.live, name="dashboard-live"),
    path("charts/", dashboard.charts, name="dashboard-charts"),
    path("models/", models.page, name="models"),
    path("models/live/", models.live, name="models-live"),
    path("models/catalogue/", models.catalogue_save, name="catalogue-save"),
    path("models/catalogue/remove/", models.catalogue_remove, name="catalogue-remove"),
    path("models/load/", models.load, name="model-load"),
    path("models/unload/", models.unload, name="model-unload"),
    path("sessions/", sessions.page, name="sessions"),
    path("sessions/release/", sessions.release, name="session-release"),
    path("sessions/export/", sessions.export, name="session-export"),
    path("sessions/restore/", sessions.restore, name="session-restore"),
    path("batches/", batches.page, name="batches"),
    path("batches/live/", batches.live, name="batches-live"),
    path("batches/cancel/", batches.cancel, name="batch-cancel"),
    path("batches/files/<str:file_id>/", batches.file_content, name="batch-file"),
    path("weights/", weights.page, name="weights"),
    path("weights/clear-stale/", weights.clear_stale, name="weights-clear-stale"),
    path("tokens/", tokens.page, name="tokens"),
    path("tokens/revoke/", tokens.revoke, name="token-revoke"),
    path("audit/", audit.page, name="audit"),
    path("audit/<int:event_id>/", audit.detail, name="audit-detail"),
    path("audit/export.csv", audit.export_csv, name="audit-export-csv"),
    path("audit/export.jsonl", audit.export_jsonl, name="audit-export-jsonl"),
    path("audit/verify/", audit.verify, name="audit-verify"),
    path("playground/", playground.page, name="playground"),
]
