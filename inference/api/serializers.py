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

import msgspec
from rest_framework import serializers

from inference.engine.contract.params import LoadOptions
from pantheon_site.errors import InvalidRequest, as_pantheon_error

MAX_DIES = 8
SESSION_ID_MAX_CHARS = 256  # a session key is an opaque id (opencode sends a ulid); this bounds what we keep and log
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


class NonNegativeIntegerField(serializers.IntegerField):
    """A count where 0 (or, as in the C server's parsing, anything below it) means "the engine's default"."""

    def to_internal_value(self, data):
        return max(0, super().to_internal_value(data))


def _load_option_field(option: msgspec.inspect.Field) -> serializers.Field:
    """The body field of one LoadOptions field, optional and without a default (an option the body leaves out keeps
    the catalogue entry's saved value): a count (negative reads as 0), a flag, or one of the struct's names (dtype
    "" is automatic)."""
    kind = option.type.type if isinstance(option.type, msgspec.inspect.Metadata) else option.type
    if isinstance(kind, msgspec.inspect.BoolType):
        return serializers.BooleanField(required=False)
    if isinstance(kind, msgspec.inspect.IntType):
        return NonNegativeIntegerField(required=False)
    if isinstance(kind, msgspec.inspect.LiteralType):
        return serializers.ChoiceField(choices=kind.values, required=False)
    raise TypeError(f"LoadOptions.{option.name}: no body field for {kind!r}")


class LoadModelSerializer(serializers.Serializer):
    """POST /admin/models/load. `dies` are CUDA device ordinals (at most 8); `device` ("cpu", "cuda:N") is
    Pantheon's own spelling of the same choice. A load places a model on one device. The options (ctx_cap, ...,
    dtype) are LoadOptions' fields, read from the struct; the validated data holds those the body named."""

    path = serializers.CharField()
    name = serializers.CharField(required=False, max_length=200)
    dies = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False, max_length=MAX_DIES)
    device = serializers.RegexField(r"^(cpu|cuda:\d+)$", required=False)

    def get_fields(self):
        options = msgspec.inspect.type_info(LoadOptions).fields
        return {**super().get_fields(), **{option.name: _load_option_field(option) for option in options}}


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
