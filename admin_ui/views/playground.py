"""The playground: a chat box that streams from /v1/chat/completions in the browser (static/admin_ui/playground.js),
so what it shows is exactly what an API client gets. The page itself only lists the served models."""

from admin_ui.views import common
from inference.services.serving import router_if_serving


def page(request):
    """The playground, its model select pre-filled with the names served now (none when this process runs no engine;
    the browser then asks /v1/models)."""
    router = router_if_serving()
    names = sorted(router.serving_names()) if router is not None else []
    return common.page(request, "admin_ui/playground.html", "playground", models=names)
