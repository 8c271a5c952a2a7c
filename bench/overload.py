"""Overload: FACTOR x the configured capacity (PANTHEON_BATCH_SLOTS + PANTHEON_QUEUE_DEPTH) of concurrent clients
against a real server for SECONDS.

Each client sends /v1/chat/completions one after another without pause (a 429 or 503 is sent again at once: the
worst a client can do), so the server holds every slot and every queue place and must refuse the rest. The promise
checked: every request ends 200, 429 or 503, each refusal with Retry-After; none hangs (each gets its answer within
--timeout) or is lost (no connection error); the memory of `serve` and its workers stays bounded. Printed: outcomes
by status, p50/p99 latency per status, and the resident memory of serve + workers at the start, at its peak and at
the end.

Starts `manage.py serve` on a free port with its own data folder (SQLite) and loads stories260K, unless --url names
a running server (then nothing is loaded and memory is not read).

Run: .venv/bin/python bench/overload.py [--seconds 60] [--slots 8] [--queue 32] [--factor 4] [--max-tokens 64]
tests/inference/test_overload.py runs the same clients, bounded, in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
ACCEPTABLE = {200, 429, 503}
NO_EOS = {"2": -100}  # stories260K's EOS never sampled: each generation runs to max_tokens and holds its slot


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's end: its status (0: no answer, `failure` says why), seconds taken, its Retry-After."""

    status: int
    seconds: float
    retry_after: str | None = None
    failure: str = ""

    @property
    def kept_the_promise(self) -> bool:
        """200, or 429/503 with a Retry-After of whole seconds."""
        if self.status == 200:
            return True
        return self.status in ACCEPTABLE and self.retry_after is not None and self.retry_after.isdigit()


def chat_body(max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": max_tokens,
            "logit_bias": NO_EOS}  # fmt: skip


async def _one(client: httpx.AsyncClient, body: dict) -> Outcome:
    started = time.monotonic()
    try:
        response = await client.post("/v1/chat/completions", json=body)
    except httpx.TimeoutException:
        return Outcome(0, time.monotonic() - started, failure="hung")
    except httpx.HTTPError as error:
        return Outcome(0, time.monotonic() - started, failure=f"lost: {type(error).__name__}")
    return Outcome(response.status_code, time.monotonic() - started, response.headers.get("retry-after"))


async def drive(url: str, clients: int, body: dict, *, seconds: float | None = None, requests: int | None = None,
                timeout: float = 120.0) -> list[Outcome]:  # fmt: skip
    """`clients` concurrent clients, each sending one request after another for `seconds`, or `requests` each;
    every request's Outcome."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    deadline = time.monotonic() + seconds if seconds is not None else None

    async def client_loop(http: httpx.AsyncClient) -> list[Outcome]:
        outcomes = []
        while (deadline is None or time.monotonic() < deadline) and (requests is None or len(outcomes) < requests):
            outcomes.append(await _one(http, body))
        return outcomes

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        per_client = await asyncio.gather(*(client_loop(http) for _ in range(clients)))
    return [outcome for outcomes in per_client for outcome in outcomes]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def report(outcomes: list[Outcome], wall: float) -> None:
    by_status = Counter(o.status if o.status else o.failure for o in outcomes)
    print(f"requests: {len(outcomes)} in {wall:.1f} s ({len(outcomes) / wall:.1f}/s)")
    for status, count in sorted(by_status.items(), key=lambda kv: str(kv[0])):
        seconds = [o.seconds for o in outcomes if (o.status or o.failure) == status]
        print(f"  {status}: {count:6d}   p50 {percentile(seconds, 50) * 1000:8.1f} ms   "
              f"p99 {percentile(seconds, 99) * 1000:8.1f} ms")  # fmt: skip
    every = [o.seconds for o in outcomes]
    print(f"  all: p50 {percentile(every, 50) * 1000:.1f} ms, p99 {percentile(every, 99) * 1000:.1f} ms, "
          f"max {max(every) * 1000:.1f} ms")  # fmt: skip
    broken = [o for o in outcomes if not o.kept_the_promise]
    print(f"promise (200, or 429/503 with Retry-After; none hung or lost): {'kept' if not broken else 'BROKEN'}"
          + (f" - {len(broken)} requests, e.g. {broken[:3]}" if broken else ""))  # fmt: skip


def start_server(args) -> tuple:
    """A `manage.py serve` of our own (tests/inference/serving.py's), with stories260K loaded; (server, url)."""
    from tests.inference.serving import PantheonServer

    data_dir = Path(tempfile.mkdtemp(prefix="pantheon-overload-"))
    env = {**os.environ, "PANTHEON_DATA_DIR": str(data_dir), "PANTHEON_WORKER_DEVICES": "cpu",
           "PANTHEON_BATCH_SLOTS": str(args.slots), "PANTHEON_QUEUE_DEPTH": str(args.queue),
           "PANTHEON_LOG_LEVEL": "WARNING"}  # fmt: skip
    env.pop("DATABASE_URL", None)
    server = PantheonServer(data_dir, env).start()
    secret = server.run_file()["admin_secret"]
    headers = {"Authorization": f"Bearer {secret}", "X-Pantheon-Actor": "overload"}
    body = {"path": str(args.models / "stories260K-hf"), "name": "stories260K"}
    httpx.post(f"{server.url}/admin/models/load", json=body, headers=headers, timeout=300).raise_for_status()
    return server, server.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--slots", type=int, default=int(os.environ.get("PANTHEON_BATCH_SLOTS", 8)))
    parser.add_argument("--queue", type=int, default=int(os.environ.get("PANTHEON_QUEUE_DEPTH", 32)))
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0, help="a request unanswered this long has hung")
    models = os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models")
    parser.add_argument("--models", type=Path, default=Path(models))
    parser.add_argument("--url", help="a running server serving a model (then --slots/--queue must match it)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from bench.memory_watch import MemoryWatch

    clients = args.factor * (args.slots + args.queue)
    server, url = (None, args.url.rstrip("/")) if args.url else start_server(args)
    print(f"server {url}: {args.slots} slots + {args.queue} queue places; {clients} clients for {args.seconds:.0f} s, "
          f"max_tokens {args.max_tokens}")  # fmt: skip
    try:
        watch = MemoryWatch(server.process.pid) if server else None
        idle_rss = watch.rss() if watch else 0
        started = time.monotonic()
        with watch or contextlib.nullcontext():
            outcomes = asyncio.run(drive(url, clients, chat_body(args.max_tokens), seconds=args.seconds,
                                         timeout=args.timeout))  # fmt: skip
        wall = time.monotonic() - started
        report(outcomes, wall)
        after = httpx.post(f"{url}/v1/chat/completions", json=chat_body(8), timeout=args.timeout)
        print(f"a request after the run: {after.status_code}")
        if watch:
            mib = 1024 * 1024
            print(f"memory (serve + workers, RSS): before {idle_rss / mib:.0f} MiB, peak {max(watch.samples) / mib:.0f}"
                  f" MiB, at the end {watch.samples[-1] / mib:.0f} MiB")  # fmt: skip
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
