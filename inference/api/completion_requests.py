"""The bodies of POST /v1/completions (OpenAI's legacy text completion) and POST /v1/embeddings, validated at the
edge on top of what every generation route takes (generation_requests.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from inference.api.generation_requests import (
    MAX_TOKENS_LIMIT,
    Delivery,
    GenerationSerializer,
    PromptField,
    delivery_from,
    options_from,
    sampling_from,
)
from inference.api.serializers import parse_json_object, validated
from inference.engine.contract.params import TOP_LOGPROBS_LIMIT, GenerationOptions, SamplingParams

COMPLETION_MAX_TOKENS_DEFAULT = 16  # OpenAI's default for /v1/completions


class CompletionSerializer(GenerationSerializer):
    """POST /v1/completions (OpenAI's legacy route: a prompt, no chat template). max_tokens defaults to 16, as
    OpenAI's; 0 is allowed with echo (the prompt alone, scored with logprobs)."""

    prompt = PromptField()
    suffix = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    max_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    echo = serializers.BooleanField(default=False)
    logprobs = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=TOP_LOGPROBS_LIMIT)
    best_of = serializers.IntegerField(required=False, allow_null=True, min_value=1)

    def validate(self, attrs):
        if attrs.get("suffix"):
            raise serializers.ValidationError({"suffix": "is not supported: these models do not fill in the middle"})
        if attrs.get("best_of") not in (None, attrs.get("n") or 1):
            raise serializers.ValidationError({"best_of": "is supported only equal to n (every choice is returned)"})
        if attrs.get("max_tokens") == 0 and not attrs["echo"]:
            raise serializers.ValidationError({"max_tokens": "0 is allowed only with echo (the prompt alone)"})
        return attrs


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated legacy completion request."""

    model: str
    prompts: list[str | list[int]]
    sampling: SamplingParams
    options: GenerationOptions
    delivery: Delivery
    echo: bool = False
    logprobs: int | None = None  # alternatives per token in the legacy logprobs object; None: no logprobs

    def prompt_logprobs(self, prompt: str | list[int]) -> int | None:
        """What the worker must score of `prompt`: echoed with logprobs, each token (with alternatives); echoed
        token ids, their text (0 alternatives); else nothing."""
        if self.echo and self.logprobs is not None:
            return self.logprobs
        return 0 if self.echo and not isinstance(prompt, str) else None


def parse_completion_request(raw: bytes) -> CompletionRequest:
    """The body of POST /v1/completions, validated; InvalidRequest otherwise."""
    data = validated(CompletionSerializer, parse_json_object(raw))
    max_tokens = data.get("max_tokens")
    max_tokens = COMPLETION_MAX_TOKENS_DEFAULT if max_tokens is None else min(max_tokens, MAX_TOKENS_LIMIT)
    logprobs = data.get("logprobs")
    return CompletionRequest(
        model=data.get("model") or "",
        prompts=data["prompt"],
        sampling=sampling_from(data, logprobs=logprobs is not None, top_logprobs=logprobs or 0),
        options=options_from(data, max_tokens),
        delivery=delivery_from(data),
        echo=data["echo"],
        logprobs=logprobs,
    )


class EmbeddingSerializer(serializers.Serializer):
    """POST /v1/embeddings."""

    model = serializers.CharField(required=False, allow_null=True, allow_blank=True, default="")
    input = PromptField()
    encoding_format = serializers.ChoiceField(choices=("float", "base64"), default="float")
    dimensions = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True)


def parse_embedding_request(raw: bytes) -> dict[str, Any]:
    """The body of POST /v1/embeddings, validated; InvalidRequest otherwise."""
    return validated(EmbeddingSerializer, parse_json_object(raw))
