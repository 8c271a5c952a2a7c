"""The OpenAPI description of the Files and Batch API routes (batches/urls.py), found by pantheon_site/openapi.py when
it generates the document. The answers are OpenAI's file, batch and list objects (batches/wire.py); the errors are in
the OpenAI envelope, with `param` naming the field at fault (docs/api/batches.md)."""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from batches import batch_create, files, views
from batches.models import BatchStatus
from pantheon_site.openapi import BEARER_OR_NONE, RESPONSE_HEADERS, describe, errors

TIME = {"allow_null": True, "help_text": "Unix seconds"}


class FileObjectSerializer(serializers.Serializer):
    """OpenAI's file object."""

    id = serializers.CharField()
    object = serializers.CharField(help_text="file")
    bytes = serializers.IntegerField(min_value=0)
    created_at = serializers.IntegerField(help_text="Unix seconds")
    expires_at = serializers.IntegerField(**TIME)
    filename = serializers.CharField()
    purpose = serializers.CharField(help_text="batch (an upload) or batch_output (a batch's output or error file)")
    status = serializers.CharField(help_text="Deprecated by OpenAI; always processed")
    status_details = serializers.CharField(allow_null=True)


class ListPageSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="list")
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class FileListSerializer(ListPageSerializer):
    data = FileObjectSerializer(many=True)


class FileDeletedSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(help_text="file")
    deleted = serializers.BooleanField()


class FileUploadSerializer(serializers.Serializer):
    """POST /v1/files's multipart form."""

    file = serializers.FileField(help_text="A JSONL file: every non-blank line one JSON object")
    purpose = serializers.ChoiceField(list(files.UPLOAD_PURPOSES))
    expires_after_anchor = serializers.ChoiceField(["created_at"], required=False)
    expires_after_seconds = serializers.IntegerField(
        required=False, min_value=files.EXPIRY_SECONDS[0], max_value=files.EXPIRY_SECONDS[1]
    )

    def get_fields(self):
        """The form's field names as OpenAI spells them (expires_after[anchor], expires_after[seconds])."""
        fields = super().get_fields()
        for name in ("anchor", "seconds"):
            fields[f"expires_after[{name}]"] = fields.pop(f"expires_after_{name}")
        return fields


class BatchErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    line = serializers.IntegerField(allow_null=True, help_text="The input file's line (1-based), or null")


class BatchErrorsSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="list")
    data = BatchErrorSerializer(many=True)


class RequestCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField(min_value=0)
    completed = serializers.IntegerField(min_value=0)
    failed = serializers.IntegerField(min_value=0)


def _metadata_value() -> serializers.CharField:
    return serializers.CharField(max_length=batch_create.METADATA_VALUE_MAX_CHARS)


class BatchObjectSerializer(serializers.Serializer):
    """OpenAI's batch object, plus waiting_reason."""

    id = serializers.CharField()
    object = serializers.CharField(help_text="batch")
    endpoint = serializers.ChoiceField(list(batch_create.ENDPOINTS))
    errors = BatchErrorsSerializer(allow_null=True)
    input_file_id = serializers.CharField()
    completion_window = serializers.CharField()
    status = serializers.ChoiceField(BatchStatus.values)
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField(help_text="Unix seconds")
    in_progress_at = serializers.IntegerField(**TIME)
    expires_at = serializers.IntegerField(**TIME)
    finalizing_at = serializers.IntegerField(**TIME)
    completed_at = serializers.IntegerField(**TIME)
    failed_at = serializers.IntegerField(**TIME)
    expired_at = serializers.IntegerField(**TIME)
    cancelling_at = serializers.IntegerField(**TIME)
    cancelled_at = serializers.IntegerField(**TIME)
    request_counts = RequestCountsSerializer()
    metadata = serializers.DictField(child=_metadata_value(), allow_null=True)
    waiting_reason = serializers.CharField(
        allow_null=True,
        help_text="Why no line runs now (weights_torn, weights_held, model_reloading, server_busy, "
        "server_unavailable); null while lines run",
    )


class BatchListSerializer(ListPageSerializer):
    data = BatchObjectSerializer(many=True)


