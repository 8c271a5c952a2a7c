"""The OpenAPI description of the /api/weights routes (weights/urls.py), found by pantheon_site/openapi.py when it
generates the document.

Every answer is in the management envelope: `{"success": true, "data": ..., "error": null}`, and every refusal
`{"success": false, "data": null, "error": {"code", "message", "reason", "details"}}` with the status of
weights/errors.py's table (401 WEIGHTS_UNAUTHORIZED with WWW-Authenticate, 503 with Retry-After). `data` is described
by its keys as the weights spec lists them (weights-attach-barrier.md, docs/weights.md); the attach answer's full
shape is docs/schemas/millm-weights-api-v1.json.
"""

from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers

from pantheon_site.openapi import BEARER, RESPONSE_HEADERS, describe, errors, management_envelope
from weights import views

ATTACHMENT = OpenApiParameter(
    views.ATTACHMENT_HEADER, str, OpenApiParameter.HEADER, description="The id POST /api/weights/attach returned"
)
MODEL_QUERY = OpenApiParameter("model", str, description="The served model (absent: the default)")
MODEL_FIELD = {"model": serializers.CharField(required=False, allow_null=True, help_text="absent: the default")}
CHECKPOINT = serializers.JSONField(required=False, help_text="A checkpoint's qualified name, id or directory")
GATED_ERRORS = errors(400, 401, 403, 404, 409, 413, 429, 500, 503, management=True)
OPEN_ERRORS = errors(400, 404, 500, 503, management=True)


def _data(name: str, help_text: str):
    return management_envelope(name, serializers.DictField(help_text=help_text))


HOLDER_CALLS = {
    views.attach: (
        "attachment_id (once), model, weights_state, steps_since_load, heartbeat, producer, storages, parameters, "
        "release, config",
        {},
    ),
    views.detach: ("weights_state, barrier", {}),
    views.heartbeat: ("attachment_state, timeout_s, interval_hint_s, weights_state", {}),
    views.quiesce: ("held_requests, held_batch_chunks, weights_state, quiesced_at, hold_deadline", {}),
    views.resume: ("barrier, weights_state", {}),
    views.commit_begin: ("weights_state, began_at, watchdog_ms", {}),
    views.commit_end: ("weights_state, steps_since_load, commit_ms, overran", {}),
    views.clear_stale: ("cleared {role, label, stale_since}, weights_state, barrier", {}),
    views.save: (
        "the checkpoint saved: its name, path, sha256 and step",
        {
            "run_id": serializers.CharField(required=False, help_text="1-100 letters, digits, '.', '_' or '-'"),
            "step": serializers.IntegerField(required=False, min_value=0),
        },
    ),
    views.load: (
        "the weights now served",
        {"checkpoint": CHECKPOINT, "model_id": serializers.IntegerField(required=False, help_text="A catalogue row")},
    ),
}

for view, (answer, fields) in HOLDER_CALLS.items():
    name = view.__name__.title().replace("_", "")
    describe(
        view,
        request=inline_serializer(f"Weights{name}", {**MODEL_FIELD, **fields}),
        parameters=[ATTACHMENT, MODEL_QUERY, *RESPONSE_HEADERS],
        responses={200: _data(f"Weights{name}", answer), **GATED_ERRORS},
        auth=BEARER,
        tags=["weights"],
    )

describe(
    views.status,
    parameters=[MODEL_QUERY, *RESPONSE_HEADERS],
    responses={
        200: _data("WeightsStatus", "attached, attachment, barrier, weights_state, resident_model, ...; `models`"),
        **OPEN_ERRORS,
    },
    tags=["weights"],
)
describe(
    views.lineage,
    parameters=[MODEL_QUERY, *RESPONSE_HEADERS],
    responses={
        200: management_envelope(
            "WeightsLineage",
            inline_serializer("Lineage", {"chain": serializers.ListField(child=serializers.DictField())}),
        ),
        **OPEN_ERRORS,
    },
    tags=["weights"],
)
describe(
    views.checkpoints,
    parameters=RESPONSE_HEADERS,
    responses={
        200: management_envelope(
            "WeightsCheckpoints",
            inline_serializer("CheckpointList", {"checkpoints": serializers.ListField(child=serializers.DictField())}),
        ),
        **OPEN_ERRORS,
    },
    tags=["weights"],
)
