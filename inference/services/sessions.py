"""Sessions in the running server: which model a session route means, and the actions on a model's sessions
(export, restore, release, list, watch) and the restore-or-replay estimate.

A session lives in the worker that serves its model (the KV it pins between turns); the control plane keeps only
which replica holds it (the router's session map, inference/runtime/router.py), so every action here is a call to
that replica's worker (inference/runtime/engine_client.py), and the worker's refusals become the spec's errors
through inference/services/refusals.py. With several replicas (docs/replicas.md): export goes to the replica that
holds the session (asking each in turn when the router does not know it), restore and watch to that one or else the
least busy (which then holds it), release to that one or else every replica, and the list covers every replica.
`do_release_session` is the one write path behind POST /session/release and `manage.py release_session`, and writes
their audit event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.conf import settings

from inference.engine.contract.reasons import Reason
from inference.runtime.client_protocol import EngineClient
from inference.runtime.generation import EngineError
from inference.runtime.router import SERVING_STATES, ModelRouter
from inference.services.refusals import as_api_error
from inference.services.session_export import export_body
from inference.services.session_file import session_file
from pantheon_site.audit import AuditedCall
from pantheon_site.errors import BadSessionBlob, ModelNotFound, ServerShuttingDown, WatchUnavailable

logger = logging.getLogger("pantheon.sessions")

# GET /session/estimate (spec: 16 KiB of blob per token, a 12.5 MB/s upload, unless the client says otherwise).
BLOB_BYTES_PER_TOKEN = 16 * 1024
UPLOAD_BYTES_PER_S = 12.5e6
# The prefill rate assumed before the model has measured one: the spec's example figure, a deliberately slow one,
# so that an estimate made without a measurement leans towards restoring rather than replaying.
FALLBACK_PREFILL_TOK_PER_S = 17.0
# Installing a received blob into the KV pool is a host-to-device copy; the estimate counts it at this rate
# (with the spec's example numbers, 4096 tokens -> 5.391 s warm, as the spec shows).
RESTORE_COPY_BYTES_PER_S = 3e9


def session_model(router: ModelRouter, name: str) -> str:
    """The served name a session route means: `name` when it is served; without a name, the one model served.
    Anything else is 404 model_not_found (a catalogued model is not loaded for a session route: it has no
    sessions)."""
    serving = router.serving_names()
    if name:
        if name in serving:
            return name
        raise ModelNotFound(f"model {name!r} is not loaded", reason="model_not_found")
    if len(serving) == 1:
        return serving[0]
    if not serving:
        raise ModelNotFound("no model is loaded, so there are no sessions", reason="no_models_loaded")
    raise ModelNotFound(f"several models are loaded ({', '.join(sorted(serving))}); name one", reason="no_default")


async def export_session(router: ModelRouter, name: str, session_id: str, *, raw: bool = False) -> tuple[str, bytes]:
    """The session's most recently used conversation as export's JSON body, or with `raw` as a session file
    (inference/services/session_file.py), already encoded: the blob of a long conversation is tens of MB or more, so it
    is encoded on a thread; returns (model, body)."""
    model = session_model(router, name)
    known = router.session_placement(model, session_id)
    keys = [known] if known is not None else [pl.name for pl in router.replicas(model) if pl.state in SERVING_STATES]
    for key in keys:
        try:
            reply = await router.client.export_session(key, session_id)
            break
        except EngineError as exc:
            if exc.reason != Reason.SESSION_NOT_FOUND or key == keys[-1]:
                raise as_api_error(exc) from exc
    router.remember_session(model, session_id, key)
    if raw:
        return model, await asyncio.to_thread(session_file, reply.tokens, reply.blob)
    return model, await asyncio.to_thread(export_body, reply)


async def restore_session(router: ModelRouter, name: str, session_id: str, blob: bytes, tokens: list[int]) -> dict:
    """Installs an exported conversation under `session_id`; a refused restore changes nothing. A session longer
    than the model's context window is refused here, without sending its blob to the worker."""
    model = session_model(router, name)
    placement = router.choose(model, session_id)
    info = placement.info
    if info is not None and len(tokens) > info.context_window:
        raise BadSessionBlob(
            f"the session's {len(tokens)} tokens do not fit the context window of {model!r}, {info.context_window} "
            "tokens",
            reason="session_over_window",
        )
    try:
        reply = await router.client.restore_session(placement.name, session_id, blob, tokens)
    except EngineError as exc:
        raise as_api_error(exc) from exc
    return {"restored": True, "session_id": reply.session_id, "n_tok": reply.n_tok}


async def do_release_session(router: ModelRouter, *, name: str, session_id: str, actor: dict[str, Any]) -> dict:
    """Frees every conversation of the session now; idempotent (an unknown or already freed session, or a model
    that keeps no sessions, is released too: the worker answers that nothing was held). `actor`: the audit event's
    actor fields (actor_kind, actor_label, request_id, client_address). Writes one `session_release` event,
    accepted or refused."""
    async with AuditedCall("session_release", model=name, **actor) as call:
        model = session_model(router, name)
        call.model = model
        known = router.session_placement(model, session_id)
        keys = [known] if known else [pl.name for pl in router.replicas(model) if pl.state in SERVING_STATES]
        try:
            held = any([(await router.client.release_session(key, session_id)).released for key in keys])
        except EngineError as exc:
            raise as_api_error(exc) from exc
        router.forget_session(model, session_id)
        call.details = {"session_id": session_id, "held": held}
    return {"released": True, "session_id": session_id}


