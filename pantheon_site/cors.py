"""CORS for the API, as an ASGI wrapper around the whole application (Django views and Channels consumers alike); never
for the operator UI.

The spec: every response carries `Access-Control-Allow-Origin: *`, and OPTIONS on any path is the CORS preflight,
always 200 with a `{}` body. Answering preflights here keeps them out of routing, auth and audit. The API can allow
any origin because it authenticates with bearer tokens, which a browser never attaches on its own. The UI under /ui/
authenticates with a session cookie, which a browser does attach: there no header is added and no preflight is
answered (the request goes on to Django like any other), so a page of another origin can neither read a UI page nor
be told that it may send to one.
"""

from pantheon_site.errors import UI_PREFIX

ALLOW_ORIGIN = (b"access-control-allow-origin", b"*")
PREFLIGHT_HEADERS = [
    ALLOW_ORIGIN,
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    (b"access-control-allow-headers", b"*"),
    (b"access-control-max-age", b"86400"),
    (b"content-type", b"application/json"),
    (b"content-length", b"2"),
]


class CorsMiddleware:
    """Wraps an ASGI app: outside /ui/, answers OPTIONS itself and adds Access-Control-Allow-Origin to every other
    response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(UI_PREFIX):
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS":
            await send({"type": "http.response.start", "status": 200, "headers": PREFLIGHT_HEADERS})
            await send({"type": "http.response.body", "body": b"{}"})
            return None

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != ALLOW_ORIGIN[0]]
                message = {**message, "headers": [*headers, ALLOW_ORIGIN]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)
