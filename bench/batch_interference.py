"""An interactive chat's time to first token while a batch runs at full tilt, against its idle value.

Starts `manage.py serve` on a free loopback port with a temporary data folder (serve_bench.py's Server) on the
embedded default (its own Celery worker), and serves stories260K (GGUF) as "bench" with --slots slots (batch lines
may hold PANTHEON_BATCH_SLOT_SHARE of them, the server's setting). Idle: --trials streaming chats one after another
(real story prompts, temperature 0, max_tokens 16), each timed from sending to its first content event. Loaded: the
same chats while a real batch (`batch_load`: uploaded through /v1/files, run through /v1/batches, --in-flight lines
at once, more than its slots) keeps every batch slot busy. Prints the median and p90 of both, their ratio, and what
the batch got done meanwhile (lines answered per second). Issue 38 asks the ratio to stay within 2.

Run: .venv/bin/python bench/batch_interference.py [--model PATH] [--slots 8] [--trials 200] [--in-flight 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from serve_bench import Server  # noqa: E402

PROMPTS = [
    "Once upon a time, there was a little girl named Lily who loved to play in the park.",
    "Tom had a big red ball. One day he threw it very high and it got stuck in a tree.",
    "The sun was shining and the birds were singing. Sam wanted to go outside and play.",
    "There was a small cat who lived in a house by the sea. Every morning she looked at the boats.",
    "Mia found a shiny stone in the garden. She showed it to her mom and asked what it was.",
    "A little dog named Max was very hungry. He looked for food in the kitchen.",
    "Ben and his friend went to the store to buy some apples and a cake for the party.",
    "It was a rainy day and Lucy could not go outside. She decided to build a fort with her blankets.",
]


def chat(prompt: str, max_tokens: int, *, stream: bool) -> dict:
    return {"model": "bench", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}  # fmt: skip


def time_to_first_token(client: httpx.Client, prompt: str) -> float:
    start = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=chat(prompt, 16, stream=True)) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                return time.perf_counter() - start
    raise RuntimeError("the chat streamed no content")


@contextmanager
def batch_load(url: str, lines: int, max_tokens: int) -> Iterator[Callable[[], int]]:
    """A real batch at full tilt while the block runs: `lines` chat lines uploaded through POST /v1/files and run
    through POST /v1/batches by the server's embedded Celery worker (PANTHEON_BATCH_LINES_IN_FLIGHT at once), cancelled
    when the block ends. Yields a function that reads how many of its lines have an answer."""
    content = "".join(
        json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": chat(PROMPTS[i % len(PROMPTS)], max_tokens, stream=False)}) + "\n"
        for i in range(lines)
    )  # fmt: skip
    with httpx.Client(base_url=url, timeout=600) as client:
        uploaded = client.post("/v1/files", files={"file": ("lines.jsonl", content)}, data={"purpose": "batch"})
        uploaded.raise_for_status()
        request = {
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        batch = client.post("/v1/batches", json=request)
        batch.raise_for_status()
        batch_id = batch.json()["id"]

        def answered() -> int:
            counts = client.get(f"/v1/batches/{batch_id}").json()["request_counts"]
            return counts["completed"] + counts["failed"]

        try:
            yield answered
        finally:
            client.post(f"/v1/batches/{batch_id}/cancel")


def live(url: str, headers: dict) -> dict:
    rows = httpx.get(f"{url}/admin/models", headers=headers, timeout=60).json()["data"]
    return next(row for row in rows if row["id"] == "bench")["live"]


def p90(seconds: list[float]) -> float:
    return statistics.quantiles(seconds, n=10, method="inclusive")[-1]


def summary(seconds: list[float]) -> str:
    return f"median {statistics.median(seconds) * 1000:7.1f} ms, p90 {p90(seconds) * 1000:7.1f} ms"


def main() -> None:
    models = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(models / "stories260K.gguf"))
    parser.add_argument("--slots", type=int, default=8, help="the model's max_concurrent")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--in-flight", type=int, default=12, help="the batch's lines in flight at once")
    parser.add_argument("--batch-lines", type=int, default=5000, help="more than the measurement's time answers")
    parser.add_argument("--batch-max-tokens", type=int, default=128)
    args = parser.parse_args()

    # The embedded default (no REDIS_URL): serve runs the batch's Celery worker itself.
    server = Server({"REDIS_URL": "", "PANTHEON_EMBEDDED_CELERY": "1",
                     "PANTHEON_BATCH_LINES_IN_FLIGHT": str(args.in_flight)})  # fmt: skip
    url, secret = server.url, server.admin_secret
    try:
        headers = {"Authorization": f"Bearer {secret}", "X-Pantheon-Actor": "batch_interference"}
        load = {"path": args.model, "name": "bench", "device": "cpu", "max_concurrent": args.slots}
        httpx.post(f"{url}/admin/models/load", json=load, headers=headers, timeout=600).raise_for_status()
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.trials)]
        with httpx.Client(base_url=url, timeout=600) as client:
            for prompt in PROMPTS:  # warm-up, and every prompt's prefix cached alike in both phases
                time_to_first_token(client, prompt)
            idle = [time_to_first_token(client, prompt) for prompt in prompts]
            with batch_load(url, args.batch_lines, args.batch_max_tokens) as answered:
                while (state := live(url, headers))["batch_running"] < min(args.in_flight, state["batch_slots"]):
                    time.sleep(0.05)
                started, before = time.perf_counter(), answered()
                loaded = [time_to_first_token(client, prompt) for prompt in prompts]
                seconds, lines = time.perf_counter() - started, answered() - before
    finally:
        server.stop()
    print(f"model {args.model}, {args.slots} slots ({state['batch_slots']} for batch requests), {args.trials} chats "
          f"per phase; the batch: {args.batch_lines} lines through the Batch API, {args.in_flight} in flight, "
          f"max_tokens {args.batch_max_tokens}")  # fmt: skip
    print(f"  interactive time to first token, idle:          {summary(idle)}")
    print(f"  interactive time to first token, batch running: {summary(loaded)}")
    print(f"  batch running / idle: median {statistics.median(loaded) / statistics.median(idle):.2f}, "
          f"p90 {p90(loaded) / p90(idle):.2f}")  # fmt: skip
    print(f"  the batch meanwhile: {lines} lines answered in {seconds:.1f} s ({lines / seconds:.1f}/s)")


if __name__ == "__main__":
    main()
