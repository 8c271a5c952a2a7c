"""The middlewares that fence the operator UI in under /ui/: sessions, the signed-in user, CSRF checks, and
staff-only access.

Outside /ui/ they do nothing and cost nothing (no thread hop: pantheon_site/middleware.py says why that matters), so
the API keeps its bearer-token checks and /v1 its database-free hot path.
"""

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.auth.views import redirect_to_login
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.decorators import sync_and_async_middleware

from pantheon_site.errors import UI_PREFIX

# Reached without signing in: the sign-in page itself, and the static files it uses.
_OPEN_PATHS = (settings.LOGIN_URL, settings.STATIC_URL)


def is_ui_path(path: str) -> bool:
    return path.startswith(UI_PREFIX)


class UiOnly:
    """For a Django middleware class the UI alone needs: outside /ui/ the request goes straight on."""

    def __call__(self, request):
        if not is_ui_path(request.path):
            return self.get_response(request)  # a coroutine under ASGI, awaited by the middleware before
        return super().__call__(request)


class UiSessionMiddleware(UiOnly, SessionMiddleware):
    """Django's sessions, for the UI's sign-in."""


class UiAuthenticationMiddleware(UiOnly, AuthenticationMiddleware):
    """Django's `request.user`, for the UI."""


class UiCsrfMiddleware(UiOnly, CsrfViewMiddleware):
    """Django's CSRF check for UI forms; the API routes authenticate with bearer tokens, which a browser never sends
    on its own, so a forged cross-site request has nothing to ride on there."""

    async def process_view(self, request, callback, callback_args, callback_kwargs):
        """Django calls a view hook for every route; an async one costs nothing outside /ui/, and the check
        itself reads only the request (its cookie, header and form), so it runs on the event loop."""
        if not is_ui_path(request.path):
            return None
        return super().process_view(request, callback, callback_args, callback_kwargs)


def _needs_sign_in(request, user) -> bool:
    if not is_ui_path(request.path) or request.path.startswith(_OPEN_PATHS):
        return False
    return not (user.is_active and user.is_staff)


@sync_and_async_middleware
def staff_only_middleware(get_response):
    """Every UI URL, known or not, answers the sign-in page to anyone but an active staff user."""
    if iscoroutinefunction(get_response):

        async def middleware(request):
            if is_ui_path(request.path):
                # Resolved here, once: an async view or its template may then read request.user without a query.
                request.user = await request.auser()
                if _needs_sign_in(request, request.user):
                    return redirect_to_login(request.get_full_path())
            return await get_response(request)

    else:

        def middleware(request):
            if is_ui_path(request.path) and _needs_sign_in(request, request.user):
                return redirect_to_login(request.get_full_path())
            return get_response(request)

    return middleware
