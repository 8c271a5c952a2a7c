"""A small streaming chat beside a 5 MB /v1/embeddings input: its time to first token alone and beside, and what the
embeddings request gets (a 4xx: the input cannot fit the window) and how soon.

Starts `manage.py serve` on a free loopback port with a temporary data folder (serve_bench.py's Server), or with
--url uses a running server whose admin secret --admin-secret gives, and serves stories260K (GGUF) as "bench".
Idle: --trials streaming chats one after another (max_tokens 8), timed from sending to the first content event.
Beside: --trials times, an embeddings request with one --megabytes MB input is sent (from a thread of its own) and
the same chats are sent one after another from its start until it is answered (at least one), so that some reach
the worker while it holds the input. Prints the median and the worst of each, and the embeddings requests' statuses
and times.

Run: .venv/bin/python bench/embeddings_beside_chat.py [--model PATH] [--trials 10] [--megabytes 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from serve_bench import Server  # noqa: E402

CHAT = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Once upon a time"}],
    "max_tokens": 8,
    "temperature": 0,
    "stream": True,
}


def time_to_first_token(client: httpx.Client) -> float:
    start = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                return time.perf_counter() - start
    raise RuntimeError("the chat streamed no content")


def chats_beside_embeddings(url: str, text: str) -> tuple[list[float], int, float]:
    """Sends an embeddings request of `text`, and small streaming chats one after another until it is answered
    (at least one): the chats' times to first token, the embeddings' status and its time."""
    answer: dict[str, float | int] = {}

    def embed() -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            start = time.perf_counter()
            response = client.post("/v1/embeddings", json={"model": "bench", "input": text})
            answer.update(status=response.status_code, seconds=time.perf_counter() - start)

    thread = threading.Thread(target=embed)
    ttfts = []
    with httpx.Client(base_url=url, timeout=300) as client:
        thread.start()
        while not ttfts or thread.is_alive():
            ttfts.append(time_to_first_token(client))
    thread.join()
    return ttfts, int(answer["status"]), float(answer["seconds"])


def summary(seconds: list[float]) -> str:
    return f"median {statistics.median(seconds) * 1000:8.1f} ms, worst {max(seconds) * 1000:8.1f} ms"


def main() -> None:
    models = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(models / "stories260K.gguf"))
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--megabytes", type=float, default=5)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--admin-secret", help="the running server's admin secret (with --url)")
    args = parser.parse_args()

    server = None if args.url else Server({})
    url, secret = (args.url, args.admin_secret) if args.url else (server.url, server.admin_secret)
    try:
        headers = {"Authorization": f"Bearer {secret}", "X-Pantheon-Actor": "embeddings_beside_chat"}
        load = {"path": args.model, "name": "bench", "device": "cpu"}
        httpx.post(f"{url}/admin/models/load", json=load, headers=headers, timeout=600).raise_for_status()
        text = "Once upon a time there was a cat. " * int(args.megabytes * 1e6 / 34)
        with httpx.Client(base_url=url, timeout=300) as client:
            for _ in range(3):  # warm-up
                time_to_first_token(client)
            idle = [time_to_first_token(client) for _ in range(args.trials)]
        beside = [chats_beside_embeddings(url, text) for _ in range(args.trials)]
    finally:
        if server is not None:
            server.stop()
    chats, statuses, embed_seconds = zip(*beside, strict=True)
    ttfts = [ttft for trial in chats for ttft in trial]
    print(f"model {args.model}, {args.trials} trials, an embeddings input of {len(text) / 1e6:.1f} MB")
    print(f"  chat time to first token, idle:              {summary(idle)}")
    print(f"  chat time to first token, beside embeddings: {summary(ttfts)} ({len(ttfts)} chats)")
    print(f"  embeddings answers: {sorted(set(statuses))}, {summary(list(embed_seconds))}")
    print(f"  beside / idle, medians: {statistics.median(ttfts) / statistics.median(idle):.2f}")


if __name__ == "__main__":
    main()
