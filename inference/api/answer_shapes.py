"""The shapes of the control plane's answers, as serializers for the OpenAPI document (inference/openapi.py).

The views build their bodies as dicts (completion_bodies.py, services/model_rows.py, services/sessions.py, ...);
these classes only describe them, in the spec's words (pantheon-http-api.md, docs/api/). A key a view leaves out
when it is unknown is `required=False`; a key always sent but possibly null is `allow_null`. schemathesis checks every
answer of a running server against them (tests/inference/test_fuzz_api.py), so a view and its shape cannot part.
"""

from rest_framework import serializers

S, I, F, B, J = (
    serializers.CharField,
    serializers.IntegerField,
    serializers.FloatField,
    serializers.BooleanField,
    serializers.JSONField,
)


# -- GET / and /api/health/detailed --------------------------------------------------------------------------------


class HealthSerializer(serializers.Serializer):
    """What this server is: always 200."""

    service = S()
    status = S()
    backend = S(help_text="cuda or cpu: what this process can run on")
    build = S(help_text="The commit this tree was built from (-dirty when not clean), or unknown")
    accelerator = B()
    dies_visible = I()


class ModelHealthSerializer(serializers.Serializer):
    name = S()
    state = S()
    kernels = serializers.ListField(child=S(), required=False)
    load_progress = J(required=False)


class HealthDetailedSerializer(HealthSerializer):
    """GET /'s fields, every served model's name and state, and the sections the apps add (`weights`)."""

    models = ModelHealthSerializer(many=True)
    weights = J(required=False)


# -- /v1 -----------------------------------------------------------------------------------------------------------


class ModelRowSerializer(serializers.Serializer):
    """One served name (deduplicated)."""

    id = S()
    object = S()
    created = I()
    owned_by = S()
    max_sessions = I(required=False)
    max_concurrent = I(help_text="What the model decodes at once (served, not configured)", required=False)
    context_window = I(help_text="The effective window; omitted when unknown", required=False)
    tool_choice_required_with_thinking = B(required=False)


class ModelListSerializer(serializers.Serializer):
    object = S()
    backend = S()
    build = S()
    data = ModelRowSerializer(many=True)


class CachedTokensSerializer(serializers.Serializer):
    cached_tokens = I()


class UsageSerializer(serializers.Serializer):
    prompt_tokens = I()
    completion_tokens = I()
    total_tokens = I()
    prompt_tokens_details = CachedTokensSerializer()


class ChatUsageSerializer(UsageSerializer):
    kv_used = I()
    kv_cap = I(help_text="The effective window, the same number /v1/models advertises as context_window")
    session_conflict = B(required=False)


class ChatMessageSerializer(serializers.Serializer):
    role = S()
    content = S(allow_null=True)
    reasoning_content = S(required=False)
    tool_calls = serializers.ListField(child=J(), required=False)


class ChatChoiceSerializer(serializers.Serializer):
    index = I()
    message = ChatMessageSerializer()
    finish_reason = S(allow_null=True)
    logprobs = J(required=False)
    tool_call_error = J(required=False)


class ChatCompletionSerializer(serializers.Serializer):
    """A chat.completion (stream: false)."""

    id = S()
    object = S()
    created = I()
    model = S()
    n_status = S(required=False)
    choices = ChatChoiceSerializer(many=True)
    usage = ChatUsageSerializer()
    response_format_status = S(required=False)


class TextChoiceSerializer(serializers.Serializer):
    index = I()
    text = S()
    logprobs = J(allow_null=True)
    finish_reason = S(allow_null=True)


class TextCompletionSerializer(serializers.Serializer):
    """A text_completion (stream: false)."""

    id = S()
    object = S()
    created = I()
    model = S()
    n_status = S(required=False)
    choices = TextChoiceSerializer(many=True)
    usage = UsageSerializer()


class EmbeddingSerializer(serializers.Serializer):
    object = S()
    index = I()
    embedding = J(help_text="An array of floats, or base64 with encoding_format base64")


