"""Method checks for the route table: a known path called with a method the spec does not list is 404 not_found
("any other path"), like an unknown path. OPTIONS never gets here: the CORS layer answers every preflight."""

import functools

from pantheon_site.errors import NotFound


def only(method: str, *more: str):
    """Decorator for an async view that answers `method` only (or those and `more`: a view that answers several
    dispatches on request.method itself); the view says so in `http_methods`, which the route table's tests
    (tests/test_route_guards.py: a state-changing route needs a token) and the OpenAPI document
    (pantheon_site/openapi.py) read."""
    methods = frozenset({method, *more})

    def decorate(view):
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            if request.method not in methods:
                raise NotFound()
            return await view(request, *args, **kwargs)

        wrapper.http_methods = methods
        return wrapper

    return decorate
