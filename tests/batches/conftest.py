"""Fixtures of the Files and Batch API tests: a files folder of the test's own, tokens, and small request helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from pantheon_site.tokens import do_create_token


@pytest.fixture(autouse=True)
def files_dir(settings, tmp_path) -> Path:
    """PANTHEON_FILES_DIR for this test alone, so what a test stores (or must not store) is all that is there."""
    settings.PANTHEON_FILES_DIR = tmp_path / "files"
    return settings.PANTHEON_FILES_DIR


@pytest.fixture
def tokens(db) -> dict[str, str]:
    """Secrets of two client tokens (a, b) and an operator's."""
    return {name: do_create_token(role, f"{name}-token")[1] for name, role in
            (("a", "client"), ("b", "client"), ("operator", "operator"))}  # fmt: skip


def auth(secret: str | None) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}


def request_line(custom_id: str, url: str = "/v1/chat/completions", **overrides) -> dict:
    body = {"model": "stories", "messages": [{"role": "user", "content": f"Say {custom_id}"}], "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **overrides}


def jsonl(*lines: dict | str) -> bytes:
    """A JSONL file of `lines` (a str is written as it is)."""
    return b"".join((line if isinstance(line, str) else json.dumps(line)).encode() + b"\n" for line in lines)


def upload(client, content: bytes, secret: str | None = None, name: str = "input.jsonl", **form):
    """POST /v1/files with `content` as the file part (purpose batch unless `form` says otherwise)."""
    fields = {"file": SimpleUploadedFile(name, content), "purpose": "batch", **form}
    return client.post("/v1/files", fields, **auth(secret))


def create_batch(client, file_id: str, secret: str | None = None, **body):
    fields = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **body}
    return client.post("/v1/batches", json.dumps(fields), content_type="application/json", **auth(secret))
