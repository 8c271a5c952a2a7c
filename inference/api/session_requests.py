"""Request bodies and queries of the session routes (POST /admin/session/export, /session/restore, /session/release,
GET /session/estimate, /session/watch), validated at the edge like every other body (serializers.py): anything
wrong is 400 invalid_request_error naming the field, except a restore blob that is not base64 or a session file
that cannot be one (inference/services/session_file.py), which are the spec's 400 bad_session_blob and never reach
the worker.

In each route the session id is the body's (or query's) `session_id`, else the X-Session-Id header; export reads the
body only. `name` selects the model; "" means the default one (inference/services/sessions.py resolves it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from inference.api.serializers import SessionIdField, parse_json_object, session_id_from_header, validated
from inference.engine.contract.params import TOKEN_ID_LIMIT
from inference.services.session_export import RestoreRequest, decode_blob, token_ids_error
from inference.services.session_file import read_session_file
from pantheon_site.errors import InvalidRequest


class TokenListField(serializers.Field):
    """A non-empty array of token ids (`token_ids_error`)."""

    def to_internal_value(self, data):
        if problem := token_ids_error(data):
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value):
        return value


class TextField(serializers.CharField):
    """A string, taken as it is (no trimming, blank allowed); any other JSON value is refused, not converted."""

    def __init__(self, **kwargs):
        super().__init__(allow_blank=True, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a string")
        return data


class SessionTargetSerializer(serializers.Serializer):
    """POST /session/release and /admin/session/export, GET /session/watch: which model (`name`; absent: the default
    model) and which session (the body's or query's `session_id`, else the X-Session-Id header where allowed)."""

    name = TextField(required=False, allow_null=True, default="", max_length=200)
    session_id = SessionIdField()


class SessionRestoreSerializer(SessionTargetSerializer):
    """POST /session/restore: `blob` as export's blob_b64, `tokens` as export's tokens."""

    blob = TextField()
    tokens = TokenListField()


class SessionEstimateSerializer(serializers.Serializer):
    """GET /session/estimate's query: tokens (> 0) required; blob_bytes and upload_bps, when given, positive."""

    tokens = serializers.IntegerField(min_value=1, max_value=TOKEN_ID_LIMIT)
    name = TextField(required=False, default="", max_length=200)
    blob_bytes = serializers.IntegerField(required=False, min_value=1)
    upload_bps = serializers.FloatField(required=False, min_value=1e-9)


@dataclass(slots=True)
class SessionTarget:
    name: str  # "" : the default model
    session_id: str


def _session_target(data: dict[str, Any], headers: Any) -> SessionTarget:
    session_id = data.get("session_id")
    if session_id is None and headers is not None:
        session_id = session_id_from_header(headers)
    if session_id is None:
        where = "in the body or the X-Session-Id header" if headers is not None else "in the body"
        raise InvalidRequest(f"session_id: a session id is required ({where})", reason="session_id_missing")
    return SessionTarget(data.get("name") or "", session_id)


def parse_session_target(raw: bytes, headers: Any = None) -> SessionTarget:
    """A release or export body; `headers` (for X-Session-Id) only where the route reads the header (not export)."""
    return _session_target(validated(SessionTargetSerializer, parse_json_object(raw)), headers)


def parse_session_query(query: Any, headers: Any) -> SessionTarget:
    """GET /session/watch's query (session_id, name) with the X-Session-Id header as the fallback."""
    return _session_target(validated(SessionTargetSerializer, dict(query.items())), headers)


def parse_restore_request(raw: bytes, headers: Any) -> RestoreRequest:
    """POST /session/restore's body. A blob that is not base64 is 400 bad_session_blob, decided here: nothing is sent
    to the worker. Slow for a large body (parsing, decoding): run it on a thread."""
    data = validated(SessionRestoreSerializer, parse_json_object(raw))
    target = _session_target(data, headers)
    return RestoreRequest(target.name, target.session_id, decode_blob(data["blob"]), data["tokens"])


def parse_raw_restore_request(raw: bytes, query: Any, headers: Any) -> RestoreRequest:
    """POST /session/restore with a session file as its body: the model and session id from the query (`name`,
    `session_id`), the id else from the X-Session-Id header. Slow for a large file: run it on a thread."""
    target = parse_session_query(query, headers)
    tokens, blob = read_session_file(raw)
    return RestoreRequest(target.name, target.session_id, blob, tokens)


def parse_estimate_query(query: Any) -> dict[str, Any]:
    """GET /session/estimate's query, validated: tokens, name ("" when absent), blob_bytes and upload_bps (absent
    when not given)."""
    return dict(validated(SessionEstimateSerializer, dict(query.items())))
