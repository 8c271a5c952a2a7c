"""The body of POST /v1/chat/completions (and the chat request a Responses body means, responses.py), validated at
the edge: the turns, tools and tool_choice, response_format, thinking and the session key, on top of what every
generation route takes (generation_requests.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from rest_framework import serializers

from inference.api.generation_requests import (
    MAX_TOKENS_LIMIT,
    Delivery,
    GenerationSerializer,
    delivery_from,
    options_from,
    sampling_for_choice,
    sampling_from,
)
from inference.api.response_format import ResponseFormatPlan, plan_response_format
from inference.api.serializers import SessionIdField, parse_json_object, session_id_from_header, validated
from inference.api.tool_choice import ToolPlan, plan_tools
from inference.engine.contract import messages as p
from inference.engine.contract.params import TOKEN_ID_LIMIT, GenerationOptions, SamplingParams

ROLES = ("system", "user", "assistant", "tool")
MAX_TOKENS_DEFAULT = 1024
MAX_TOKENS_NONPOSITIVE = 512  # what max_tokens <= 0 means


TEXT_PARTS = ("text", "input_text", "output_text")  # OpenAI's chat and Responses names of a text part
MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url")


class ContentField(serializers.Field):
    """A message's content: a string; an array of content parts, whose text parts are joined in order (what a
    chat template does with them, so parts and the same text as a string give the same prompt); or null (an
    assistant turn that only calls tools), read as "". A part a text model cannot read (an image, audio, a file) is
    a 400 that says so, rather than being dropped."""

    default_error_messages = {
        "type": "content must be a string, an array of content parts or null",
        "part": "each content part must be an object with a string `type`",
        "media": "this server's models read text only: a content part of type {kind!r} cannot be read",
        "unknown": "unknown content part type {kind!r} (text parts are of type 'text')",
        "text": "a text content part needs a string `text`",
    }

    def __init__(self, **kwargs):
        super().__init__(required=False, allow_null=True, default="", **kwargs)

    def validate_empty_values(self, data):
        if data is None:
            return True, ""
        return super().validate_empty_values(data)

    def to_internal_value(self, data):
        if isinstance(data, str):
            return data
        if not isinstance(data, list):
            self.fail("type")
        texts = []
        for part in data:
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str):
                self.fail("part")
            if kind in MEDIA_PARTS:
                self.fail("media", kind=kind)
            if kind not in TEXT_PARTS:
                self.fail("unknown", kind=kind)
            if not isinstance(part.get("text"), str):
                self.fail("text")
            texts.append(part["text"])
        return "".join(texts)

    def to_representation(self, value):
        return value


class MessageSerializer(serializers.Serializer):
    """One chat turn. A missing role is a user turn (the spec's choice); content as ContentField reads it."""

    role = serializers.ChoiceField(choices=ROLES, default="user")
    content = ContentField()
    reasoning_content = serializers.CharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False)
    tool_calls = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True)
    tool_call_id = serializers.CharField(required=False, allow_blank=True)
    name = serializers.CharField(required=False, allow_blank=True)

    def validate(self, attrs):
        # Only an assistant turn replays reasoning and tool calls; None values are left out of the template's input.
        if attrs["role"] != "assistant":
            attrs.pop("reasoning_content", None)
            attrs.pop("tool_calls", None)
        return {k: v for k, v in attrs.items() if v is not None}


class ChatCompletionSerializer(GenerationSerializer):
    """POST /v1/chat/completions (max_tokens default 1024)."""

    messages = MessageSerializer(many=True, allow_empty=False)
    max_tokens = serializers.IntegerField(required=False, allow_null=True)
    max_completion_tokens = serializers.IntegerField(required=False, allow_null=True)
    logprobs = serializers.BooleanField(default=False)
    top_logprobs = serializers.IntegerField(default=0)
    tools = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True)
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    response_format = serializers.DictField(required=False, allow_null=True)
    enable_thinking = serializers.BooleanField(required=False, allow_null=True, default=None)
    reasoning_budget = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=TOKEN_ID_LIMIT)
    max_reasoning_tokens = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=TOKEN_ID_LIMIT
    )
    session_id = SessionIdField()
    prompt_cache_key = SessionIdField()  # OpenAI's name for it
    promptCacheKey = SessionIdField()  # noqa: N815  opencode's camelCase body field


