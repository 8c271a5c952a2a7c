"""The OpenAPI description of the serving control plane's routes (inference/urls.py): /, /v1, /admin and /session.

pantheon_site/openapi.py finds this module when it generates the document (docs/api/openapi.yaml). The request
bodies are the serializers the views validate with, and the fields those read by hand get their JSON Schema from the
extensions below. The answers are inference/api/answer_shapes.py, in the shapes that pantheon-http-api.md and
docs/api/ give. The errors are in the OpenAI envelope, with the statuses of the spec's tables (docs/api/errors.md).
"""

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from inference.api import admin, completions, embeddings, health, openai, responses, sessions
from inference.api import answer_shapes as answers
from inference.api.chat_requests import ChatCompletionSerializer
from inference.api.completion_requests import CompletionSerializer, EmbeddingSerializer
from inference.api.priority import PRIORITIES, PRIORITY_HEADER
from inference.api.serializers import SESSION_HEADER, UnloadModelSerializer
from inference.api.session_requests import SessionEstimateSerializer, SessionRestoreSerializer, SessionTargetSerializer
from inference.engine.contract.params import TOKEN_ID_LIMIT
from inference.services.load_body import LoadModelSerializer
from inference.services.session_export import SESSION_ID_MAX_CHARS
from pantheon_site.openapi import BEARER, BEARER_OR_NONE, RESPONSE_HEADERS, describe, errors

# -- the body fields the views' serializers read by hand ----------------------------------------------------------

STRINGS = {"type": "array", "items": {"type": "string"}}
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": TOKEN_ID_LIMIT - 1}, "minItems": 1}
# A session key: 1 to SESSION_ID_MAX_CHARS printable characters (session_export.session_id_error).
SESSION_ID = {"type": "string", "minLength": 1, "maxLength": SESSION_ID_MAX_CHARS, "pattern": r"^[^\x00-\x1f\x7f]*$"}


class _Field(OpenApiSerializerFieldExtension):
    schema: dict = {}

    def map_serializer_field(self, auto_schema, direction):
        return self.schema


class ContentFieldSchema(_Field):
    target_class = "inference.api.chat_requests.ContentField"
    schema = {
        "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}],
        "nullable": True,
        "description": "A string, an array of content parts (text parts are joined), or null",
    }


class StopFieldSchema(_Field):
    target_class = "inference.api.generation_requests.StopField"
    schema = {"oneOf": [{"type": "string"}, STRINGS], "nullable": True}


class LogitBiasFieldSchema(_Field):
    target_class = "inference.api.generation_requests.LogitBiasField"
    schema = {"type": "object", "additionalProperties": {"type": "number"}, "nullable": True}


class PromptFieldSchema(_Field):
    target_class = "inference.api.generation_requests.PromptField"
    schema = {
        "oneOf": [
            {"type": "string"},
            {**STRINGS, "minItems": 1},
            TOKEN_IDS,
            {"type": "array", "items": TOKEN_IDS, "minItems": 1},
        ]
    }


class SessionIdFieldSchema(_Field):
    target_class = "inference.api.serializers.SessionIdField"
    schema = {**SESSION_ID, "nullable": True}


class TokenListFieldSchema(_Field):
    target_class = "inference.api.session_requests.TokenListField"
    schema = TOKEN_IDS


# -- the routes ---------------------------------------------------------------------------------------------------

JSON_OR_SSE = {
    (200, "application/json"): None,
    (200, "text/event-stream"): OpenApiResponse(str, description="With stream: true, server-sent events"),
}
SESSION_ID_HEADER = OpenApiParameter(
    SESSION_HEADER, SESSION_ID, OpenApiParameter.HEADER, description="The session key when the body names none"
)
PRIORITY = OpenApiParameter(
    PRIORITY_HEADER,
    {"type": "string", "enum": list(PRIORITIES)},
    OpenApiParameter.HEADER,
    description="`batch`: a batch's line (the Batch API sends it), run in the slots interactive requests leave, and "
    "refused with 503 weights_held while a trainer holds the weights; default `interactive`",
)
GENERATION_ERRORS = errors(400, 401, 404, 409, 413, 422, 429, 500, 503)


def _json_or_sse(body) -> dict:
    return {**JSON_OR_SSE, (200, "application/json"): body, **GENERATION_ERRORS}


describe(health.health, responses={200: answers.HealthSerializer}, tags=["health"])
describe(health.health_detailed, responses={200: answers.HealthDetailedSerializer}, tags=["health"])

