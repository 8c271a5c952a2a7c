"""An interactive chat's time to first token while a batch runs at full tilt, against its idle value.

Starts `manage.py serve` on a free loopback port with a temporary data folder (serve_bench.py's Server), or with
--url uses a running server whose admin secret --admin-secret gives, and serves stories260K (GGUF) as "bench" with
--slots slots (batch requests may hold PANTHEON_BATCH_SLOT_SHARE of them, the server's setting).
Idle: --trials streaming chats one after another (real story prompts, temperature 0, max_tokens 16), each timed from
sending to its first content event. Loaded: the same chats while `batch_load` keeps every batch slot busy, and more
batch lines waiting, until they are done. Prints the median and p90 of both, their ratio, and what the batch got done
meanwhile (lines answered per second); --as-interactive sends the same lines without the header, to show what the
priority buys. Issue 38 asks the ratio to stay within 2.

`batch_load` is the one place the load comes from: today lines sent as the Batch API's runner sends them (POST
/v1/chat/completions with X-Pantheon-Priority: batch, several in flight); a real batch through /v1/batches can take
its place without touching the measurement.

Run: .venv/bin/python bench/batch_interference.py [--model PATH] [--slots 8] [--trials 200] [--in-flight 12]
[--as-interactive]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
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
def batch_load(url: str, in_flight: int, max_tokens: int, priority: str = "batch") -> Iterator[Counter]:
    """A batch at full tilt while the block runs: `in_flight` lines at a time (more than the batch slots, so some
    always wait), each a chat completion with X-Pantheon-Priority: batch (`priority`), sent again as soon as it is
    answered. Yields the count of answers by status, filled in as they come."""
    answers: Counter = Counter()
    stop = threading.Event()

    def lines(first: int) -> None:
        with httpx.Client(base_url=url, timeout=600, headers={"X-Pantheon-Priority": priority}) as client:
            i = first
            while not stop.is_set():
                response = client.post("/v1/chat/completions", json=chat(PROMPTS[i % len(PROMPTS)], max_tokens,
                                                                          stream=False))  # fmt: skip
                answers[response.status_code] += 1
                i += in_flight

    threads = [threading.Thread(target=lines, args=(i,)) for i in range(in_flight)]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        stop.set()
        for thread in threads:
            thread.join()


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
    parser.add_argument("--in-flight", type=int, default=12, help="batch lines in flight at once")
    parser.add_argument("--batch-max-tokens", type=int, default=128)
    parser.add_argument("--as-interactive", action="store_true",
                        help="send the batch's lines without batch priority (what the priority buys)")  # fmt: skip
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--admin-secret", help="the running server's admin secret (with --url)")
    args = parser.parse_args()

    server = None if args.url else Server({})
    url, secret = (args.url, args.admin_secret) if args.url else (server.url, server.admin_secret)
    try:
        headers = {"Authorization": f"Bearer {secret}", "X-Pantheon-Actor": "batch_interference"}
        load = {"path": args.model, "name": "bench", "device": "cpu", "max_concurrent": args.slots}
        httpx.post(f"{url}/admin/models/load", json=load, headers=headers, timeout=600).raise_for_status()
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.trials)]
        with httpx.Client(base_url=url, timeout=600) as client:
            for prompt in PROMPTS:  # warm-up, and every prompt's prefix cached alike in both phases
                time_to_first_token(client, prompt)
            idle = [time_to_first_token(client, prompt) for prompt in prompts]
            priority = "interactive" if args.as_interactive else "batch"
            with batch_load(url, args.in_flight, args.batch_max_tokens, priority) as answers:
                busy = "running" if args.as_interactive else "batch_running"
                while (state := live(url, headers))[busy] < min(args.in_flight, state["batch_slots"]):
                    time.sleep(0.05)
                started, answered = time.perf_counter(), sum(answers.values())
                loaded = [time_to_first_token(client, prompt) for prompt in prompts]
                seconds, lines = time.perf_counter() - started, sum(answers.values()) - answered
    finally:
        if server is not None:
            server.stop()
    print(f"model {args.model}, {args.slots} slots ({state['batch_slots']} for batch requests), {args.trials} chats "
          f"per phase; the batch: {args.in_flight} lines in flight at {priority} priority, max_tokens "
          f"{args.batch_max_tokens}")  # fmt: skip
    print(f"  interactive time to first token, idle:          {summary(idle)}")
    print(f"  interactive time to first token, batch running: {summary(loaded)}")
    print(f"  batch running / idle: median {statistics.median(loaded) / statistics.median(idle):.2f}, "
          f"p90 {p90(loaded) / p90(idle):.2f}")  # fmt: skip
    print(f"  the batch meanwhile: {lines} lines answered in {seconds:.1f} s ({lines / seconds:.1f}/s), "
          f"statuses {dict(answers)}")  # fmt: skip


if __name__ == "__main__":
    main()
