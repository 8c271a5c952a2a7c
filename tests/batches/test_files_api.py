"""The Files API (batches/views.py, batches/files.py) through Django's test client: an upload is checked line by line
and stored whole or not at all, listed and read back, deleted unless a running batch reads it; a client token sees
only its own files."""

from __future__ import annotations

import asyncio
import io
import threading

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from batches import views
from batches.models import Batch, BatchStatus, StoredFile
from tests.batches.conftest import auth, jsonl, request_line, upload

pytestmark = pytest.mark.django_db(transaction=True)  # commits: a deleted file's content goes on commit

THREE = jsonl(request_line("a"), request_line("b"), request_line("c"))


def streamed(response) -> bytes:
    """The body of a streaming response (the content route streams from an async iterator)."""

    async def collect():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def stored_names(files_dir) -> list[str]:
    """Every name in the files folder, temporary ones included."""
    return sorted(p.name for p in files_dir.iterdir()) if files_dir.exists() else []


def test_an_upload_is_stored_listed_read_back_and_deleted(client, files_dir):
    created = upload(client, THREE, name="three.jsonl")
    assert created.status_code == 200, created.content
    body = created.json()
    assert body["object"] == "file" and body["id"].startswith("file-")
    assert body["bytes"] == len(THREE) and body["filename"] == "three.jsonl" and body["purpose"] == "batch"
    assert body["status"] == "processed" and body["expires_at"] is None and isinstance(body["created_at"], int)
    assert StoredFile.objects.get(pk=body["id"]).line_count == 3
    assert stored_names(files_dir) == [body["id"]]

    assert client.get(f"/v1/files/{body['id']}").json() == body
    listed = client.get("/v1/files").json()
    assert listed == {
        "object": "list",
        "data": [body],
        "first_id": body["id"],
        "last_id": body["id"],
        "has_more": False,
    }
    content = client.get(f"/v1/files/{body['id']}/content")
    assert content.status_code == 200 and content["Content-Type"] == "application/jsonl"
    assert streamed(content) == THREE

    deleted = client.delete(f"/v1/files/{body['id']}")
    assert deleted.json() == {"id": body["id"], "object": "file", "deleted": True}
    assert not StoredFile.objects.exists() and stored_names(files_dir) == []
    for path in (f"/v1/files/{body['id']}", f"/v1/files/{body['id']}/content"):
        assert client.get(path).json()["error"]["type"] == "not_found"
    assert client.delete(f"/v1/files/{body['id']}").status_code == 404


@pytest.mark.parametrize(
    ("bad_line", "why"),
    [
        ('{"custom_id": "b", "method": "POST"', "not valid JSON"),
        ("[1, 2]", "a JSON array, not an object"),
        ('{"x": NaN}', "NaN is not JSON"),
        (b"\xff\xfe".decode("latin-1"), "not UTF-8"),
    ],
)
def test_a_malformed_line_is_refused_with_its_number_and_nothing_is_stored(client, files_dir, bad_line, why):
    content = jsonl(request_line("a"), "", request_line("b")) + bad_line.encode("latin-1") + b"\n"
    refused = upload(client, content)
    assert refused.status_code == 400
    error = refused.json()["error"]
    # line 4: the blank line 2 counts, as an editor counts it
    assert error["message"].startswith("line 4 of the file is not a JSON object") and why in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "file", "invalid_json_line")
    assert not StoredFile.objects.exists() and stored_names(files_dir) == []


def test_blank_lines_and_crlf_are_accepted_and_not_counted(client):
    created = upload(client, b'\r\n{"a": 1}\r\n\n   \n{"b": 2}')
    assert created.status_code == 200, created.content
    assert StoredFile.objects.get().line_count == 2


def test_a_file_over_the_size_limit_is_refused_and_nothing_is_stored(client, settings, files_dir):
    settings.PANTHEON_FILE_MAX_BYTES = len(THREE) - 1
    refused = upload(client, THREE)
    assert refused.status_code == 413
    assert "PANTHEON_FILE_MAX_BYTES" in refused.json()["error"]["message"]
    assert not StoredFile.objects.exists() and stored_names(files_dir) == []
    settings.PANTHEON_FILE_MAX_BYTES = len(THREE)
    assert upload(client, THREE).status_code == 200


@pytest.mark.parametrize(
    ("form", "param"),
    [
        ({"purpose": "fine-tune"}, "purpose"),
        ({"purpose": "batch_output"}, "purpose"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "59"}, "expires_after[seconds]"),
        ({"expires_after[anchor]": "now", "expires_after[seconds]": "3600"}, "expires_after[anchor]"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "soon"}, "expires_after[seconds]"),
    ],
)
def test_bad_upload_options_are_refused_naming_the_field(client, files_dir, form, param):
    refused = upload(client, THREE, **form)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    assert not StoredFile.objects.exists() and stored_names(files_dir) == []


