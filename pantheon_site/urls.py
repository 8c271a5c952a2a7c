"""URL routes. Any path not listed answers 404 not_found "unknown route" in the spec's envelope (handler404)."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from pantheon_site.metrics_route import metrics_view

# The routes (/, /v1/*, /admin/*, /session/*, /api/weights/*, the UI's /ui/*) are added here by the apps that own
# them (/v1/files and /v1/batches by batches).
urlpatterns = [
    path("", include("inference.urls")),
    path("", include("weights.urls")),
    path("", include("batches.urls")),
    path("ui/", include("admin_ui.urls")),
    path("metrics", metrics_view),
    # The OpenAPI document of the routes above (pantheon_site/openapi.py), open like vLLM's /openapi.json.
    path("api/schema/", SpectacularAPIView.as_view(), name="openapi-schema"),
]

handler400 = "pantheon_site.errors.handler400"
handler403 = "pantheon_site.errors.handler403"
handler404 = "pantheon_site.errors.handler404"
handler500 = "pantheon_site.errors.handler500"
