"""The ASGI entry point daphne serves: Channels' ProtocolTypeRouter in front of Django's ASGI app."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

# Django must be set up before anything imports models (Channels consumers do), so this comes first.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

# SSE routes (streaming chat completions, /session/watch) get Channels consumers here, in a URLRouter placed in front
# of django_asgi_app under "http"; everything else is a plain (async) Django view.
application = ProtocolTypeRouter({"http": django_asgi_app})
