"""Batches for the runner's tests, made as the Files and Batch routes make them: a JSONL input file under the files
folder, its StoredFile row, the Batch (validating) and one BatchLine per input line with its byte offset and length;
and a Celery worker subprocess that runs them, as an operator starts one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from celery import Celery
from django.utils import timezone

from batches.models import Batch, BatchLine, BatchStatus, FilePurpose, LineState, StoredFile
from tests.inference.serving import REPO_ROOT

BATCH_REDIS_URL = "redis://127.0.0.1:6379/1"  # this branch's Redis database (docs/development.md)


def chat_line(custom_id: str, model: str = "stories", max_tokens: int = 16, **body) -> dict:
    """One input line of a chat batch."""
    body = {"model": model, "messages": [{"role": "user", "content": f"Tell me about {custom_id}."}],
            "max_tokens": max_tokens, **body}  # fmt: skip
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def make_batch(files_dir: Path, lines: list, *, endpoint: str = "/v1/chat/completions", window_s: float = 86400):
    """The input file and the rows of a new batch of `lines` (dicts, or raw bytes for a malformed line)."""
    raw = [line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines]
    content = b"".join(r + b"\n" for r in raw)
    stored = StoredFile.objects.create(filename="input.jsonl", purpose=FilePurpose.BATCH, bytes=len(content),
                                       line_count=len(raw))  # fmt: skip
    files_dir.mkdir(parents=True, exist_ok=True)
    (files_dir / stored.id).write_bytes(content)
    now = timezone.now()
    batch = Batch.objects.create(endpoint=endpoint, input_file=stored, total_count=len(raw), created_at=now,
                                 expires_at=now + timedelta(seconds=window_s))  # fmt: skip
    offset = 0
    rows = []
    for number, (line, r) in enumerate(zip(lines, raw, strict=True), start=1):
        custom_id = line["custom_id"] if isinstance(line, dict) else f"raw-{number}"
        rows.append(BatchLine(batch=batch, number=number, custom_id=custom_id, offset=offset, length=len(r)))
        offset += len(r) + 1
    BatchLine.objects.bulk_create(rows)
    return batch


ENDED = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


def ended(batch_id: str) -> Batch | None:
    """The batch, once it has ended; None before."""
    batch = Batch.objects.get(pk=batch_id)
    return batch if batch.status in ENDED else None


def recorded(batch_id: str) -> int:
    """How many of the batch's lines have a recorded result."""
    return BatchLine.objects.filter(batch_id=batch_id).exclude(state=LineState.PENDING).count()


def send_task(broker_url: str, name: str, *args) -> None:
    """Sends a task by name, as the routes and beat do."""
    app = Celery("pantheon-tests", broker=broker_url)
    try:
        app.send_task(name, args=list(args))
    finally:
        app.close()


def output_lines(files_dir: Path, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in (files_dir / file_id).read_text().splitlines()]


class CeleryWorker:
    """`celery -A pantheon_site worker` in a process group of its own (so a kill takes its pool children too)."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env, self.log_path = env, log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> CeleryWorker:
        command = [sys.executable, "-m", "celery", "-A", "pantheon_site", "worker", "--loglevel", "INFO",
                   "--concurrency", "2", "--without-gossip", "--without-mingle", "--hostname",
                   f"batches-test-{os.getpid()}-{time.monotonic_ns()}@%h"]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL to the worker and its pool: as a crash or a machine's power loss would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def worker_env(server_env: dict[str, str], broker_url: str = BATCH_REDIS_URL, **overrides: str) -> dict[str, str]:
    """A Celery worker's environment beside `server_env`'s server: the same database and data folder (so it finds
    the run file), the broker at `broker_url`."""
    return {**server_env, "REDIS_URL": broker_url, "PANTHEON_LOG_LEVEL": "INFO", **overrides}
