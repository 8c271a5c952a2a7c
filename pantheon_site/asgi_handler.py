"""Django's ASGI handler, with the API's requests sharing one thread for their sync work.

Django enters a new ThreadSensitiveContext for every request, so a request's sync work (the request signals'
receivers: `close_old_connections`, `reset_queries`, `close_caches`; and `response.close()`) runs in a thread started
for that request and joined, from yet another new thread, when it ends. For a short /v1 request those thread starts
and joins were about a third of the server's CPU time (docs/performance.md). The /v1 views are async and touch the
database only to look a client token up where tokens are required (tests/test_auth.py), and for the short reads and
writes of the Files and Batch routes (batches/views.py, which run their slow file work on threads of their own), so
their requests share one long-lived single-thread executor instead (asgiref's caller-owned
`ThreadSensitiveContext(executor=...)`), on which that work takes turns. Every other route (the operator API and the
UI, which work with the database) keeps Django's thread per request, and with it a database connection per request."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler

SHARED_THREAD_PREFIX = "/v1/"


class PantheonASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self.api_sync_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="v1-sync")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(SHARED_THREAD_PREFIX):
            async with ThreadSensitiveContext(executor=self.api_sync_thread):
                await self.handle(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
