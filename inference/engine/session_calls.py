"""The worker's answers to the session calls (SESSION_EXPORT, _RESTORE, _RELEASE, _WATCH, _LIST) for one model.

Export copies a conversation's KV out of the pool into a blob (session_blob.py) that records the model's layout and
weights version; restore checks a blob against both before it takes a single block, so a refused restore changes
nothing. A restore is two parts: `read_restore` checks and copies the blob (thread-safe: the worker runs it for a
large blob on its preparation thread), `install_restore` writes it into the pool (on the loop). The session
bookkeeping itself is sessions.py.
"""

from __future__ import annotations

from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason
from inference.engine.errors import ContextOverflow, KVCacheFull
from inference.engine.kv.session_blob import (
    BadSessionBlob,
    SessionLayout,
    SessionSnapshot,
    WeightsVersionMismatch,
    decode_blob,
    encode_blob,
)
from inference.engine.kv.sessions import SessionError, SessionTable
from inference.engine.loaders.loaded import LoadedModel

SessionCall = p.SessionExport | p.SessionRestore | p.SessionRelease | p.SessionWatch | p.SessionList


def session_layout(model: LoadedModel) -> SessionLayout:
    config, cache = model.config, model.runner.cache
    return SessionLayout(
        architecture=config.architecture,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=cache.keys[0].dtype,
        block_size=cache.block_size,
    )


def answer(
    model: LoadedModel,
    sessions: SessionTable | None,
    call: SessionCall,
    restored: SessionSnapshot | p.Error | None = None,
) -> p.Message:
    """The reply to a session call: its reply message, or ERROR with the reason. `restored`: a restore's
    `read_restore`, when it was read already."""
    match call:
        case p.SessionRelease(request_id=rid, session_id=sid):
            released = sessions.release(sid) if sessions is not None else False
            return p.SessionReleased(request_id=rid, session_id=sid, released=released)
        case p.SessionList(request_id=rid, model=name):
            return p.Sessions(request_id=rid, model=name, sessions=sessions.info() if sessions is not None else [])
    if sessions is None:
        message = "this model keeps no sessions (sessions are off, or max_sessions is 0)"
        return p.Error(request_id=call.request_id, reason=Reason.SESSIONS_DISABLED, message=message)
    if isinstance(call, p.SessionExport | p.SessionRestore) and model.split is not None:
        return p.Error(request_id=call.request_id, reason=Reason.BAD_REQUEST, message=split_kv(model))
    try:
        match call:
            case p.SessionWatch(request_id=rid, session_id=sid, watching=watching):
                return p.SessionWatched(request_id=rid, session_id=sid, watchers=sessions.watch(sid, watching))
            case p.SessionExport():
                return _export(model, sessions, call)
            case p.SessionRestore():
                snapshot = read_restore(model, call) if restored is None else restored
                return snapshot if isinstance(snapshot, p.Error) else install_restore(model, sessions, call, snapshot)
    except SessionError as exc:
        return p.Error(request_id=call.request_id, reason=Reason(exc.reason), message=str(exc))
    raise TypeError(f"not a session call: {type(call).__name__}")


def _export(model: LoadedModel, sessions: SessionTable, call: p.SessionExport) -> p.SessionBlob:
    conv = sessions.conversation_to_export(call.session_id)
    keys, values = model.runner.cache.read(conv.slot)
    snapshot = SessionSnapshot(
        layout=session_layout(model),
        weights_version=model.weights_version,
        tokens=list(conv.token_ids),
        keys=keys,
        values=values,
    )
    return p.SessionBlob(
        request_id=call.request_id,
        session_id=call.session_id,
        weights_version=model.weights_version,
        tokens=list(conv.token_ids),
        blob=encode_blob(snapshot),
    )


def split_kv(model: LoadedModel) -> str:
    return (
        f"session export and restore are not available for a model split across {model.split.ranks} ranks "
        "(tensor_parallel): each rank holds only its own heads' KV"
    )


def read_restore(model: LoadedModel, call: p.SessionRestore) -> SessionSnapshot | p.Error:
    """The snapshot a restore installs, or the ERROR that refuses it (touches neither the pool nor the sessions)."""
    if model.split is not None:
        return p.Error(request_id=call.request_id, reason=Reason.BAD_REQUEST, message=split_kv(model))
    cache = model.runner.cache
    try:
        snapshot = decode_blob(
            call.blob,
            call.tokens,
            expect=session_layout(model),
            weights_version=model.weights_version,
            max_tokens=cache.context_window,
        )
    except WeightsVersionMismatch as exc:
        return p.Error(request_id=call.request_id, reason=Reason.WEIGHTS_VERSION_MISMATCH, message=str(exc))
    except BadSessionBlob as exc:
        return p.Error(request_id=call.request_id, reason=Reason.BAD_SESSION_BLOB, message=str(exc))
    if any(not 0 <= t < model.runner.vocab_size for t in snapshot.tokens):
        message = f"the session's tokens must be ids below this model's vocabulary of {model.runner.vocab_size}"
        return p.Error(request_id=call.request_id, reason=Reason.BAD_SESSION_BLOB, message=message)
    return snapshot


def install_restore(
    model: LoadedModel, sessions: SessionTable, call: p.SessionRestore, snapshot: SessionSnapshot
) -> p.Message:
    """Writes a read snapshot into the pool as a conversation of the call's session (SessionError if the session
    cannot take it)."""
    cache = model.runner.cache
    slot = cache.allocate()
    try:
        cache.write(slot, snapshot.tokens, snapshot.keys, snapshot.values)
    except (KVCacheFull, ContextOverflow) as exc:
        cache.free(slot)
        return p.Error(request_id=call.request_id, reason=Reason.LOW_MEMORY, message=f"no room for the session: {exc}")
    sessions.restore(call.session_id, slot)
    return p.SessionRestored(request_id=call.request_id, session_id=call.session_id, n_tok=len(snapshot.tokens))
