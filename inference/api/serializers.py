"""Request bodies of the /v1 and /admin routes, validated at the edge with DRF serializers: how a body is read and
validated, the session key every route that keeps KV takes, and the operator routes' bodies.

Every field keeps the spec's default and clamp (pantheon-http-api.md, "Request body"), so a route receives values it
can hand to the engine unchanged. Anything that fails validation raises `InvalidRequest` (400
invalid_request_error) with a one-line message naming the field. The generation routes' bodies are in
generation_requests.py (what they share), chat_requests.py and completion_requests.py (legacy completions and
embeddings); the session routes' in session_requests.py.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from rest_framework import serializers

from inference.services.session_export import session_id_error
from pantheon_site.errors import InvalidRequest, as_pantheon_error

SESSION_HEADER = "X-Session-Id"


MAX_JSON_DEPTH = 128  # arrays and objects inside one another; real bodies (tool schemas included) stay far below


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; InvalidRequest for an empty body, malformed JSON, a non-object, or one
    nested deeper than MAX_JSON_DEPTH (so that nothing after the edge recurses through a hostile depth)."""
    if not raw.strip():
        raise InvalidRequest("the request body is empty", reason="empty_body")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}", reason="malformed_json") from None
    except RecursionError:  # nested deeper than the parser's recursion limit
        raise InvalidRequest(_too_deep_message(), reason="json_too_deep") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", reason="body_not_object")
    if _deeper_than(body, MAX_JSON_DEPTH):
        raise InvalidRequest(_too_deep_message(), reason="json_too_deep")
    return body


def _too_deep_message() -> str:
    return f"the request body is nested more than {MAX_JSON_DEPTH} levels deep"


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels in `value` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def validated(serializer_class: type[serializers.Serializer], body: dict[str, Any]) -> dict[str, Any]:
    """`body` validated by `serializer_class`, or InvalidRequest naming what is wrong.

    Through one bound instance of the class per thread, reused: a new serializer deep-copies its declared fields
    and every nested serializer's on first use, most of a chat request's validation time. Validation keeps no state
    in the instance (`run_validation` returns the data or raises), and runs without awaiting, so a thread's
    instance serves one request at a time."""
    serializer = _bound_serializer(serializer_class)
    try:
        return serializer.run_validation(body)
    except serializers.ValidationError as exc:
        raise as_pantheon_error(serializers.ValidationError(exc.detail)) from None
    except RecursionError:  # a field that recurses through a value (JSONField re-encodes it) on a hostile depth
        raise InvalidRequest(_too_deep_message(), reason="json_too_deep") from None


_bound = threading.local()


def _bound_serializer(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    instances = _bound.__dict__.setdefault("instances", {})
    if (serializer := instances.get(serializer_class)) is None:
        serializer = instances[serializer_class] = serializer_class()
    return serializer


class SessionIdField(serializers.Field):
    """A session key in a body or query (see `session_id_error`); null or absent reads as no key."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        if not kwargs["required"]:
            kwargs.setdefault("default", None)
        super().__init__(allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if problem := session_id_error(data):
            raise serializers.ValidationError(problem)
        return data

    def to_representation(self, value):
        return value


def session_id_from_header(headers: Any) -> str | None:
    """The X-Session-Id header's session key (None without the header); InvalidRequest when it is not one."""
    value = headers.get(SESSION_HEADER)
    if value is None:
        return None
    if problem := session_id_error(value):
        raise InvalidRequest(f"{SESSION_HEADER}: {problem}", reason="session_id")
    return value


# -- operator routes ----------------------------------------------------------------------------------------------


class UnloadModelSerializer(serializers.Serializer):
    """POST /admin/models/unload: by served `name`, or by instance `id` (one of several instances of a name)."""

    name = serializers.CharField(required=False)
    id = serializers.IntegerField(required=False, min_value=1)

    def validate(self, attrs):
        if not attrs.get("name") and attrs.get("id") is None:
            raise serializers.ValidationError({"name": ["This field is required."]})
        return attrs


def parse_body(serializer_class: type[serializers.Serializer], raw: bytes) -> dict[str, Any]:
    """A JSON-object body validated by `serializer_class`; InvalidRequest otherwise."""
    return dict(validated(serializer_class, parse_json_object(raw)))
