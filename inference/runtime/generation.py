"""What a caller of the engine client holds: a running `Generation`, and the `EngineError` (with its `Reason`)
that a refusal or failure raises. Kept apart from the client so the routes need nothing of its transport."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason

Event = p.Tokens | p.Finished


class EngineError(Exception):
    """A generation or call the engine refused or could not finish, with the `Reason` and the data that goes with
    it (kv_used/kv_cap for prompt_too_long). What a client sees for it is decided in inference/services/refusals.py."""

    def __init__(self, message: str, reason: Reason, *, kv_used: int | None = None, kv_cap: int | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.kv_used = kv_used
        self.kv_cap = kv_cap

    @classmethod
    def from_error(cls, error: p.Error) -> EngineError:
        return cls(error.message, error.reason, kv_used=error.kv_used, kv_cap=error.kv_cap)


class WorkerDied(EngineError):
    """The worker running this generation or call died (worker_died), or the model it names is still being
    reloaded after such a crash (model_reloading)."""

    def __init__(self, message: str, reason: Reason = Reason.WORKER_DIED):
        super().__init__(message, reason)


class Generation:
    """One running generation: `started` (STARTED), then `async for event in generation` yields `p.Tokens` and
    finally one `p.Finished`. Raises `EngineError` (or `WorkerDied`) if it ends otherwise. Leaving it early, e.g.
    `async with` on a client disconnect, aborts it and frees its KV slot."""

    def __init__(self, request_id: str, started: p.Started, queue: asyncio.Queue, abort: Callable[[str], None]):
        self.request_id = request_id
        self.started = started
        self.finished: p.Finished | None = None
        self._abort = abort  # the client's abort: tells the worker to drop the sequence
        self._queue = queue
        self._done = False

    @property
    def prompt_tokens(self) -> int:
        return self.started.prompt_tokens

    def __aiter__(self) -> Generation:
        return self

    def ready(self) -> bool:
        """Whether the next event has already arrived (iterating would not wait): a streaming route writes what
        is already here in one write."""
        return not self._done and not self._queue.empty()

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        try:
            event = await self._queue.get()
        except BaseException:
            self.abort()
            raise
        if isinstance(event, BaseException):
            self._done = True
            raise event
        if isinstance(event, p.Finished):
            self._done = True
            self.finished = event
        return event

    def abort(self) -> None:
        """Stops the generation now (idempotent); a no-op once it ended."""
        if not self._done:
            self._done = True
            self._abort(self.request_id)

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.abort()
