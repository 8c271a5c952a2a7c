"""The engine's refusals and failures as the spec's error types, so a route renders them like any other error.

The worker already names each refusal with the API's `type` and status (`EngineError`); this only picks the
exception class that carries that type's headers (Retry-After, kv fields). A type the spec does not list for these
routes (a worker that died, a model unloaded under a running generation) is a generation failure: 500
server_error, with the engine's message.
"""

from __future__ import annotations

from inference.runtime.engine_client import EngineError, WorkerDied
from pantheon_site.errors import (
    ContextOverBudget,
    InvalidRequest,
    LoadFailed,
    ModelNotFound,
    PantheonError,
    ServerBusy,
    ServerError,
    ServerMemoryConstrained,
    ServerShuttingDown,
    UnloadFailed,
)


def as_api_error(exc: EngineError) -> PantheonError:
    """The PantheonError a route answers `exc` with."""
    reason = exc.type
    if isinstance(exc, WorkerDied):
        return ServerError(exc.message, reason="worker_died")
    match exc.type:
        case "context_over_budget":
            return ContextOverBudget(exc.kv_used or 0, exc.kv_cap or 0, exc.message, reason=reason)
        case "server_busy":
            return ServerBusy(exc.message, retry_after=exc.retry_after, reason=reason)
        case "server_memory_constrained":
            return ServerMemoryConstrained(exc.message, retry_after=exc.retry_after, reason=reason)
        case "server_shutting_down":
            return ServerShuttingDown(exc.message, retry_after=exc.retry_after, reason=reason)
        case "model_not_found":
            return ModelNotFound(exc.message, reason=reason)
        case "invalid_request_error":
            return InvalidRequest(exc.message, reason=reason)
        case "load_failed":
            return LoadFailed(exc.message, status=exc.status, reason=reason)
        case "unload_failed":
            return UnloadFailed(exc.message, status=exc.status, reason=reason)
    return ServerError(exc.message, reason=reason)
