"""The periodic work runs on a real Celery beat and worker pair over Redis: with short intervals, a worker row a
dead serve left is marked dead and an expired file is pruned, with nothing calling the services but beat."""

import contextlib
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from batches.models import FilePurpose, StoredFile
from inference.models import Worker, WorkerState
from tests.inference.serving import REPO_ROOT, serving_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = "redis://127.0.0.1:6379/3"


@contextlib.contextmanager
def celery_pair(tmp_path):
    """`celery -A pantheon_site worker` and `beat` on this test's database and Redis DB 3, every task each second."""
    env = serving_env(
        tmp_path,
        REDIS_URL=REDIS_URL,
        PANTHEON_FILES_DIR=str(tmp_path / "files"),
        PANTHEON_STALE_WORKER_INTERVAL_S="1",
        PANTHEON_FILE_PRUNE_INTERVAL_S="1",
        PANTHEON_TOKEN_EXPIRY_INTERVAL_S="1",
        PANTHEON_AUDIT_PRUNE_INTERVAL_S="1",
    )
    celery = [sys.executable, "-m", "celery", "-A", "pantheon_site"]
    processes = [
        subprocess.Popen([*celery, "worker", "--pool", "solo", "--loglevel", "INFO"], cwd=REPO_ROOT, env=env,
                         stdout=(tmp_path / "worker.log").open("wb"), stderr=subprocess.STDOUT),
        subprocess.Popen([*celery, "beat", "--loglevel", "INFO"], cwd=REPO_ROOT, env=env,
                         stdout=(tmp_path / "beat.log").open("wb"), stderr=subprocess.STDOUT),
    ]  # fmt: skip
    try:
        yield
    finally:
        _stop(processes)


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_beat_marks_a_dead_serves_worker_and_prunes_an_expired_file(tmp_path):
    stale = Worker.objects.create(device="cuda:0", state=WorkerState.READY, pid=4242)
    Worker.objects.filter(pk=stale.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    (tmp_path / "files").mkdir()
    expired = StoredFile.objects.create(filename="in.jsonl", purpose=FilePurpose.BATCH, bytes=3,
                                        expires_at=timezone.now() - timedelta(minutes=1))  # fmt: skip
    (tmp_path / "files" / expired.id).write_bytes(b"{}\n")
    kept = StoredFile.objects.create(filename="in.jsonl", purpose=FilePurpose.BATCH, bytes=3)
    (tmp_path / "files" / kept.id).write_bytes(b"{}\n")

    with celery_pair(tmp_path):
        wait_for(lambda: Worker.objects.get(pk=stale.pk).state == WorkerState.DEAD, timeout=120)
        wait_for(lambda: not StoredFile.objects.filter(pk=expired.pk).exists(), timeout=120)
        wait_for(lambda: not (tmp_path / "files" / expired.id).exists(), timeout=30)
    assert StoredFile.objects.filter(pk=kept.pk).exists() and (tmp_path / "files" / kept.id).exists()
