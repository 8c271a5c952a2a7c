"""What the generation routes' bodies share (chat, legacy completions, and through chat the Responses API), validated
at the edge with DRF serializers (serializers.py: how a body is read and validated).

Every field keeps the spec's default and clamp (pantheon-http-api.md, "Request body"): the sampling knobs become the
engine's `SamplingParams`, what ends a generation its `GenerationOptions` (both carried whole to the worker), and how
the answer is sent (stream, n choices) a `Delivery`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec
from rest_framework import serializers

from inference.engine.contract.params import (
    SEED_LIMIT,
    TOKEN_ID_LIMIT,
    TOP_LOGPROBS_LIMIT,
    GenerationOptions,
    SamplingParams,
)
from pantheon_site.errors import InvalidRequest

MAX_TOKENS_LIMIT = 1_048_576
LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0
MAX_CHOICES = 8  # n is capped here; the response then says n_status "capped_to_8"
MAX_PROMPTS = 64  # prompts in one request (each is its own group of n choices), inputs in one embedding request


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


class StopField(serializers.Field):
    """`stop`: one string or an array of strings, as a list without empty strings."""

    def __init__(self, **kwargs):
        super().__init__(required=False, allow_null=True, default=list, **kwargs)

    def validate_empty_values(self, data):
        if data is None:
            return True, []
        return super().validate_empty_values(data)

    def to_internal_value(self, data):
        items = [data] if isinstance(data, str) else data
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise serializers.ValidationError("must be a string or an array of strings")
        return [s for s in items if s]

    def to_representation(self, value):
        return value


class LogitBiasField(serializers.Field):
    """`logit_bias`: {"<token id>": bias}. Biases are clamped to [-100, 100]; keys that are not token ids and
    non-numeric values are skipped."""

    def __init__(self, **kwargs):
        super().__init__(required=False, allow_null=True, default=dict, **kwargs)

    def validate_empty_values(self, data):
        if data is None:
            return True, {}
        return super().validate_empty_values(data)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object of token id to bias")
        bias = {}
        for key, value in data.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            try:
                token = int(key)
            except ValueError:
                continue
            if abs(token) > TOKEN_ID_LIMIT:  # no such token in any vocabulary
                continue
            bias[token] = _clamp(float(value), -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)
        return bias

    def to_representation(self, value):
        return value


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = serializers.BooleanField(default=False)


class GenerationSerializer(serializers.Serializer):
    """The fields both generation routes take (chat and legacy completions). Defaults: temperature 0.7, top_p 0.95,
    top_k 40 (the spec's)."""

    model = serializers.CharField(required=False, allow_null=True, allow_blank=True, default="")
    temperature = serializers.FloatField(default=0.7)
    top_p = serializers.FloatField(default=0.95)
    top_k = serializers.IntegerField(default=40)
    stop = StopField()
    stream = serializers.BooleanField(default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    seed = serializers.IntegerField(required=False, allow_null=True)
    presence_penalty = serializers.FloatField(default=0.0)
    frequency_penalty = serializers.FloatField(default=0.0)
    logit_bias = LogitBiasField()
    n = serializers.IntegerField(required=False, allow_null=True, default=1)
    # vLLM's extensions, which benchmarks and evaluation harnesses send
    ignore_eos = serializers.BooleanField(default=False)
    min_tokens = serializers.IntegerField(default=0, min_value=0, max_value=MAX_TOKENS_LIMIT)
    stop_token_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=TOKEN_ID_LIMIT - 1), default=list, max_length=64
    )
    skip_special_tokens = serializers.BooleanField(default=True)


@dataclass(frozen=True, slots=True)
class Delivery:
    """How a generation route sends its answer: as a stream (with a usage chunk when asked) or one JSON body, with
    `n` choices (`n_status` says when n was capped)."""

    stream: bool
    include_usage: bool
    n: int
    n_status: str | None


def delivery_from(data: dict[str, Any]) -> Delivery:
    n = max(1, data.get("n") or 1)
    return Delivery(
        stream=data["stream"],
        include_usage=bool((data.get("stream_options") or {}).get("include_usage")),
        n=min(n, MAX_CHOICES),
        n_status="capped_to_8" if n > MAX_CHOICES else None,
    )


def options_from(data: dict[str, Any], max_tokens: int) -> GenerationOptions:
    """The GenerationOptions of GenerationSerializer's validated data and the route's resolved `max_tokens`
    (min_tokens is cut to it)."""
    return GenerationOptions(
        max_tokens=max_tokens,
        stop=data["stop"],
        stop_token_ids=list(data["stop_token_ids"]),
        ignore_eos=data["ignore_eos"],
        min_tokens=min(data["min_tokens"], max_tokens),
        skip_special_tokens=data["skip_special_tokens"],
    )


def sampling_from(data: dict[str, Any], *, logprobs: bool, top_logprobs: int, grammar: str | None = None):
    """The SamplingParams of GenerationSerializer's validated data, clamped as the spec says."""
    try:
        return SamplingParams(
            temperature=data["temperature"],
            top_p=_clamp(data["top_p"], 0.0, 1.0),
            top_k=int(_clamp(data["top_k"], 0, TOKEN_ID_LIMIT)),
            presence_penalty=_clamp(data["presence_penalty"], -PENALTY_LIMIT, PENALTY_LIMIT),
            frequency_penalty=_clamp(data["frequency_penalty"], -PENALTY_LIMIT, PENALTY_LIMIT),
            logprobs=logprobs,
            top_logprobs=int(_clamp(top_logprobs, 0, TOP_LOGPROBS_LIMIT)) if logprobs else 0,
            seed=None if data.get("seed") is None else data["seed"] % SEED_LIMIT,
            logit_bias=data["logit_bias"] or None,
            grammar=grammar,
        )
    except ValueError as exc:  # what the clamps leave: a number that is not finite
        raise InvalidRequest(str(exc), reason="sampling") from None


def sampling_for_choice(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s sampling: with a seed, choice i uses seed + i (so each choice differs, reproducibly)."""
    if index == 0 or sampling.seed is None:
        return sampling
    return msgspec.structs.replace(sampling, seed=(sampling.seed + index) % SEED_LIMIT)


class PromptField(serializers.Field):
    """A completion's `prompt` or an embedding's `input`: a string, a list of strings, a list of token ids, or a
    list of token-id lists; read as a list of inputs, each a string or a list of token ids."""

    default_error_messages = {
        "type": "must be a string, a list of strings, a list of token ids or a list of token-id lists",
        "empty": "must not be an empty list",
        "many": f"at most {MAX_PROMPTS} per request",
        "token": f"token ids must be integers in [0, {TOKEN_ID_LIMIT})",
    }

    def to_internal_value(self, data):
        if isinstance(data, str):
            return [data]
        if not isinstance(data, list):
            self.fail("type")
        if not data:
            self.fail("empty")
        if all(isinstance(item, str) for item in data):
            prompts = list(data)
        elif all(_is_token_id(item) for item in data):
            prompts = [list(data)]
        elif all(isinstance(item, list) and item and all(_is_token_id(t) for t in item) for item in data):
            prompts = [list(item) for item in data]
        elif all(_is_int(t) for t in _flat(data)):  # token ids, some out of range
            self.fail("token")
        else:
            self.fail("type")
        if len(prompts) > MAX_PROMPTS:
            self.fail("many")
        return prompts

    def to_representation(self, value):
        return value


def _is_token_id(value: Any) -> bool:
    return _is_int(value) and 0 <= value < TOKEN_ID_LIMIT


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flat(items: list) -> list:
    return [t for item in items for t in (item if isinstance(item, list) else [item])]
