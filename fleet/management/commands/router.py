"""manage.py router: the fleet's router in the foreground (docs/fleet.md).

It serves its own URL configuration (fleet/urls.py) on daphne: the registry routes instances register and heartbeat
on, the router's /v1/models, GET / and /health, and the /v1 routes it forwards to live instances. It runs no worker
and touches no database; the registry is in Redis (PANTHEON_FLEET_REDIS_URL, default REDIS_URL), so any number of
routers may run behind one load balancer, or in memory for a router on its own. Ctrl-C or SIGTERM stops it: requests
still open are cancelled, which closes their connections to the instances and so aborts their generations.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from django.conf import settings
from django.core.management.base import CommandError

from pantheon_site.management.base import CommandResult, PantheonCommand

ROUTER_URLCONF = "fleet.urls"
# Of the site's middleware, what the router's routes use: the request id (forwarded to the instance), the security
# headers, and the error envelope. The UI's session, CSRF and staff checks guard no route here, and the router
# exports no metrics, so they would only cost every forwarded request its time.
ROUTER_MIDDLEWARE = (
    "pantheon_site.middleware.RequestIdMiddleware",
    "pantheon_site.middleware.SecurityMiddleware",
    "pantheon_site.middleware.XFrameOptionsMiddleware",
    "pantheon_site.middleware.ErrorEnvelopeMiddleware",
)

logger = logging.getLogger("pantheon.fleet")


class Command(PantheonCommand):
    help = "Run the fleet's router on --host/--port: it forwards /v1 requests to the instances registered with it."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8080, help="TCP port to listen on (default 8080)")

    def execute(self, *args, **options):
        """The router's routes (and middleware), not an instance's, from before the system checks read them."""
        settings.ROOT_URLCONF = ROUTER_URLCONF
        settings.MIDDLEWARE = [name for name in settings.MIDDLEWARE if name in ROUTER_MIDDLEWARE]
        return super().execute(*args, **options)

    def perform(self, *, host: str, port: int, **options) -> CommandResult:
        if not settings.PANTHEON_FLEET_TOKEN:
            raise CommandError("set PANTHEON_FLEET_TOKEN: the router takes registrations only from instances that "
                               "present it")  # fmt: skip
        # daphne.server installs Twisted's asyncio reactor when imported, so it is imported only here, first.
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import defer, reactor

        from fleet.router import FleetRouter, install_router
        from pantheon_site.asgi import application

        loop = reactor._asyncioEventloop
        asyncio.set_event_loop(loop)
        router = FleetRouter.from_settings()
        install_router(router)
        where = "Redis" if settings.PANTHEON_FLEET_REDIS_URL else "this process's memory (one router only)"
        server = Server(
            application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=False,
            ready_callable=lambda: self._ready(host, port, where),
            verbosity=0,
        )
        reactor.addSystemEventTrigger(
            "before", "shutdown", lambda: defer.Deferred.fromFuture(asyncio.ensure_future(router.close(), loop=loop))
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, server.stop)
        try:
            server.run()
        finally:
            install_router(None)
        if not server.listening_addresses:
            raise CommandError(f"could not listen on {host}:{port} (is another server using the port?)")
        return CommandResult(lines=["The router stopped."])

    def _ready(self, host: str, port: int, where: str) -> None:
        self.stdout.write(f"The Pantheon router is serving on http://{host}:{port} (registry in {where}).")
        self.stdout.flush()
