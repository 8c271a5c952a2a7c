"""The shapes of the control plane's answers, as serializers for the OpenAPI document (inference/openapi.py).

The views build their bodies as dicts (completion_bodies.py, services/model_rows.py, services/sessions.py, ...);
these classes only describe them, in the spec's words (pantheon-http-api.md, docs/api/). A key a view leaves out
when it is unknown is `required=False`; a key always sent but possibly null is `allow_null`. schemathesis checks every
answer of a running server against them (tests/inference/test_fuzz_api.py), so a view and its shape cannot part.
"""

from rest_framework import serializers

Text, Int, Float, Bool, Json = (
    serializers.CharField,
    serializers.IntegerField,
    serializers.FloatField,
    serializers.BooleanField,
    serializers.JSONField,
)


# -- GET / and /api/health/detailed --------------------------------------------------------------------------------


class HealthSerializer(serializers.Serializer):
    """What this server is: always 200."""

    service = Text()
    status = Text()
    backend = Text(help_text="cuda or cpu: what this process can run on")
    build = Text(help_text="The commit this tree was built from (-dirty when not clean), or unknown")
    accelerator = Bool()
    dies_visible = Int()


class ModelHealthSerializer(serializers.Serializer):
    name = Text()
    state = Text()
    kernels = serializers.ListField(child=Text(), required=False)
    load_progress = Json(required=False)


class HealthDetailedSerializer(HealthSerializer):
    """GET /'s fields, every served model's name and state, and the sections the apps add (`weights`)."""

    models = ModelHealthSerializer(many=True)
    weights = Json(required=False)


# -- /v1 -----------------------------------------------------------------------------------------------------------


class ModelRowSerializer(serializers.Serializer):
    """One served name (deduplicated)."""

    id = Text()
    object = Text()
    created = Int()
    owned_by = Text()
    max_sessions = Int(required=False)
    max_concurrent = Int(help_text="What the model decodes at once (served, not configured)", required=False)
    context_window = Int(help_text="The effective window; omitted when unknown", required=False)
    tool_choice_required_with_thinking = Bool(required=False)


class ModelListSerializer(serializers.Serializer):
    object = Text()
    backend = Text()
    build = Text()
    data = ModelRowSerializer(many=True)


class CachedTokensSerializer(serializers.Serializer):
    cached_tokens = Int()


class UsageSerializer(serializers.Serializer):
    prompt_tokens = Int()
    completion_tokens = Int()
    total_tokens = Int()
    prompt_tokens_details = CachedTokensSerializer()


class ChatUsageSerializer(UsageSerializer):
    kv_used = Int()
    kv_cap = Int(help_text="The effective window, the same number /v1/models advertises as context_window")
    session_conflict = Bool(required=False)


class ChatMessageSerializer(serializers.Serializer):
    role = Text()
    content = Text(allow_null=True)
    reasoning_content = Text(required=False)
    tool_calls = serializers.ListField(child=Json(), required=False)


class ChatChoiceSerializer(serializers.Serializer):
    index = Int()
    message = ChatMessageSerializer()
    finish_reason = Text(allow_null=True)
    logprobs = Json(required=False)
    tool_call_error = Json(required=False)


class ChatCompletionSerializer(serializers.Serializer):
    """A chat.completion (stream: false)."""

    id = Text()
    object = Text()
    created = Int()
    model = Text()
    n_status = Text(required=False)
    choices = ChatChoiceSerializer(many=True)
    usage = ChatUsageSerializer()
    response_format_status = Text(required=False)


class TextChoiceSerializer(serializers.Serializer):
    index = Int()
    text = Text()
    logprobs = Json(allow_null=True)
    finish_reason = Text(allow_null=True)


class TextCompletionSerializer(serializers.Serializer):
    """A text_completion (stream: false)."""

    id = Text()
    object = Text()
    created = Int()
    model = Text()
    n_status = Text(required=False)
    choices = TextChoiceSerializer(many=True)
    usage = UsageSerializer()


class EmbeddingSerializer(serializers.Serializer):
    object = Text()
    index = Int()
    embedding = Json(help_text="An array of floats, or base64 with encoding_format base64")


class EmbeddingUsageSerializer(serializers.Serializer):
    prompt_tokens = Int()
    total_tokens = Int()


class EmbeddingListSerializer(serializers.Serializer):
    object = Text()
    data = EmbeddingSerializer(many=True)
    model = Text()
    usage = EmbeddingUsageSerializer()


