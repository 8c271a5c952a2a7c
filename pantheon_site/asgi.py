"""The ASGI entry point daphne serves: Channels' ProtocolTypeRouter in front of Django's ASGI app (with the handler
of asgi_handler.py), inside the body limit, inside CORS, inside the request id."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

# Django must be set up before anything imports models (Channels consumers do), so this comes first.
django.setup(set_prefix=False)

from pantheon_site.asgi_handler import PantheonASGIHandler  # noqa: E402

django_asgi_app = PantheonASGIHandler()

from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from pantheon_site.body_limit import BodyLimitMiddleware  # noqa: E402
from pantheon_site.cors import CorsMiddleware  # noqa: E402
from pantheon_site.request_ids import RequestIdLayer  # noqa: E402

# Streaming chat completions and GET /session/watch are plain async Django views (StreamingHttpResponse): Django's
# ASGI handler cancels the response on a client disconnect (daphne's http.disconnect), which aborts the generation
# (inference/api/completion_bodies.py) or closes the watch (inference/api/sessions.py). Consumers for routes that need
# Channels would go in a URLRouter placed in front of django_asgi_app under "http".
# A body over PANTHEON_MAX_BODY_BYTES is refused (413) inside CORS, before routing reads it. The UI's static files
# (STATIC_URL, /ui/static/) are served from the apps' static folders by Django's handler; every other path goes on.
# Outside them all, the request id: every response carries X-Request-ID, and every log line of the request its id.
application = RequestIdLayer(
    CorsMiddleware(BodyLimitMiddleware(ProtocolTypeRouter({"http": ASGIStaticFilesHandler(django_asgi_app)})))
)