def chat_request_from(data: dict[str, Any], headers: Any = None) -> ChatRequest:
    """ChatCompletionSerializer's validated data as what the route and the engine need, defaults and clamps applied.
    The session key is the body's session_id, else prompt_cache_key, else promptCacheKey, else the X-Session-Id
    header of `headers` (which is only read, and validated, when no body key is given)."""
    tool_plan = plan_tools(data.get("tools") or None, data.get("tool_choice"))
    response_format = plan_response_format(data.get("response_format"), tools_present=tool_plan.tools is not None)
    sampling = sampling_from(
        data, logprobs=data["logprobs"], top_logprobs=data["top_logprobs"], grammar=response_format.grammar
    )
    session_id = data.get("session_id") or data.get("prompt_cache_key") or data.get("promptCacheKey")
    if session_id is None and headers is not None:
        session_id = session_id_from_header(headers)
    return ChatRequest(
        model=data.get("model") or "",
        messages=[dict(m) for m in data["messages"]],
        sampling=sampling,
        options=options_from(data, _max_tokens(data)),
        delivery=delivery_from(data),
        tool_plan=tool_plan,
        response_format=response_format,
        enable_thinking=_enable_thinking(data.get("enable_thinking")),
        reasoning_budget=_first_given(data.get("reasoning_budget"), data.get("max_reasoning_tokens")),
        session_id=session_id,
    )


def _max_tokens(data: dict[str, Any]) -> int:
    """max_tokens, else max_completion_tokens, else the default; a value of 0 or less means 512."""
    max_tokens = _first_given(data.get("max_tokens"), data.get("max_completion_tokens"))
    if max_tokens is None:
        return MAX_TOKENS_DEFAULT
    return MAX_TOKENS_NONPOSITIVE if max_tokens <= 0 else min(max_tokens, MAX_TOKENS_LIMIT)


def _enable_thinking(requested: bool | None) -> bool | None:
    """The request's enable_thinking; absent, false when PANTHEON_NO_THINK is set, else the template's default."""
    if requested is None and settings.PANTHEON_NO_THINK:
        return False
    return requested


def _first_given(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


@dataclass(slots=True)
class ChatRequest:
    """A validated chat completion request, with its sampling parameters as the engine takes them."""

    model: str
    messages: list[dict[str, Any]]
    sampling: SamplingParams
    options: GenerationOptions
    delivery: Delivery
    tool_plan: ToolPlan = field(default_factory=ToolPlan)
    response_format: ResponseFormatPlan = field(default_factory=ResponseFormatPlan)
    enable_thinking: bool | None = None
    reasoning_budget: int | None = None  # think tokens before </think> is forced (None: the model's; 0: unbounded)
    session_id: str | None = None  # the session whose KV this conversation keeps between turns

    @property
    def wants_logprobs(self) -> bool:
        return self.sampling.logprobs

    def submits(self, model: str, completion_id: str) -> list[p.Submit]:
        """One SUBMIT per choice (with a seed, choice i samples with seed + i). The session key goes with the first
        choice only (spec: only the first uses the session's prefix cache); a model that keeps no sessions ignores
        it."""
        n = self.delivery.n
        return [
            p.Submit(
                request_id=completion_id if n == 1 else f"{completion_id}-{i}",
                model=model,
                messages=self.messages,
                tools=self.tool_plan.tools,
                tool_grammar=self.tool_plan.grammar,
                tool_function=self.tool_plan.function,
                enable_thinking=self.enable_thinking,
                sampling=sampling_for_choice(self.sampling, i),
                options=self.options,
                session_id=self.session_id if i == 0 else None,
                reasoning_budget=self.reasoning_budget,
            )
            for i in range(n)
        ]


def parse_chat_request(raw: bytes, headers: Any = None) -> ChatRequest:
    """The body of POST /v1/chat/completions (with the request's `headers`, for X-Session-Id), validated;
    InvalidRequest otherwise."""
    return chat_request_from(validated(ChatCompletionSerializer, parse_json_object(raw)), headers)
