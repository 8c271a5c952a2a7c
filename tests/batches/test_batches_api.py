"""The Batch API's routes through Django's test client, for the batches that send no Celery task: bad options are
refused and create nothing; an input that breaks the request rules makes the batch `failed` at once with OpenAI's
`errors` naming each line; listing pages as OpenAI's; cancel; a client token sees only its own batches.
(Valid batches, whose task is sent to Redis, are in test_batches_server.py.)"""

from __future__ import annotations

import pytest
from django.test import override_settings

from batches.models import Batch, BatchLine, BatchStatus
from tests.batches.conftest import auth, create_batch, jsonl, request_line, upload

pytestmark = pytest.mark.django_db(transaction=True)

BATCH_KEYS = {
    "id", "object", "endpoint", "errors", "input_file_id", "completion_window", "status", "output_file_id",
    "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
    "expired_at", "cancelling_at", "cancelled_at", "request_counts", "metadata", "waiting_reason",
}  # fmt: skip


def uploaded(client, *lines, secret=None) -> str:
    response = upload(client, jsonl(*lines), secret)
    assert response.status_code == 200, response.content
    return response.json()["id"]


def failed_with(client, *lines) -> dict:
    batch = create_batch(client, uploaded(client, *lines))
    assert batch.status_code == 200, batch.content
    body = batch.json()
    assert body["status"] == "failed" and isinstance(body["failed_at"], int)
    assert body["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert not BatchLine.objects.filter(batch_id=body["id"]).exists()
    assert body["errors"]["object"] == "list"
    return body


def test_a_url_that_is_not_the_endpoint_fails_the_batch_naming_its_line(client):
    body = failed_with(client, request_line("a"), request_line("b", url="/v1/embeddings"))
    [error] = body["errors"]["data"]
    assert (error["code"], error["param"], error["line"]) == ("url_mismatch", "url", 2)
    assert "/v1/embeddings" in error["message"]
    assert set(body) == BATCH_KEYS


def test_a_missing_custom_id_fails_the_batch_naming_its_line(client):
    line = request_line("x")
    del line["custom_id"]
    body = failed_with(client, request_line("a"), request_line("b"), line)
    assert body["errors"]["data"] == [
        {"code": "missing_required_parameter", "message": "this request has no custom_id", "param": "custom_id",
         "line": 3}
    ]  # fmt: skip


def test_a_duplicate_custom_id_fails_the_batch_naming_both_lines(client):
    body = failed_with(client, request_line("a"), request_line("b"), request_line("a"))
    [error] = body["errors"]["data"]
    assert (error["code"], error["param"], error["line"]) == ("duplicate_custom_id", "custom_id", 3)
    assert "line 1" in error["message"]


def test_every_broken_line_is_listed(client):
    body = failed_with(
        client,
        request_line("a", method="GET"),
        request_line("b", body="text"),
        request_line("c"),
        request_line(7),
    )
    listed = [(e["line"], e["code"], e["param"]) for e in body["errors"]["data"]]
    assert listed == [(1, "invalid_value", "method"), (2, "invalid_value", "body"), (4, "invalid_value", "custom_id")]


def test_an_empty_file_or_too_many_lines_fails_the_batch(client, settings):
    assert failed_with(client)["errors"]["data"][0]["code"] == "empty_file"
    settings.PANTHEON_BATCH_MAX_LINES = 2
    assert failed_with(client, *(request_line(c) for c in "abc"))["errors"]["data"][0]["code"] == "too_many_tasks"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"endpoint": "/v1/responses"}, "endpoint"),
        ({"endpoint": "/v1/moderations"}, "endpoint"),
        ({"endpoint": None}, "endpoint"),
        ({"completion_window": "1d"}, "completion_window"),
        ({"completion_window": "169h"}, "completion_window"),
        ({"completion_window": "0h"}, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": ["k"]}, "metadata"),
        ({"input_file_id": 5}, "input_file_id"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}}, "output_expires_after"),
    ],
)
def test_bad_options_are_refused_naming_the_field_and_create_nothing(client, body, param):
    file_id = uploaded(client, request_line("a"))
    refused = create_batch(client, file_id, **body)
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert not Batch.objects.exists()


