"""Why the engine refused or ended a request: the codes an ERROR message carries.

The engine states what happened; it never picks an HTTP status, an API error type or a Retry-After. The control
plane maps each reason in one table (inference/services/refusals.py; docs/architecture.md lists it). The last few
reasons are the control plane's own (its engine client decides them), so that one table covers every refusal.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    # a generation refused at submission
    BAD_REQUEST = "bad_request"  # a malformed message, a template or token-id problem, a bad parameter
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt + 1 > the context window (kv_used, kv_cap)
    QUEUE_FULL = "queue_full"  # every slot running and the wait queue full
    LOW_MEMORY = "low_memory"  # free device memory below the reserve
    MODEL_NOT_LOADED = "model_not_loaded"  # the named model is not on this worker, or is being unloaded
    # a generation ended before its finish
    QUEUE_TIMEOUT = "queue_timeout"  # waited longer than the queue wait for a slot
    MODEL_UNLOADED = "model_unloaded"  # still running when an unload's drain ran out
    SHUTTING_DOWN = "shutting_down"  # the worker is stopping
    GENERATION_FAILED = "generation_failed"  # the engine step failed (out of memory, a bug)
    INTERNAL = "internal"  # handling a message failed (a bug): that one request or call fails
    SESSION_CAPACITY = "session_capacity"  # a new session id while max_sessions ids hold KV
    WEIGHTS_TORN = "weights_torn"  # the model's weights are torn (a commit overran or broke off): nothing is served
    # sessions (export, restore)
    SESSIONS_DISABLED = "sessions_disabled"  # the model keeps no sessions (max_sessions 0)
    SESSION_NOT_FOUND = "session_not_found"  # no live session with that id
    SESSION_BUSY = "session_busy"  # a turn of that session is in flight
    BAD_SESSION_BLOB = "bad_session_blob"  # not a blob, corrupt, another architecture or shape, or too long
    WEIGHTS_VERSION_MISMATCH = "weights_version_mismatch"  # a blob captured under other weights
    # LOAD
    ALREADY_LOADED = "already_loaded"
    CHECKPOINT_NOT_FOUND = "checkpoint_not_found"
    BAD_CHECKPOINT = "bad_checkpoint"  # not a checkpoint, an unsupported architecture or tensor type, bad options
    OUT_OF_MEMORY = "out_of_memory"  # the weights or the smallest KV cache do not fit
    LOAD_FAILED = "load_failed"  # anything else (an I/O error, a bug)
    UNLOADED_WHILE_LOADING = "unloaded_while_loading"
    # UNLOAD
    NOT_LOADED = "not_loaded"
    ALREADY_UNLOADING = "already_unloading"
    DRAIN_TIMEOUT = "drain_timeout"  # generations still ran at the deadline of an unload without force
    LOAD_IN_PROGRESS = "load_in_progress"  # an unload of a model that is still loading
    # decided by the control plane's engine client, not by a worker
    WORKER_DIED = "worker_died"  # the worker running the generation or call died
    MODEL_RELOADING = "model_reloading"  # the model's worker crashed and the model is being loaded again
    WEIGHTS_HELD = "weights_held"  # a batch-priority generation while a trainer holds the model's weights
    NO_WORKER = "no_worker"  # no worker runs on the device a load names
    LOAD_TIMEOUT = "load_timeout"  # the worker did not answer a LOAD in time
