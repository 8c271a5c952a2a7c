"""Request bodies of the /v1 and /admin routes, validated at the edge with DRF serializers.

Every field keeps the spec's default and clamp (pantheon-http-api.md, "Request body"), so a route receives values it
can hand to the engine unchanged. Anything that fails validation raises `InvalidRequest` (400
invalid_request_error) with a one-line message naming the field. The session routes' bodies build on the session
key checks here (session_requests.py).
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import msgspec
from django.conf import settings
from rest_framework import serializers

from inference.api.response_format import ResponseFormatPlan, plan_response_format
from inference.api.tool_choice import ToolPlan, plan_tools
from inference.engine.contract.params import SEED_LIMIT, TOKEN_ID_LIMIT, TOP_LOGPROBS_LIMIT, SamplingParams
from inference.services.session_export import session_id_error
from pantheon_site.errors import InvalidRequest, as_pantheon_error

ROLES = ("system", "user", "assistant", "tool")
MAX_TOKENS_DEFAULT = 1024
MAX_TOKENS_NONPOSITIVE = 512  # what max_tokens <= 0 means
MAX_TOKENS_LIMIT = 1_048_576
LOGIT_BIAS_LIMIT = 100.0
PENALTY_LIMIT = 2.0
MAX_CHOICES = 8  # n is capped here; the response then says n_status "capped_to_8"
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


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


# -- chat completions ---------------------------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class Generation:
    """What both generation routes resolve from GenerationSerializer's fields besides sampling."""

    stop: list[str]
    stream: bool
    include_usage: bool
    n: int
    n_status: str | None
    ignore_eos: bool
    min_tokens: int
    stop_token_ids: list[int]
    skip_special_tokens: bool


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


def generation_from(data: dict[str, Any], max_tokens: int) -> Generation:
    n = max(1, data.get("n") or 1)
    return Generation(
        stop=data["stop"],
        stream=data["stream"],
        include_usage=bool((data.get("stream_options") or {}).get("include_usage")),
        n=min(n, MAX_CHOICES),
        n_status="capped_to_8" if n > MAX_CHOICES else None,
        ignore_eos=data["ignore_eos"],
        min_tokens=min(data["min_tokens"], max_tokens),
        stop_token_ids=list(data["stop_token_ids"]),
        skip_special_tokens=data["skip_special_tokens"],
    )


def chat_request_from(data: dict[str, Any], headers: Any = None) -> ChatRequest:
    """ChatCompletionSerializer's validated data as what the route and the engine need, defaults and clamps applied.
    The session key is the body's session_id, else prompt_cache_key, else promptCacheKey, else the X-Session-Id
    header of `headers` (which is only read, and validated, when no body key is given)."""
    max_tokens = data.get("max_tokens")
    if max_tokens is None:
        max_tokens = data.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = MAX_TOKENS_DEFAULT
    elif max_tokens <= 0:
        max_tokens = MAX_TOKENS_NONPOSITIVE
    tool_plan = plan_tools(data.get("tools") or None, data.get("tool_choice"))
    response_format = plan_response_format(data.get("response_format"), tools_present=tool_plan.tools is not None)
    sampling = sampling_from(
        data, logprobs=data["logprobs"], top_logprobs=data["top_logprobs"], grammar=response_format.grammar
    )
    session_id = data.get("session_id") or data.get("prompt_cache_key") or data.get("promptCacheKey")
    if session_id is None and headers is not None:
        session_id = session_id_from_header(headers)
    max_tokens = min(max_tokens, MAX_TOKENS_LIMIT)
    return ChatRequest(
        model=data.get("model") or "",
        messages=[dict(m) for m in data["messages"]],
        sampling=sampling,
        max_tokens=max_tokens,
        generation=generation_from(data, max_tokens),
        tool_plan=tool_plan,
        response_format=response_format,
        enable_thinking=_enable_thinking(data.get("enable_thinking")),
        reasoning_budget=_first_given(data.get("reasoning_budget"), data.get("max_reasoning_tokens")),
        session_id=session_id,
    )


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
    max_tokens: int
    generation: Generation
    tool_plan: ToolPlan = field(default_factory=ToolPlan)
    response_format: ResponseFormatPlan = field(default_factory=ResponseFormatPlan)
    enable_thinking: bool | None = None
    reasoning_budget: int | None = None  # think tokens before </think> is forced (None: the model's; 0: unbounded)
    session_id: str | None = None  # the session whose KV this conversation keeps between turns

    @property
    def wants_logprobs(self) -> bool:
        return self.sampling.logprobs

    def sampling_for_choice(self, index: int) -> SamplingParams:
        return sampling_for_choice(self.sampling, index)


def parse_chat_request(raw: bytes, headers: Any = None) -> ChatRequest:
    """The body of POST /v1/chat/completions (with the request's `headers`, for X-Session-Id), validated;
    InvalidRequest otherwise."""
    return chat_request_from(validated(ChatCompletionSerializer, parse_json_object(raw)), headers)


# -- legacy completions -------------------------------------------------------------------------------------------

COMPLETION_MAX_TOKENS_DEFAULT = 16  # OpenAI's default for /v1/completions
MAX_PROMPTS = 64  # prompts in one request (each is its own group of n choices)


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
    max_tokens: int
    generation: Generation
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
        max_tokens=max_tokens,
        generation=generation_from(data, max_tokens),
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
