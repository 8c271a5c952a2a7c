"""Fixtures of the batch runner's tests: the module's server (tests/inference/conftest.py) with stories260K loaded
twice (so a line naming neither is an unknown model), and Celery workers beside it on this branch's Redis database."""

from __future__ import annotations

import pytest
import redis

from tests.batches.batch_rows import BATCH_REDIS_URL, CeleryWorker, worker_env
from tests.inference.conftest import api, operator_token, serving_db, start_server  # noqa: F401

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
