"""The one table from the engine's reasons to what a client sees: the spec's error type, HTTP status, Retry-After.

The worker states why it refused or ended a request (`Reason`, inference/engine/contract/reasons.py); the engine
client raises that as an `EngineError`. Routes and services call `as_api_error` and raise what it returns, which the
error middleware renders in the route's envelope (pantheon_site/errors.py fixes each error's status there). The
table lives with the services, below the HTTP edge, because their audited calls record the refusal they end with.
Retry-After values come from settings (PANTHEON_RETRY_AFTER_*), never from the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from inference.engine.contract.reasons import Reason
from inference.runtime.generation import EngineError
from pantheon_site.errors import (
    BadSessionBlob,
    ContextOverBudget,
    InvalidRequest,
    LoadFailed,
    ModelAtSessionCapacity,
    ModelNotFound,
    ModelReloading,
    PantheonError,
    ServerBusy,
    ServerError,
    ServerMemoryConstrained,
    ServerShuttingDown,
    SessionBusy,
    SessionCachingDisabled,
    SessionNotFound,
    UnloadFailed,
    WeightsHeld,
    WeightsTorn,
    WeightsVersionMismatch,
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """How a reason reaches the client: its error class, the status where the class takes one (load_failed and
    unload_failed carry several), and the setting that holds its Retry-After seconds."""

    error: type[PantheonError]
    status: int | None = None
    retry_after_setting: str | None = None


REFUSALS: dict[Reason, Refusal] = {
    Reason.BAD_REQUEST: Refusal(InvalidRequest),
    Reason.PROMPT_TOO_LONG: Refusal(ContextOverBudget),
    Reason.QUEUE_FULL: Refusal(ServerBusy, retry_after_setting="PANTHEON_RETRY_AFTER_BUSY_S"),
    Reason.QUEUE_TIMEOUT: Refusal(ServerBusy, retry_after_setting="PANTHEON_RETRY_AFTER_QUEUE_TIMEOUT_S"),
    Reason.LOW_MEMORY: Refusal(ServerMemoryConstrained, retry_after_setting="PANTHEON_RETRY_AFTER_MEMORY_S"),
    Reason.MODEL_NOT_LOADED: Refusal(ModelNotFound),
    Reason.MODEL_UNLOADED: Refusal(ServerError),
    Reason.SHUTTING_DOWN: Refusal(ServerShuttingDown, retry_after_setting="PANTHEON_RETRY_AFTER_SHUTDOWN_S"),
    Reason.GENERATION_FAILED: Refusal(ServerError),
    Reason.INTERNAL: Refusal(ServerError),
    Reason.WORKER_DIED: Refusal(ServerError),
    Reason.MODEL_RELOADING: Refusal(ModelReloading, retry_after_setting="PANTHEON_RETRY_AFTER_RELOAD_S"),
    Reason.SESSION_CAPACITY: Refusal(ModelAtSessionCapacity, retry_after_setting="PANTHEON_RETRY_AFTER_SESSION_S"),
    Reason.SESSIONS_DISABLED: Refusal(SessionCachingDisabled),
    Reason.SESSION_NOT_FOUND: Refusal(SessionNotFound),
    Reason.SESSION_BUSY: Refusal(SessionBusy),
    Reason.BAD_SESSION_BLOB: Refusal(BadSessionBlob),
    Reason.WEIGHTS_VERSION_MISMATCH: Refusal(WeightsVersionMismatch),
    Reason.WEIGHTS_TORN: Refusal(WeightsTorn, retry_after_setting="WEIGHTS_HOLD_TIMEOUT_S"),
    Reason.WEIGHTS_HELD: Refusal(WeightsHeld, retry_after_setting="WEIGHTS_HOLD_TIMEOUT_S"),
    Reason.ALREADY_LOADED: Refusal(LoadFailed, 409),
    Reason.CHECKPOINT_NOT_FOUND: Refusal(LoadFailed, 404),
    Reason.BAD_CHECKPOINT: Refusal(LoadFailed, 400),
    Reason.NO_WORKER: Refusal(LoadFailed, 400),
    Reason.OUT_OF_MEMORY: Refusal(LoadFailed, 507),
    Reason.LOAD_FAILED: Refusal(LoadFailed, 500),
    Reason.LOAD_TIMEOUT: Refusal(LoadFailed, 500),
    Reason.UNLOADED_WHILE_LOADING: Refusal(LoadFailed, 500),
    Reason.NOT_LOADED: Refusal(UnloadFailed, 404),
    Reason.LOAD_IN_PROGRESS: Refusal(UnloadFailed, 409),
    Reason.ALREADY_UNLOADING: Refusal(UnloadFailed, 409),
    Reason.DRAIN_TIMEOUT: Refusal(UnloadFailed, 409),
}


def as_api_error(exc: EngineError, *, failed: type[LoadFailed | UnloadFailed] | None = None) -> PantheonError:
    """The PantheonError a route or service answers `exc` with; its audit reason is the engine's reason code.
    `failed`: the operation's own error (a load's, an unload's), which a reason mapped to any other error becomes,
    with status 500."""
    refusal = REFUSALS[exc.reason]
    if failed is not None and refusal.error is not failed:
        return failed(exc.message, reason=exc.reason.value)
    if refusal.error is ContextOverBudget:
        return ContextOverBudget(exc.kv_used or 0, exc.kv_cap or 0, exc.message, reason=exc.reason.value)
    extra: dict = {}
    if refusal.status is not None:
        extra["status"] = refusal.status
    if refusal.retry_after_setting is not None:
        extra["retry_after"] = getattr(settings, refusal.retry_after_setting)
    return refusal.error(exc.message, reason=exc.reason.value, **extra)