async def list_sessions(router: ModelRouter, name: str) -> dict:
    """GET /admin/sessions: the model's sessions as its workers hold them now, over every replica (`placement` says
    which holds each)."""
    model = session_model(router, name)
    held = []
    for placement in router.replicas(model):
        if placement.state not in SERVING_STATES:
            continue
        try:
            reply = await router.client.sessions(placement.name)
        except EngineError as exc:
            raise as_api_error(exc) from exc
        held += [(placement.name, s) for s in reply.sessions]
    now = time.time()
    data = [
        {
            "session_id": s.session_id,
            "conversations": s.conversations,
            "tokens": s.tokens,
            "idle_seconds": round(s.idle_seconds, 3),
            "last_used_at": int(now - s.idle_seconds),
            "watched": s.watched,
            "busy": s.busy,
            "placement": key,
        }
        for key, s in sorted(held, key=lambda held: held[1].idle_seconds)
    ]
    return {"object": "list", "model": model, "data": data}


async def estimate(
    router: ModelRouter, *, tokens: int, name: str = "", blob_bytes: int | None = None, upload_bps: float | None = None
) -> dict:
    """GET /session/estimate: restoring `tokens` of history from a blob against prefilling them again, at the model's
    measured prefill rate (FALLBACK_PREFILL_TOK_PER_S before one is measured, or for an unknown model, whose name
    is then "")."""
    try:
        model = session_model(router, name)
    except ModelNotFound:
        model = ""
    rate = await _prefill_rate(router.client, model) if model else 0.0
    rate = rate or FALLBACK_PREFILL_TOK_PER_S
    blob = blob_bytes or tokens * BLOB_BYTES_PER_TOKEN
    upload = upload_bps or UPLOAD_BYTES_PER_S
    return {
        "model": model,
        "tokens": tokens,
        "prefill_tok_per_s": round(rate, 2),
        "cold_reprefill_s": round(tokens / rate, 2),
        "warm_restore_s": round(blob / upload + blob / RESTORE_COPY_BYTES_PER_S, 3),
        "blob_bytes_est": blob,
    }


async def _prefill_rate(client: EngineClient, model: str) -> float:
    """The model's measured prefill rate from its first replica's worker status (0.0 when none is measured or
    known)."""
    placement = next((pl for pl in client.models().values() if pl.served_name == model), None)
    for status in await client.status() if placement else []:
        if status.device == placement.device:
            return next((m.prefill_tok_per_s for m in status.models if m.name == placement.name), 0.0)
    return 0.0


# -- watches ------------------------------------------------------------------------------------------------------

_closing: set[asyncio.Task] = set()  # watch closes on their way to the worker (kept from garbage collection)
_held: set[WatchHold] = set()  # watches open (or opening) and not yet closed, counted against the cap


class WatchHold:
    """One open watch on a session (GET /session/watch): while it is open the worker never releases the session
    for idleness. `close()` tells the worker it closed, exactly once, from whichever of the ways a watch can end
    gets there first (the stream's end or cancellation, or the response being closed, which Django does on a
    thread)."""

    def __init__(self, client: EngineClient, model: str, session_id: str):
        self.client = client
        self.model = model
        self.session_id = session_id
        self._loop = asyncio.get_running_loop()
        self._closed = False
        _held.add(self)

    def close(self) -> None:
        """Thread-safe and idempotent; returns at once (the close is sent by a task of the server's loop)."""
        try:
            self._loop.call_soon_threadsafe(self._send_close)
        except RuntimeError:  # the loop is gone: the server stopped, and its workers with it
            pass

    def _send_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _held.discard(self)
        task = self._loop.create_task(self._close_call(), name=f"watch-close-{self.session_id}")
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    async def _close_call(self) -> None:
        try:
            await self.client.watch_session(self.model, self.session_id, False)
        except EngineError as exc:  # the model went away meanwhile: its sessions are gone with it
            logger.info("closing the watch on session %r of %s: %s", self.session_id, self.model, exc.message)


async def open_watch(router: ModelRouter, name: str, session_id: str) -> WatchHold:
    """Opens a watch on the session (a session that does not exist yet may be watched: it is kept once its first
    turn creates it). Refused while the server shuts down, and while PANTHEON_SESSION_MAX_WATCHES are held."""
    if router.shutting_down:
        raise ServerShuttingDown("the server is shutting down; retry in a moment", reason="shutting_down")
    model = session_model(router, name)
    if len(_held) >= settings.PANTHEON_SESSION_MAX_WATCHES:
        raise WatchUnavailable(f"the server holds {len(_held)} session watches, its limit; retry when one closes")
    key = router.choose(model, session_id).name  # the replica its turns go to, also for a session not begun yet
    hold = WatchHold(router.client, key, session_id)
    try:
        await router.client.watch_session(key, session_id, True)
    except EngineError as exc:
        if exc.reason == Reason.INTERNAL:  # no answer in time: the open was sent, so match it with a close
            hold.close()
        else:  # refused: nothing is held
            _held.discard(hold)
        raise as_api_error(exc) from exc
    except asyncio.CancelledError:  # the client left while the open was on its way: match it with a close
        hold.close()
        raise
    return hold
