"""Fixtures of the batch tests: a files folder of the test's own, tokens and small request helpers (the Files and
Batch routes' tests); the module's server (tests/inference/conftest.py) with stories260K loaded twice (so a line
naming neither is an unknown model), and Celery workers beside it on their own Redis database (the runner's tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from django.core.files.uploadedfile import SimpleUploadedFile

from pantheon_site.tokens import do_create_token
from tests.batches.runner_batches import BATCH_REDIS_URL, CeleryWorker, worker_env
from tests.inference.conftest import api, operator_token, serving_db, start_server  # noqa: F401


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


MODELS = ("stories", "stories-gguf")


def load_models(client, stories_hf_dir, stories_gguf_path) -> None:
    for name, path in zip(MODELS, (stories_hf_dir, stories_gguf_path), strict=True):
        loaded = client.post("/admin/models/load", json={"path": str(path), "name": name})
        assert loaded.status_code == 200, loaded.text


@pytest.fixture(scope="module")
def server(start_server):  # noqa: F811
    return start_server()


@pytest.fixture
def models(api, stories_hf_dir, stories_gguf_path):  # noqa: F811
    load_models(api, stories_hf_dir, stories_gguf_path)
    return MODELS


@pytest.fixture
def start_worker(server, tmp_path):
    """`start_worker(**env)` starts a Celery worker beside the module's server (its queue emptied first, so no
    message of an earlier test reaches it); every worker is killed at the end of the test."""
    redis.Redis.from_url(BATCH_REDIS_URL).flushdb()
    workers: list[CeleryWorker] = []

    def start(**env: str) -> CeleryWorker:
        worker = CeleryWorker(worker_env(server.env, **env), tmp_path / f"celery-{len(workers)}.log").start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill()
