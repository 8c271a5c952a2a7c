"""manage.py serve: the whole platform in the foreground — migrations, the workers, daphne, the catalogue's models.

Daphne runs Twisted on an asyncio event loop; the worker supervisor, the engine client and every async view share
that one loop, so a route awaits worker replies without a thread. Order: the metrics folder every process of the
run writes to (pantheon_site/metrics_dir.py), migrate, start the workers (before listening, so the first request
finds them), listen, write the run file (`manage.py load_model` and a batch's Celery task find the server through
it), start the embedded Celery worker when PANTHEON_EMBEDDED_CELERY is on (inference/runtime/embedded_celery.py),
start registering with the fleet's router when PANTHEON_REGISTRY_URL names one (inference/runtime/registration.py),
then load the catalogue's autoload models in the background.

Ctrl-C or SIGTERM shuts down gracefully: new completions get 503 server_shutting_down (Retry-After: 1) while the
ones in flight run to their end, for up to PANTHEON_SHUTDOWN_DRAIN_TIMEOUT_S; then daphne stops (requests still
open are cancelled, which aborts their generations), then the workers and the embedded Celery worker, and the run
file is removed. A second
signal skips the wait.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from inference.management.run_file import RunInfo, remove_run_file, write_run_file
from inference.management.server_client import running_server
from inference.runtime.host_probe import build_id
from pantheon_site import metrics_dir
from pantheon_site.local_credential import install_local_secret, new_admin_secret
from pantheon_site.management.base import CommandResult, PantheonCommand


class Command(PantheonCommand):
    help = "Run Pantheon in the foreground: the HTTP API on --host/--port, with one worker process per device."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")

    def execute(self, *args, **options):
        """Before Django's system checks, which import the URL configuration and with it prometheus_client: refuse a
        second server (it would take over the first one's instance rows and metrics folder), then prepare this
        run's metrics folder, which the workers inherit."""
        running = running_server()
        if running is not None:
            raise CommandError(f"a Pantheon server is already running at {running.url} (pid {running.pid})")
        metrics_dir.prepare(settings.PANTHEON_RUN_DIR)
        return super().execute(*args, **options)

    def perform(self, *, host: str, port: int, **options) -> CommandResult:
        call_command("migrate", interactive=False, verbosity=0)
        # daphne.server installs Twisted's asyncio reactor when imported, so it is imported only here, first.
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import defer, reactor

        from inference.runtime.control_plane import ControlPlane
        from inference.runtime.embedded_celery import EmbeddedCeleryWorker
        from inference.runtime.registration import RegistrationAgent
        from inference.services.model_lifecycle import load_catalogued
        from pantheon_site.asgi import application

        loop = reactor._asyncioEventloop
        asyncio.set_event_loop(loop)
        build_id()  # computed once now rather than by the first request
        plane = ControlPlane(load_catalogued)
        celery = EmbeddedCeleryWorker.from_settings() if settings.PANTHEON_EMBEDDED_CELERY else None
        registration = None
        if settings.PANTHEON_REGISTRY_URL:
            registration = RegistrationAgent.from_settings(plane.client, host, port)
        self.stdout.write("Starting the workers...")
        loop.run_until_complete(plane.start())
        secret = new_admin_secret()
        install_local_secret(secret)

        async def stop_children():
            if registration:
                await registration.stop()
            await asyncio.gather(plane.stop(), *([celery.stop()] if celery else []))

        def stop_workers():
            return defer.Deferred.fromFuture(asyncio.ensure_future(stop_children(), loop=loop))

        server = Server(
            application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=False,  # ours below: drain first
            ready_callable=lambda: self._ready(plane, celery, registration, host, port, secret),
            verbosity=0,
        )
        reactor.addSystemEventTrigger("before", "shutdown", stop_workers)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, lambda: self._shut_down(loop, plane, server))
        # Everything built so far (Django, DRF, the apps, the control plane) lives as long as the server. Frozen, the
        # cyclic collector stops walking it: a full collection of the whole heap paused this process's one event
        # loop for several decode steps, stalling every stream and every new request's first token
        # (docs/performance-log.md).
        gc.freeze()
        try:
            server.run()
        finally:
            remove_run_file(os.getpid())
            install_local_secret(None)
            plane.supervisor.terminate_all(timeout=5.0)
            if celery:
                celery.terminate()
        if not server.listening_addresses:
            loop.run_until_complete(plane.stop())
            raise CommandError(f"could not listen on {host}:{port} (is another server using the port?)")
        return CommandResult(lines=["Pantheon stopped."])

    def _ready(self, plane, celery, registration, host: str, port: int, secret: str) -> None:
        """Daphne listens: the run file tells `manage.py` commands and batch tasks where, the embedded Celery worker
        starts, registration with the fleet's router starts (PANTHEON_REGISTRY_URL), then the catalogue's models
        load."""
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
        write_run_file(RunInfo(os.getpid(), url, secret))
        devices = ", ".join(sorted(plane.client.workers()))
        self.stdout.write(f"Pantheon is serving on http://{host}:{port} (workers: {devices}). Ctrl-C stops it.")
        if celery:
            celery.start()
            self.stdout.write(f"The embedded Celery worker (pid {celery.pid}) runs batches and periodic tasks.")
        if registration:
            registration.start()
            self.stdout.write(f"Registering with the router at {settings.PANTHEON_REGISTRY_URL}.")
        self.stdout.flush()
        plane.start_autoload()

    def _shut_down(self, loop: asyncio.AbstractEventLoop, plane, server) -> None:
        """The first signal drains the generations in flight, then stops daphne; a second one stops it now."""
        if plane.router.shutting_down:
            server.stop()
            return
        self.stdout.write("Shutting down: finishing the generations in flight...")
        self.stdout.flush()
        drain = loop.create_task(plane.drain(settings.PANTHEON_SHUTDOWN_DRAIN_TIMEOUT_S), name="drain")
        drain.add_done_callback(lambda _: server.stop())