class EmbeddingUsageSerializer(serializers.Serializer):
    prompt_tokens = I()
    total_tokens = I()


class EmbeddingListSerializer(serializers.Serializer):
    object = S()
    data = EmbeddingSerializer(many=True)
    model = S()
    usage = EmbeddingUsageSerializer()


class ResponseRequestSerializer(serializers.Serializer):
    """POST /v1/responses: OpenAI's Responses request, run as a chat completion of the same fields."""

    model = S(allow_blank=True, allow_null=True, required=False)
    input = J(help_text="A string, or an array of input items (messages, function calls and outputs)", required=False)
    instructions = S(allow_null=True, allow_blank=True, required=False)
    previous_response_id = S(allow_null=True, required=False)
    max_output_tokens = I(allow_null=True, required=False)
    temperature = F(allow_null=True, required=False)
    top_p = F(allow_null=True, required=False)
    seed = I(allow_null=True, required=False)
    stream = B(allow_null=True, required=False)
    store = B(allow_null=True, required=False)
    tools = serializers.ListField(child=J(), allow_null=True, required=False)
    tool_choice = J(allow_null=True, required=False)
    text = J(allow_null=True, required=False)
    metadata = J(allow_null=True, required=False)


class ResponseSerializer(serializers.Serializer):
    """A Responses `response` object."""

    id = S()
    object = S()
    created_at = I()
    status = S()
    model = S()
    output = serializers.ListField(child=J())
    usage = J(allow_null=True)


class ResponseDeletedSerializer(serializers.Serializer):
    id = S()
    object = S()
    deleted = B()


# -- /admin --------------------------------------------------------------------------------------------------------


class AdminModelSerializer(serializers.Serializer):
    """One live instance (GET /admin/models' row, POST /admin/models/load's answer); keys without a value are left
    out (the engine's details are known once the load finished)."""

    id = S()
    object = S()
    instance_id = I(required=False)
    state = S()
    path = S()
    device = S()
    dies = serializers.ListField(child=I(), required=False)
    format = S(required=False)
    architecture = S(required=False)
    dtype = S(required=False)
    vram_bytes = I(required=False)
    max_sessions = I(required=False)
    max_concurrent = I(required=False)
    max_concurrent_configured = I(required=False)
    context_window = I(required=False)
    context_window_configured = I(required=False)
    live = J(required=False)


class AdminModelListSerializer(serializers.Serializer):
    object = S()
    data = AdminModelSerializer(many=True)


class UnloadedSerializer(serializers.Serializer):
    unloaded = S(help_text="The served name unloaded")


class DieSerializer(serializers.Serializer):
    die = I()
    card = I()
    model = S(allow_blank=True)
    n_models = I()
    vram_budget = I()
    vram_used = I()


class DieListSerializer(serializers.Serializer):
    object = S()
    n_dies = I()
    data = DieSerializer(many=True)


class SessionRowSerializer(serializers.Serializer):
    session_id = S()
    conversations = I()
    tokens = I()
    idle_seconds = F()
    last_used_at = I()
    watched = B()
    busy = B()


class SessionListSerializer(serializers.Serializer):
    object = S()
    model = S()
    data = SessionRowSerializer(many=True)


class SessionExportSerializer(serializers.Serializer):
    """A session's state; `tokens` must be sent back with `blob_b64` on restore."""

    session_id = S()
    weights_version = I()
    n_tok = I()
    blob_bytes = I()
    blob_b64 = S()
    tokens = serializers.ListField(child=I())


# -- /session ------------------------------------------------------------------------------------------------------


class RestoredSerializer(serializers.Serializer):
    restored = B()
    session_id = S()
    n_tok = I()


class ReleasedSerializer(serializers.Serializer):
    """Idempotent: an unknown or already freed session is released too."""

    released = B()
    session_id = S()


class EstimateSerializer(serializers.Serializer):
    model = S(allow_blank=True, help_text='"" when `name` is not served')
    tokens = I()
    prefill_tok_per_s = F()
    cold_reprefill_s = F()
    warm_restore_s = F()
    blob_bytes_est = I()
