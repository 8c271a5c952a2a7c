"""The Batch API as an OpenAI client uses it, on the README's embedded default: `manage.py serve` with no REDIS_URL
(its own Celery worker and beat on the filesystem transport) serving stories260K, and the `openai` package uploading
a 200-line JSONL file, creating a batch, polling it to `completed` and downloading the output. Every custom_id is
answered exactly once, each answer is the model's (the X-miLLM-Model value of the model that answered), and the
lines' common system prompt is computed once and then reused from the prefix cache."""

from __future__ import annotations

import io
import json

import openai
import pytest

from batches.models import BatchLine
from tests.inference.serving import PantheonServer, run_manage, serving_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LINES = 200
SYSTEM = (
    "You are a storyteller for small children. Every story you tell is short, kind and simple, with a happy end, "
    "and it is about animals who live in a big green forest near a river."
)


def line(number: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Story {number}."}]
    body = {"model": "stories", "max_tokens": 6, "temperature": 0, "messages": messages}
    return {"custom_id": f"line-{number}", "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.fixture(scope="module")
def server(serving_db, stories_gguf_path, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("embedded-batch")
    env = serving_env(data_dir, PANTHEON_EMBEDDED_CELERY="1")
    env.pop("REDIS_URL", None)  # the embedded default: no services at all
    catalogued = run_manage(env, "load_model", str(stories_gguf_path), "--name", "stories")
    assert catalogued.returncode == 0, catalogued.stderr
    server = PantheonServer(data_dir, env).start()
    yield server
    server.stop()


def test_a_200_line_batch_runs_to_completed_and_answers_every_custom_id_once(server):
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    wait_for(lambda: [m.id for m in sdk.models.list().data] == ["stories"], timeout=60)
    content = "".join(json.dumps(line(i)) + "\n" for i in range(LINES)).encode()
    uploaded = sdk.files.create(file=("requests.jsonl", io.BytesIO(content)), purpose="batch")
    assert uploaded.bytes == len(content) and uploaded.purpose == "batch"

    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating" and batch.request_counts.total == LINES
    done = wait_for(lambda: (b := sdk.batches.retrieve(batch.id)).status == "completed" and b, timeout=600)
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    assert done.error_file_id is None and done.completed_at >= done.in_progress_at >= done.created_at

    output = [json.loads(text) for text in sdk.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == sorted(f"line-{i}" for i in range(LINES))
    direct = sdk.chat.completions.with_raw_response.create(**line(0)["body"])
    for answer in output:
        response = answer["response"]
        assert answer["error"] is None and response["status_code"] == 200
        assert response["body"]["object"] == "chat.completion" and response["body"]["model"] == "stories"
        assert response["headers"]["X-miLLM-Model"] == direct.headers["X-miLLM-Model"]
    first = next(o for o in output if o["custom_id"] == "line-0")["response"]["body"]
    assert first["choices"][0]["message"]["content"] == direct.parse().choices[0].message.content

    # The system prompt is prefilled once: the lines after the first batch in flight find it in the prefix cache.
    cached = [o["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for o in output]
    assert sum(1 for c in cached if c > 0) >= LINES - 10
    # Sent once each: no line needed a second attempt.
    assert set(BatchLine.objects.filter(batch_id=batch.id).values_list("attempts", flat=True)) == {1}