def test_a_body_without_a_file_part_is_refused(client):
    refused = client.post("/v1/files", {"purpose": "batch"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "file"
    assert client.post("/v1/files", b"{}", content_type="application/json").status_code == 400


def test_expires_after_sets_the_expiry(client):
    body = upload(client, THREE, **{"expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"}).json()
    assert body["expires_at"] == body["created_at"] + 7200


def test_listing_pages_with_after_limit_and_order(client):
    ids = [upload(client, THREE, name=f"f{i}.jsonl").json()["id"] for i in range(5)]  # oldest first
    newest_first = list(reversed(ids))
    first = client.get("/v1/files?limit=2").json()
    assert [f["id"] for f in first["data"]] == newest_first[:2] and first["has_more"] is True
    assert first["last_id"] == newest_first[1]
    rest = client.get(f"/v1/files?limit=2&after={first['last_id']}").json()
    assert [f["id"] for f in rest["data"]] == newest_first[2:4] and rest["has_more"] is True
    last = client.get(f"/v1/files?after={rest['last_id']}").json()
    assert [f["id"] for f in last["data"]] == newest_first[4:] and last["has_more"] is False
    oldest = client.get("/v1/files?order=asc&limit=3").json()
    assert [f["id"] for f in oldest["data"]] == ids[:3]
    assert client.get("/v1/files?purpose=batch_output").json()["data"] == []
    for query, param in (("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order"), ("after=file-x", "after")):
        refused = client.get(f"/v1/files?{query}")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, query


def test_a_file_a_running_batch_reads_cannot_be_deleted_until_the_batch_ends(client, files_dir):
    file_id = upload(client, THREE).json()["id"]
    batch = Batch.objects.create(endpoint="/v1/chat/completions", input_file_id=file_id, expires_at="2030-01-01T00:00Z")
    refused = client.delete(f"/v1/files/{file_id}")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "file_in_use" and batch.id in error["message"]
    assert StoredFile.objects.filter(pk=file_id).exists() and stored_names(files_dir) == [file_id]

    Batch.objects.filter(pk=batch.id).update(status=BatchStatus.COMPLETED)
    assert client.delete(f"/v1/files/{file_id}").status_code == 200
    assert Batch.objects.get(pk=batch.id).input_file_id == file_id  # the ended batch keeps the id
    assert client.get(f"/v1/batches/{batch.id}").json()["input_file_id"] == file_id


@override_settings(PANTHEON_REQUIRE_CLIENT_TOKENS=True)
def test_a_client_token_sees_only_its_own_files_and_an_operator_sees_all(client, tokens):
    assert upload(client, THREE).status_code == 401
    mine = upload(client, THREE, tokens["a"]).json()["id"]
    theirs = upload(client, THREE, tokens["b"]).json()["id"]
    assert [f["id"] for f in client.get("/v1/files", **auth(tokens["a"])).json()["data"]] == [mine]
    for path in (f"/v1/files/{theirs}", f"/v1/files/{theirs}/content"):
        assert client.get(path, **auth(tokens["a"])).status_code == 404
    assert client.delete(f"/v1/files/{theirs}", **auth(tokens["a"])).status_code == 404
    assert client.get(f"/v1/files?after={theirs}", **auth(tokens["a"])).status_code == 400  # no probing by cursor
    everything = client.get("/v1/files", **auth(tokens["operator"])).json()["data"]
    assert {f["id"] for f in everything} == {mine, theirs}
    assert client.get(f"/v1/files/{theirs}/content", **auth(tokens["operator"])).status_code == 200
    assert client.delete(f"/v1/files/{theirs}", **auth(tokens["operator"])).status_code == 200
    assert StoredFile.objects.get(pk=mine).owner.label == "a-token"


async def until(condition, timeout: float = 60.0) -> None:
    """Polls `condition` (the event loop runs meanwhile); fails the test if it is still false after `timeout` s."""
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"condition not met within {timeout} s")


async def test_an_upload_whose_request_is_cancelled_while_it_is_checked_leaves_no_file(files_dir):
    """The client went away while its file was being checked: the check's thread ends, and its file is removed."""
    release = threading.Event()

    class SlowFile(io.BytesIO):
        def __iter__(self):
            release.wait(60)
            return super().__iter__()

    staging = asyncio.ensure_future(views._stage(SlowFile(THREE)))
    await until(lambda: stored_names(files_dir))  # the thread has made its temporary file and is reading
    [temporary] = stored_names(files_dir)
    assert temporary.startswith(".upload-")
    staging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await staging
    release.set()
    await until(lambda: not stored_names(files_dir))
