"""The prefix cache's second round: N distinct long prompts sent one after another, then the same N again, through
/v1/completions (token-id prompts, max_tokens 1, so a request's time is its time to first token).

A second-round prompt whose blocks are still cached prefills only its last token. Runs a server for each prefix
cache size asked for (`--sizes`, PANTHEON_PREFIX_CACHE_BYTES values: `auto`, the default, and `0`, the pool of the
sequences' windows alone that was the default before issue 35) and prints per size the median time of each round and
the cached tokens of the second. With N x prompt tokens more than `--slots` x `--window`, the windows alone cannot
keep the first prompts until their second turn.

Run: .venv/bin/python bench/prefix_cache_bench.py [--models DIR] [--model PATH] [--prompts 8] [--prompt-tokens 400]
[--slots 4] [--window 512] [--sizes auto,0]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from serve_bench import Server  # noqa: E402


def distinct_prompts(count: int, tokens: int, vocab: int) -> list[list[int]]:
    """Random token-id prompts whose first tokens differ, so no two share a block."""
    rng = random.Random(0)
    return [
        [first] + [rng.randrange(3, vocab) for _ in range(tokens - 1)] for first in rng.sample(range(3, vocab), count)
    ]


def timed_round(client: httpx.Client, prompts: list[list[int]]) -> tuple[list[float], list[int]]:
    """Each prompt's request time (ms) and cached tokens, one request after another."""
    times, cached = [], []
    for prompt in prompts:
        started = time.perf_counter()
        response = client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 1})
        times.append(1000 * (time.perf_counter() - started))
        response.raise_for_status()
        cached.append(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
    return times, cached


def run(size: str, args: argparse.Namespace, prompts: list[list[int]]) -> None:
    server = Server({"PANTHEON_PREFIX_CACHE_BYTES": size})
    try:
        headers = {"Authorization": f"Bearer {server.admin_secret}", "X-Pantheon-Actor": "prefix_cache_bench"}
        with httpx.Client(base_url=server.url, timeout=600, headers=headers) as client:
            body = {"path": str(args.model), "name": "m", "max_concurrent": args.slots, "ctx_cap": args.window}
            client.post("/admin/models/load", json=body).raise_for_status()
            timed_round(client, [[5, 6, 7]])  # warm-up: connection, first-request paths
            first, _ = timed_round(client, prompts)
            second, cached = timed_round(client, prompts)
            row = next(r for r in client.get("/admin/models").json()["data"] if r["id"] == "m")
        cache, hit_rate = row["prefix_cache"], row["live"]["prefix_cache"]["hit_rate"]
        print(
            f"{size:>6} {cache['bytes'] / 2**20:>10.1f} {statistics.median(first):>14.1f} "
            f"{statistics.median(second):>15.1f} {statistics.median(cached):>14.0f} {hit_rate or 0:>9.3f}",
            flush=True,
        )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    models = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    parser.add_argument("--model", type=Path, default=models / "stories260K-hf")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--vocab", type=int, default=512, help="token ids are drawn below this")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--sizes", default="auto,0", help="PANTHEON_PREFIX_CACHE_BYTES values, comma-separated")
    args = parser.parse_args()
    prompts = distinct_prompts(args.prompts, args.prompt_tokens, args.vocab)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; model {args.model.name}")
    print(f"{args.prompts} prompts x {args.prompt_tokens} tokens, {args.slots} slots x {args.window}-token window")
    columns = ("cache", 6), ("cache MiB", 10), ("round 1 ms p50", 14), ("round 2 ms p50", 15), ("cached p50", 14)
    print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'hit rate':>9}")
    for size in args.sizes.split(","):
        run(size, args, prompts)


if __name__ == "__main__":
    main()
