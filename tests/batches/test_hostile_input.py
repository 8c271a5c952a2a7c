"""Ids, names and strings the database cannot hold (a NUL, a lone surrogate from a JSON escape) are answered as any
other bad input, never as a server error: an id that names nothing (404), a refused option (400), a failed line."""

from __future__ import annotations

import json

import pytest

from batches.models import Batch
from tests.batches.conftest import create_batch, jsonl, request_line, upload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", "/v1/files/a%00b", 404),
        ("get", "/v1/files/a%00b/content", 404),
        ("delete", "/v1/files/a%00b", 404),
        ("get", "/v1/batches/a%00b", 404),
        ("post", "/v1/batches/a%00b/cancel", 404),
        ("get", "/v1/files?after=a%00b", 400),
        ("get", "/v1/files?purpose=a%00b", 400),
        ("get", "/v1/batches?after=%00", 400),
    ],
)
def test_a_nul_in_an_id_or_a_query_is_not_found_or_refused(client, method, path, status):
    assert getattr(client, method)(path).status_code == status


def test_metadata_or_an_input_file_id_the_database_cannot_hold_is_refused(client):
    file_id = upload(client, jsonl(request_line("a"))).json()["id"]
    assert create_batch(client, file_id, metadata={"k": "v\x00"}).status_code == 400
    surrogate = json.dumps({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "metadata": {"k": "\ud800"}})
    assert client.post("/v1/batches", surrogate, content_type="application/json").status_code == 400
    assert create_batch(client, "file-\x00").status_code == 404
    assert not Batch.objects.exists()


@pytest.mark.parametrize("custom_id", ["a\x00", "\ud800"])  # JSON writes them as \u0000 and \ud800
def test_a_custom_id_the_database_cannot_hold_fails_its_line(client, custom_id):
    file_id = upload(client, json.dumps(request_line(custom_id)).encode() + b"\n").json()["id"]
    batch = create_batch(client, file_id).json()
    assert batch["status"] == "failed"
    assert [(e["code"], e["param"], e["line"]) for e in batch["errors"]["data"]] == [("invalid_value", "custom_id", 1)]
