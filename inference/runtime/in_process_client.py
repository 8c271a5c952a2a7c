"""An engine client whose workers run in threads of this process (over inproc://), for tests that need no process.

Same client, same worker loop, same messages as production; only the transport endpoint and the way a worker is
started differ, so a test against it exercises everything but process supervision.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterable

import zmq
import zmq.asyncio

from inference.engine.contract import messages as p
from inference.engine.contract.io_threads import batch_io_threads
from inference.runtime.engine_client import ZmqEngineClient

logger = logging.getLogger(__name__)


class InProcessEngineClient(ZmqEngineClient):
    """The same client with its workers running the same loop in threads of this process, over inproc://, for
    tests that need no process. A worker thread that crashes is reported as lost like a dead process."""

    def __init__(self, devices: Iterable[str] = ("cpu",)):
        self._sync_context = batch_io_threads(zmq.Context())
        super().__init__(f"inproc://pantheon-workers-{uuid.uuid4().hex}",
                         context=zmq.asyncio.Context.shadow(self._sync_context.underlying))  # fmt: skip
        self.devices = list(devices)
        self._threads: list[threading.Thread] = []

    async def start(self) -> None:
        from inference.engine.worker_process import serve  # torch is imported only by clients that run workers here

        await super().start()
        loop = asyncio.get_running_loop()
        for device in self.devices:

            def run(device: str = device) -> None:
                try:
                    serve(self.endpoint, device, f"{device}/thread", context=self._sync_context)
                except BaseException as exc:
                    logger.exception("worker thread for %s crashed", device)
                    loop.call_soon_threadsafe(self.worker_lost, device, f"{type(exc).__name__}: {exc}")

            thread = threading.Thread(target=run, name=f"worker-{device}", daemon=True)
            thread.start()
            self._threads.append(thread)
        await asyncio.wait_for(asyncio.gather(*(self.wait_for_worker(d) for d in self.devices)), 60)

    async def close(self) -> None:
        for device in list(self._workers):
            self._send(device, p.Shutdown())
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 10)
        await super().close()
        self._sync_context.term()