describe(
    openai.list_models,
    responses={200: answers.ModelListSerializer, **errors(401, 429, 503)},
    parameters=RESPONSE_HEADERS,
    auth=BEARER_OR_NONE,
    tags=["v1"],
)
for view, request, answer in (
    (openai.chat_completions, ChatCompletionSerializer, answers.ChatCompletionSerializer),
    (completions.completions, CompletionSerializer, answers.TextCompletionSerializer),
    (responses.create, answers.CreateResponseSerializer, answers.ResponseSerializer),
):
    describe(
        view,
        request=request,
        responses=_json_or_sse(answer),
        parameters=[SESSION_ID_HEADER, PRIORITY, *RESPONSE_HEADERS],
        auth=BEARER_OR_NONE,
        tags=["v1"],
    )
describe(
    embeddings.embeddings,
    request=EmbeddingSerializer,
    responses={200: answers.EmbeddingListSerializer, **GENERATION_ERRORS},
    parameters=[PRIORITY, *RESPONSE_HEADERS],
    auth=BEARER_OR_NONE,
    tags=["v1"],
)
describe(
    responses.stored,
    method="GET",
    responses={200: answers.ResponseSerializer, **errors(401, 404, 429, 503)},
    parameters=RESPONSE_HEADERS,
    auth=BEARER_OR_NONE,
    tags=["v1"],
)
describe(
    responses.stored,
    method="DELETE",
    responses={200: answers.ResponseDeletedSerializer, **errors(401, 404, 429, 503)},
    parameters=RESPONSE_HEADERS,
    auth=BEARER_OR_NONE,
    tags=["v1"],
)

OPERATOR_ERRORS = errors(401, 403, 429, 500, 503)
describe(
    admin.list_instances,
    responses={200: answers.AdminModelListSerializer, **OPERATOR_ERRORS},
    parameters=RESPONSE_HEADERS,
    auth=BEARER,
    tags=["admin"],
)
describe(
    admin.load,
    request=LoadModelSerializer,
    responses={200: answers.AdminModelSerializer, **errors(400, 401, 403, 404, 409, 413, 429, 500, 503, 507)},
    parameters=RESPONSE_HEADERS,
    auth=BEARER,
    tags=["admin"],
)
describe(
    admin.unload,
    request=UnloadModelSerializer,
    responses={200: answers.UnloadedSerializer, **errors(400, 401, 403, 404, 409, 413, 429, 500, 503)},
    parameters=RESPONSE_HEADERS,
    auth=BEARER,
    tags=["admin"],
)
describe(
    admin.list_dies,
    responses={200: answers.DieListSerializer, **OPERATOR_ERRORS},
    parameters=RESPONSE_HEADERS,
    auth=BEARER,
    tags=["admin"],
)
describe(
    sessions.list_sessions,
    parameters=[OpenApiParameter("name", str, description="The model (absent: the default)"), *RESPONSE_HEADERS],
    responses={200: answers.SessionListSerializer, **errors(400, 401, 403, 404, 429, 500, 503)},
    auth=BEARER,
    tags=["admin"],
)
describe(
    sessions.export,
    request=SessionTargetSerializer,
    responses={
        (200, "application/json"): answers.SessionExportSerializer,
        (200, sessions.RAW_BODY): OpenApiResponse(bytes, description="With Accept: application/octet-stream"),
        **errors(400, 401, 403, 404, 413, 429, 500, 503),
    },
    parameters=RESPONSE_HEADERS,
    auth=BEARER,
    tags=["admin"],
)

SESSION_ERRORS = errors(400, 401, 404, 409, 413, 429, 500, 503)
describe(
    sessions.restore,
    request={"application/json": SessionRestoreSerializer, sessions.RAW_BODY: bytes},
    parameters=[
        OpenApiParameter("name", str, description="The model, with a session file body"),
        OpenApiParameter("session_id", str, description="The session, with a session file body"),
        SESSION_ID_HEADER,
        *RESPONSE_HEADERS,
    ],
    responses={200: answers.RestoredSerializer, **SESSION_ERRORS},
    auth=BEARER_OR_NONE,
    tags=["session"],
)
describe(
    sessions.release,
    request=SessionTargetSerializer,
    parameters=[SESSION_ID_HEADER, *RESPONSE_HEADERS],
    responses={200: answers.ReleasedSerializer, **SESSION_ERRORS},
    auth=BEARER_OR_NONE,
    tags=["session"],
)
describe(
    sessions.estimate,
    parameters=[SessionEstimateSerializer, *RESPONSE_HEADERS],
    responses={200: answers.EstimateSerializer, **SESSION_ERRORS},
    auth=BEARER_OR_NONE,
    tags=["session"],
)
describe(
    sessions.watch,
    parameters=[
        OpenApiParameter("session_id", str, description="The session (else X-Session-Id)"),
        OpenApiParameter("name", str, description="The model (absent: the default)"),
        SESSION_ID_HEADER,
        *RESPONSE_HEADERS,
    ],
    responses={
        (200, "text/event-stream"): OpenApiResponse(
            str, description="`: watch established`, then keep-alive comments while the session is held"
        ),
        **SESSION_ERRORS,
    },
    auth=BEARER_OR_NONE,
    tags=["session"],
)