class CreateResponseSerializer(serializers.Serializer):
    """POST /v1/responses: OpenAI's Responses request, run as a chat completion of the same fields."""

    model = Text(allow_blank=True, allow_null=True, required=False)
    input = Json(required=False, help_text="A string, or an array of input items (messages, function calls, outputs)")
    instructions = Text(allow_null=True, allow_blank=True, required=False)
    previous_response_id = Text(allow_null=True, required=False)
    max_output_tokens = Int(allow_null=True, required=False)
    temperature = Float(allow_null=True, required=False)
    top_p = Float(allow_null=True, required=False)
    seed = Int(allow_null=True, required=False)
    stream = Bool(allow_null=True, required=False)
    store = Bool(allow_null=True, required=False)
    tools = serializers.ListField(child=Json(), allow_null=True, required=False)
    tool_choice = Json(allow_null=True, required=False)
    text = Json(allow_null=True, required=False)
    metadata = Json(allow_null=True, required=False)


class ResponseSerializer(serializers.Serializer):
    """A Responses `response` object."""

    id = Text()
    object = Text()
    created_at = Int()
    status = Text()
    model = Text()
    output = serializers.ListField(child=Json())
    usage = Json(allow_null=True)


class ResponseDeletedSerializer(serializers.Serializer):
    id = Text()
    object = Text()
    deleted = Bool()


# -- /admin --------------------------------------------------------------------------------------------------------


class AdminModelSerializer(serializers.Serializer):
    """One live instance (GET /admin/models' row, POST /admin/models/load's answer); keys without a value are left
    out (the engine's details are known once the load finished)."""

    id = Text(help_text="The served name, which a model's replicas share")
    object = Text()
    instance_id = Int(required=False)
    placement = Text(help_text="This replica's key: the served name, or name#2, name#3, ... (docs/replicas.md)")
    state = Text()
    path = Text()
    device = Text()
    dies = serializers.ListField(child=Int(), required=False)
    format = Text(required=False)
    architecture = Text(required=False)
    dtype = Text(required=False)
    vram_bytes = Int(required=False)
    max_sessions = Int(required=False)
    max_concurrent = Int(required=False)
    max_concurrent_configured = Int(required=False)
    context_window = Int(required=False)
    context_window_configured = Int(required=False)
    attention = Text(required=False, help_text="How attention reads the KV cache: gather or flex (docs/attention.md)")
    tensor_parallel = Json(
        required=False, help_text="A split model's ranks, backend, follower_pids and decode (docs/tensor-parallel.md)"
    )
    live = Json(required=False)


class AdminModelListSerializer(serializers.Serializer):
    object = Text()
    data = AdminModelSerializer(many=True)


class UnloadedSerializer(serializers.Serializer):
    unloaded = Text(help_text="The served name unloaded")


class DieSerializer(serializers.Serializer):
    die = Int()
    card = Int()
    model = Text(allow_blank=True)
    n_models = Int()
    vram_budget = Int()
    vram_used = Int()


class DieListSerializer(serializers.Serializer):
    object = Text()
    n_dies = Int()
    data = DieSerializer(many=True)


class SessionRowSerializer(serializers.Serializer):
    session_id = Text()
    conversations = Int()
    tokens = Int()
    idle_seconds = Float()
    last_used_at = Int()
    watched = Bool()
    busy = Bool()
    placement = Text(help_text="The replica that holds the session (docs/replicas.md)")


class SessionListSerializer(serializers.Serializer):
    object = Text()
    model = Text()
    data = SessionRowSerializer(many=True)


class SessionExportSerializer(serializers.Serializer):
    """A session's state; `tokens` must be sent back with `blob_b64` on restore."""

    session_id = Text()
    weights_version = Int()
    n_tok = Int()
    blob_bytes = Int()
    blob_b64 = Text()
    tokens = serializers.ListField(child=Int())


# -- /session ------------------------------------------------------------------------------------------------------


class RestoredSerializer(serializers.Serializer):
    restored = Bool()
    session_id = Text()
    n_tok = Int()


class ReleasedSerializer(serializers.Serializer):
    """Idempotent: an unknown or already freed session is released too."""

    released = Bool()
    session_id = Text()


class EstimateSerializer(serializers.Serializer):
    model = Text(allow_blank=True, help_text='"" when `name` is not served')
    tokens = Int()
    prefill_tok_per_s = Float()
    cold_reprefill_s = Float()
    warm_restore_s = Float()
    blob_bytes_est = Int()
