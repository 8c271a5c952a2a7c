"""An exported session as export's JSON body carries it (session_id, weights_version, n_tok, blob_bytes, blob_b64,
tokens), and the checks a session to restore passes before anything reaches the worker: its key, its token ids, its
blob's base64. Export writes the body here; the session routes' bodies (inference/api/session_requests.py) and the
UI's restore of an export file read theirs with the same checks, so both refuse the same things alike.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from inference.engine.contract import messages as p
from inference.engine.contract.params import TOKEN_ID_LIMIT
from pantheon_site.errors import BadSessionBlob, InvalidRequest

SESSION_ID_MAX_CHARS = 256  # a session key is an opaque id (opencode sends a ulid); this bounds what we keep and log
BASE64_WHITESPACE = b" \t\r\n"  # line breaks a base64 encoder may have inserted; dropped before decoding


@dataclass(slots=True)
class RestoreRequest:
    name: str
    session_id: str
    blob: bytes
    tokens: list[int]


def session_id_error(value: Any) -> str | None:
    """Why `value` is not a session key (None when it is one): a non-empty string of at most SESSION_ID_MAX_CHARS
    printable characters."""
    if not isinstance(value, str):
        return "must be a string"
    if not value:
        return "must not be empty"
    if len(value) > SESSION_ID_MAX_CHARS:
        return f"must be at most {SESSION_ID_MAX_CHARS} characters"
    if not value.isprintable():
        return "must not contain control characters"
    return None


def token_ids_error(value: Any) -> str | None:
    """Why `value` is not a restored history's token ids (None when it is): a non-empty array of token ids, checked in
    one pass (a restored history may be long)."""
    if not isinstance(value, list) or not value:
        return "must be a non-empty array of token ids"
    if not all(type(t) is int and 0 <= t <= TOKEN_ID_LIMIT for t in value):
        return "every token id must be an integer in [0, 2^31 - 1]"
    return None


def decode_blob(text: str) -> bytes:
    """A session blob from its base64 (export's blob_b64); 400 bad_session_blob when it is not base64 or is empty."""
    try:
        blob = base64.b64decode(text.encode("ascii").translate(None, BASE64_WHITESPACE), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError):
        raise BadSessionBlob("blob: not valid base64", reason="blob_not_base64") from None
    if not blob:
        raise BadSessionBlob("blob: empty", reason="blob_empty")
    return blob


def export_body(reply: p.SessionBlob) -> bytes:
    """Export's JSON body of the worker's answer, encoded (the blob of a long conversation is tens of MB or more)."""
    body = {
        "session_id": reply.session_id,
        "weights_version": reply.weights_version,
        "n_tok": len(reply.tokens),
        "blob_bytes": len(reply.blob),
        "blob_b64": base64.b64encode(reply.blob).decode("ascii"),
        "tokens": reply.tokens,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def read_export(model: str, session_id: str, upload: bytes) -> RestoreRequest:
    """An export file (export's JSON body) as a restore of it into `model` under `session_id` (empty: the file's
    own), checked as POST /session/restore checks its body. Slow for a large file: run it on a thread."""
    try:
        exported = json.loads(upload)
        text, tokens = exported["blob_b64"], exported["tokens"]
    except (ValueError, KeyError, TypeError):
        raise BadSessionBlob("the file is not a session export", reason="not_an_export") from None
    session_id = session_id or exported.get("session_id", "")
    problems = {
        "session_id": session_id_error(session_id),
        "blob": None if isinstance(text, str) else "must be a string",
        "tokens": token_ids_error(tokens),
    }
    if any(problems.values()):
        message = "; ".join(f"{field}: {problem}" for field, problem in problems.items() if problem)
        raise InvalidRequest(message, reason="validation")
    return RestoreRequest(model, session_id, decode_blob(text), tokens)