def test_an_unknown_input_file_is_not_found(client):
    refused = create_batch(client, "file-nope")
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "not_found"
    assert not Batch.objects.exists()


def test_metadata_and_window_are_kept(client):
    body = failed_with(client, request_line("a", url="/v1/completions"))
    assert body["metadata"] is None and body["completion_window"] == "24h"
    batch = create_batch(client, body["input_file_id"], completion_window="2h", metadata={"job": "eval-7"}).json()
    assert batch["metadata"] == {"job": "eval-7"} and batch["completion_window"] == "2h"
    assert batch["expires_at"] == batch["created_at"] + 7200


def test_listing_pages_newest_first_with_after_and_has_more(client):
    file_id = uploaded(client, request_line("a", url="/v1/embeddings"))
    ids = [create_batch(client, file_id).json()["id"] for _ in range(5)]  # failed batches: no task is sent
    newest_first = list(reversed(ids))
    first = client.get("/v1/batches?limit=2").json()
    assert [b["id"] for b in first["data"]] == newest_first[:2]
    assert (first["object"], first["first_id"], first["last_id"], first["has_more"]) == (
        "list", newest_first[0], newest_first[1], True,
    )  # fmt: skip
    second = client.get(f"/v1/batches?limit=2&after={first['last_id']}").json()
    assert [b["id"] for b in second["data"]] == newest_first[2:4] and second["has_more"] is True
    third = client.get(f"/v1/batches?limit=2&after={second['last_id']}").json()
    assert [b["id"] for b in third["data"]] == newest_first[4:] and third["has_more"] is False
    assert len(client.get("/v1/batches").json()["data"]) == 5  # default limit 20
    for query in ("limit=101", "limit=0", "after=batch_nope"):
        assert client.get(f"/v1/batches?{query}").status_code == 400, query


def test_get_and_cancel(client):
    file_id = uploaded(client, request_line("a"))
    running = Batch.objects.create(
        endpoint="/v1/chat/completions", input_file_id=file_id, status=BatchStatus.IN_PROGRESS,
        expires_at="2030-01-01T00:00Z", waiting_reason="weights_torn",
    )  # fmt: skip
    shown = client.get(f"/v1/batches/{running.id}").json()
    assert shown["status"] == "in_progress" and shown["waiting_reason"] == "weights_torn"
    cancelled = client.post(f"/v1/batches/{running.id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelling" and isinstance(cancelled.json()["cancelling_at"], int)
    assert client.post(f"/v1/batches/{running.id}/cancel").json()["status"] == "cancelling"  # again: no change
    assert client.get("/v1/batches/batch_nope").status_code == 404
    assert client.post("/v1/batches/batch_nope/cancel").status_code == 404

    failed = failed_with(client, request_line("a", url="/v1/completions"))
    refused = client.post(f"/v1/batches/{failed['id']}/cancel")
    assert refused.status_code == 400 and "failed" in refused.json()["error"]["message"]


@override_settings(PANTHEON_REQUIRE_CLIENT_TOKENS=True)
def test_a_client_token_sees_only_its_own_batches_and_an_operator_sees_all(client, tokens):
    bad = request_line("a", url="/v1/completions")
    mine = create_batch(client, uploaded(client, bad, secret=tokens["a"]), tokens["a"]).json()["id"]
    theirs_file = uploaded(client, bad, secret=tokens["b"])
    theirs = create_batch(client, theirs_file, tokens["b"]).json()["id"]
    assert create_batch(client, theirs_file, tokens["a"]).status_code == 404  # nor batch another's file
    assert create_batch(client, theirs_file).status_code == 401
    assert [b["id"] for b in client.get("/v1/batches", **auth(tokens["a"])).json()["data"]] == [mine]
    assert client.get(f"/v1/batches/{theirs}", **auth(tokens["a"])).status_code == 404
    assert client.post(f"/v1/batches/{theirs}/cancel", **auth(tokens["a"])).status_code == 404
    everything = client.get("/v1/batches", **auth(tokens["operator"])).json()["data"]
    assert {b["id"] for b in everything} == {mine, theirs}
    assert client.get(f"/v1/batches/{theirs}", **auth(tokens["operator"])).status_code == 200
    assert Batch.objects.get(pk=mine).owner.label == "a-token"
