"""Where a request's sync work runs (pantheon_site/asgi_handler.py): /v1 requests share one long-lived thread, the
other routes keep Django's thread per request, and work a request starts that outlives it (a load on demand) is not
tied to the request's thread."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.signals import request_finished

from inference.runtime.engine_client import ZmqEngineClient
from inference.runtime.router import ModelRouter
from pantheon_site.asgi_handler import PantheonASGIHandler


def test_a_load_on_demand_finishes_after_the_request_that_started_it_went_away():
    async def scenario():
        gate = asyncio.Event()

        async def load_catalogued(name):
            await gate.wait()  # the load ends after its first request did
            return await sync_to_async(lambda: name)()  # as the load's database writes do

        router = ModelRouter(ZmqEngineClient("inproc://nothing-listens"), load_catalogued=load_catalogued)
        router.catalog_names = {"lazy"}
        shared = ThreadPoolExecutor(max_workers=1)

        async def request():
            async with ThreadSensitiveContext(executor=shared):  # as a /v1 request runs
                return await router.route("lazy")

        first = asyncio.create_task(request())
        while not router.loads_in_progress():
            await asyncio.sleep(0)
        first.cancel()  # its client disconnected
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.create_task(request())  # a later request waits for the same load
        await asyncio.sleep(0)
        gate.set()
        return await second

    assert asyncio.run(scenario()) == "lazy"


def test_api_requests_share_one_thread_for_their_sync_work_and_other_routes_get_one_each():
    """Django's handler starts a thread per request (and another to join it) for a request's sync work: the request
    signals' receivers and response.close(), here observed through request_finished."""
    handler = PantheonASGIHandler()
    threads = []

    def finished(**kwargs):
        threads.append(threading.current_thread().name)

    async def get(path):
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
                 "path": path, "raw_path": path.encode(), "query_string": b"", "headers": [],
                 "server": ("testserver", 80), "client": ("127.0.0.1", 50000)}  # fmt: skip
        body = [{"type": "http.request", "body": b"", "more_body": False}]
        sent = []

        async def receive():
            if body:
                return body.pop()
            await asyncio.Event().wait()  # the client stays

        async def send(message):
            sent.append(message)

        await handler(scope, receive, send)
        return sent[0]["status"]

    async def requests():
        return [await get(path) for path in ("/v1/models", "/v1/models", "/", "/")]

    request_finished.connect(finished)
    try:
        statuses = asyncio.run(requests())
    finally:
        request_finished.disconnect(finished)
    assert all(status < 500 for status in statuses[2:])
    api_first, api_second, other_first, other_second = threads
    assert api_first == api_second
    assert len({api_first, other_first, other_second}) == 3
