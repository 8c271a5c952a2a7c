"""The engine client's calls on one served model's worker: the session calls (export, restore, release, watch,
list), embeddings and the weights barrier, each one request answered by its reply. A part of `ZmqEngineClient`
(engine_client.py), which supplies the transport: `_call` (send a call, await its reply) and `_models`."""

from __future__ import annotations

import uuid

from inference.engine.contract import messages as p
from inference.engine.contract.logs import request_id_var
from inference.engine.contract.params import Priority
from inference.engine.contract.reasons import Reason
from inference.engine.contract.weights import WeightsCall, WeightsSnapshot
from inference.runtime.client_protocol import ModelPlacement
from inference.runtime.generation import EngineError, WorkerDied

# A session call waits this long for its worker by default (a blob of a long conversation is tens of MB to copy).
SESSION_CALL_TIMEOUT_S = 60.0


class WorkerCalls:
    """Calls on the worker holding a ready model; the engine client supplies `_models` and `_call`."""

    _models: dict[str, ModelPlacement]

    async def _call(self, device: str, message: p.Message, timeout: float | None) -> p.Message:
        raise NotImplementedError

    # -- sessions -------------------------------------------------------------------------------------------------
    # Each is one call to the worker holding `model`, answered by its reply or raised as EngineError: the session
    # reasons (sessions_disabled, session_not_found, session_busy, bad_session_blob, weights_version_mismatch,
    # session_capacity), model_not_loaded for a model that is not ready, model_reloading while its worker restarts.

    async def export_session(
        self, model: str, session_id: str, *, timeout: float = SESSION_CALL_TIMEOUT_S
    ) -> p.SessionBlob:
        """The session's most recently used conversation as a blob, with the tokens it covers."""
        call = p.SessionExport(request_id=new_id(), model=model, session_id=session_id)
        return await self._session_call(model, call, timeout)

    async def restore_session(
        self, model: str, session_id: str, blob: bytes, tokens: list[int], *, timeout: float = SESSION_CALL_TIMEOUT_S
    ) -> p.SessionRestored:
        """Installs an exported conversation under `session_id`; a refused restore changes nothing."""
        call = p.SessionRestore(request_id=new_id(), model=model, session_id=session_id, blob=blob, tokens=tokens)
        return await self._session_call(model, call, timeout)

    async def release_session(
        self, model: str, session_id: str, *, timeout: float = SESSION_CALL_TIMEOUT_S
    ) -> p.SessionReleased:
        """Frees every conversation of the session (idempotent: `released` says whether it held anything)."""
        call = p.SessionRelease(request_id=new_id(), model=model, session_id=session_id)
        return await self._session_call(model, call, timeout)

    async def watch_session(
        self, model: str, session_id: str, watching: bool, *, timeout: float = SESSION_CALL_TIMEOUT_S
    ) -> p.SessionWatched:
        """A watch on the session opened (`watching`) or closed; every open must be matched by one close."""
        call = p.SessionWatch(request_id=new_id(), model=model, session_id=session_id, watching=watching)
        return await self._session_call(model, call, timeout)

    async def sessions(self, model: str, *, timeout: float = SESSION_CALL_TIMEOUT_S) -> p.Sessions:
        """The model's sessions, as its worker holds them now."""
        return await self._session_call(model, p.SessionList(request_id=new_id(), model=model), timeout)

    # -- embeddings -----------------------------------------------------------------------------------------------

    async def embed(
        self,
        model: str,
        inputs: list[str] | list[list[int]],
        *,
        priority: Priority = "interactive",
        timeout: float = SESSION_CALL_TIMEOUT_S,
    ) -> p.Embeddings:
        """The inputs' embeddings (texts, or token-id lists), from the worker holding a ready `model`. Raises
        EngineError (prompt_too_long, bad_request, model_not_loaded; weights_held for batch work while a trainer holds
        the weights, as `generate` does) or WorkerDied. An EMBED runs on the worker's loop between steps, in no
        queue, so `priority` decides nothing else."""
        placement = self._models.get(model)
        if priority == "batch" and placement is not None and (held := placement.weights_held()) is not None:
            raise EngineError(f"the weights of {model!r} are held ({held}); batch work waits", Reason.WEIGHTS_HELD)
        texts = [i for i in inputs if isinstance(i, str)]
        call = p.Embed(
            request_id=new_id(),
            model=model,
            texts=texts if texts else None,
            token_ids=None if texts else list(inputs),
            http_request_id=request_id_var.get(),
        )
        return await self._session_call(model, call, timeout)

    # -- weights --------------------------------------------------------------------------------------------------

    async def weights_call(
        self, model: str, call: WeightsCall, *, timeout: float | None = None
    ) -> p.WeightsReply | p.WeightsRefused:
        """One call on `model`'s weights barrier, answered by its reply or refusal (a quiesce that drains, a save or
        a load answers when it ends); the placement's `weights` is updated from the answer."""
        request = p.WeightsRequest(request_id=new_id(), model=model, call=call)
        return await self._call(self._device_of(model), request, timeout)

    def _note_weights(self, snapshot: WeightsSnapshot | None) -> None:
        placement = self._models.get(snapshot.model) if snapshot is not None else None
        if placement is not None:
            placement.weights = snapshot

    async def _session_call(self, model: str, call: p.Message, timeout: float) -> p.Message:
        """One session call to the worker holding a ready `model` (model_reloading while its worker is restarted:
        its sessions died with it); a worker that does not answer in time is an internal error."""
        placement = self._models.get(model)
        if placement is not None and placement.state == "reloading":
            message = f"the worker holding {model!r} crashed; the model is being reloaded"
            raise WorkerDied(message, Reason.MODEL_RELOADING)
        try:
            return await self._call(self._device_of(model), call, timeout)
        except TimeoutError:
            message = f"{type(call).__name__} on {model!r} got no answer within {timeout:g} s"
            raise EngineError(message, Reason.INTERNAL) from None

    def _device_of(self, model: str) -> str:
        placement = self._models.get(model)
        if placement is None or placement.state != "ready":
            raise EngineError(f"model {model!r} is not loaded", Reason.MODEL_NOT_LOADED)
        return placement.device


def new_id() -> str:
    """A request id for a call (a generation's is the route's)."""
    return uuid.uuid4().hex