class BatchCreateSerializer(serializers.Serializer):
    input_file_id = serializers.CharField(help_text="A file uploaded with purpose batch")
    endpoint = serializers.ChoiceField(list(batch_create.ENDPOINTS))
    completion_window = serializers.RegexField(
        batch_create.WINDOW.pattern,
        required=False,
        help_text=f"Whole hours, 1h to {batch_create.WINDOW_MAX_HOURS}h (default 24h, OpenAI's only value)",
    )
    metadata = serializers.DictField(
        child=_metadata_value(), allow_null=True, required=False, help_text="At most 16 pairs, keys up to 64 characters"
    )


def _page_parameters(default: int, most: int) -> list[OpenApiParameter]:
    return [
        OpenApiParameter("after", str, description="The id after which the page starts (a previous page's last_id)"),
        OpenApiParameter("limit", int, description=f"1 to {most} (default {default})"),
    ]


V1 = {"auth": BEARER_OR_NONE, "tags": ["files and batches"]}
READ_ERRORS = errors(401, 404, 429, 503)

describe(
    views.file_collection,
    "POST",
    operation_id="files_upload",
    description="Uploads a batch input file (multipart); every non-blank line must be a JSON object.",
    request={"multipart/form-data": FileUploadSerializer},
    responses={
        200: FileObjectSerializer,
        **errors(400, 401, 413, 429, 503, notes={413: "The file is larger than PANTHEON_FILE_MAX_BYTES"}),
    },
    parameters=RESPONSE_HEADERS,
    **V1,
)
describe(
    views.file_collection,
    "GET",
    operation_id="files_list",
    description="The files the caller may see, newest first unless order=asc.",
    parameters=[
        OpenApiParameter("purpose", str, description="Only files of this purpose"),
        *_page_parameters(*views.FILE_PAGE),
        OpenApiParameter("order", str, enum=["asc", "desc"], description="By creation time (default desc)"),
        *RESPONSE_HEADERS,
    ],
    responses={200: FileListSerializer, **errors(400, 401, 429, 503)},
    **V1,
)
describe(
    views.file_item, "GET", responses={200: FileObjectSerializer, **READ_ERRORS}, parameters=RESPONSE_HEADERS, **V1
)
describe(
    views.file_item,
    "DELETE",
    operation_id="files_delete",
    description="Deletes a file (refused while a batch that has not ended reads it).",
    responses={
        200: FileDeletedSerializer,
        **errors(400, 401, 404, 429, 503, notes={400: "The file is the input of a batch that has not ended"}),
    },
    parameters=RESPONSE_HEADERS,
    **V1,
)
describe(
    views.file_content,
    operation_id="files_content",
    responses={(200, "application/jsonl"): OpenApiResponse(bytes, description="The file's bytes"), **READ_ERRORS},
    parameters=RESPONSE_HEADERS,
    **V1,
)
describe(
    views.batch_collection,
    "POST",
    operation_id="batches_create",
    description="Creates a batch: validating (its task sent), or failed with errors when its input breaks the rules.",
    request=BatchCreateSerializer,
    responses={
        200: OpenApiResponse(BatchObjectSerializer, description="validating, or failed with errors for a bad input"),
        **errors(400, 401, 404, 413, 429, 503, notes={404: "No such input file"}),
    },
    parameters=RESPONSE_HEADERS,
    **V1,
)
describe(
    views.batch_collection,
    "GET",
    operation_id="batches_list",
    description="The batches the caller may see, newest first.",
    parameters=[*_page_parameters(*views.BATCH_PAGE), *RESPONSE_HEADERS],
    responses={200: BatchListSerializer, **errors(400, 401, 429, 503)},
    **V1,
)
describe(
    views.batch_item,
    operation_id="batches_retrieve",
    responses={200: BatchObjectSerializer, **READ_ERRORS},
    parameters=RESPONSE_HEADERS,
    **V1,
)
describe(
    views.batch_cancel,
    operation_id="batches_cancel",
    request=None,
    responses={
        200: BatchObjectSerializer,
        **errors(400, 401, 404, 429, 503, notes={400: "The batch already ended"}),
    },
    parameters=RESPONSE_HEADERS,
    **V1,
)
