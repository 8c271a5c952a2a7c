"""The body of a load (POST /admin/models/load, the UI's load and catalogue forms, `manage.py load_model`), validated
once here for all three: the path, the served name, the device or dies, and LoadOptions' fields, read from the struct.
Anything wrong is InvalidRequest (400 invalid_request_error) naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
from rest_framework import serializers

from inference.engine.contract.params import LoadOptions
from pantheon_site.errors import as_pantheon_error

MAX_DIES = 8
# The largest count a load may name: no window, session count or budget comes near it, and the protocol's integers
# are 64-bit, so a larger one could not even reach the worker (it failed the load with a 500).
COUNT_LIMIT = 2**31 - 1


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
        return NonNegativeIntegerField(required=False, max_value=COUNT_LIMIT)
    if isinstance(kind, msgspec.inspect.LiteralType):
        return serializers.ChoiceField(choices=kind.values, required=False)
    raise TypeError(f"LoadOptions.{option.name}: no body field for {kind!r}")


class LoadModelSerializer(serializers.Serializer):
    """POST /admin/models/load. `dies` are CUDA device ordinals (at most 8); `device` ("cpu", "cuda:N") is
    Pantheon's own spelling of the same choice. A load places a model on one device. The options (ctx_cap, ...,
    dtype) are LoadOptions' fields, read from the struct; the validated data holds those the body named."""

    path = serializers.CharField()
    name = serializers.CharField(required=False, max_length=200)
    dies = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=COUNT_LIMIT), required=False, max_length=MAX_DIES
    )
    device = serializers.RegexField(r"^(cpu|cuda:\d+)$", required=False)

    def get_fields(self):
        options = msgspec.inspect.type_info(LoadOptions).fields
        return {**super().get_fields(), **{option.name: _load_option_field(option) for option in options}}


def validate_load_body(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as LoadModelSerializer validates it (the LoadOptions fields it named, and no others), or InvalidRequest
    naming what is wrong."""
    try:
        return dict(LoadModelSerializer().run_validation(body))
    except serializers.ValidationError as exc:
        raise as_pantheon_error(serializers.ValidationError(exc.detail)) from None
