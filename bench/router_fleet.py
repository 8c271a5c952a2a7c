"""The fleet's router on loopback (docs/fleet.md): what it adds to a request, and what a second instance behind it
gives.

Starts `manage.py router` (its registry in memory, or in Redis with --redis) and two `manage.py serve` instances
registered with it, each with its own temporary data folder and embedded SQLite database and the model catalogued
for autoload, so it needs no services. Then:

1. **Added latency**: `max_tokens: 1` chat completions one after another, alternately straight to the first instance
   and through the router, so both sides see the same host; p50 and p99 of each, and their differences.
2. **Aggregate throughput**: `--clients` concurrent clients, each sending `max_tokens` completions (ignore_eos) for
   `--seconds`, through the router with both instances live, then with the second one stopped (the router drops it
   after its timeout); completion tokens per second over the whole run.

Run: .venv/bin/python bench/router_fleet.py [--model PATH] [--requests N] [--clients C] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "Once upon a time"}]
TOKEN = "bench-fleet-token"
FLEET = {"PANTHEON_FLEET_TOKEN": TOKEN, "PANTHEON_REGISTRY_HEARTBEAT_S": "0.5", "PANTHEON_REGISTRY_TIMEOUT_S": "2"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(data_dir: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PANTHEON_DATA_DIR": data_dir, "PANTHEON_EMBEDDED_CELERY": "0", **FLEET, **extra}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    return env


def _wait(url: str, ready, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready(httpx.get(url, timeout=1)):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} was not ready within {timeout} s")


def start_router(base: str, redis_url: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = _env(f"{base}/router", PANTHEON_FLEET_REDIS_URL=redis_url)
    command = [sys.executable, "manage.py", "router", "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/health", lambda r: r.status_code == 200)
    return process, url


def start_instance(base: str, name: str, model: str, router_url: str) -> tuple[subprocess.Popen, str]:
    env = _env(f"{base}/{name}", PANTHEON_REGISTRY_URL=router_url)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
    subprocess.run([*manage, "load_model", model, "--name", "bench"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    port = _free_port()
    process = subprocess.Popen([*manage, "serve", "--port", str(port)], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/v1/models", lambda r: r.json()["data"])
    return process, url


def live(router_url: str) -> int:
    rows = httpx.get(router_url + "/v1/models").json()["data"]
    return next((row["live"] for row in rows if row["id"] == "bench"), 0)


def latencies(direct_url: str, router_url: str, requests: int) -> tuple[list[float], list[float]]:
    body = {"model": "bench", "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    times: dict[str, list[float]] = {direct_url: [], router_url: []}
    with httpx.Client(timeout=30) as client:
        for i in range(requests + 10):
            for url in (direct_url, router_url) if i % 2 else (router_url, direct_url):
                start = time.perf_counter()
                client.post(url + "/v1/chat/completions", json=body).raise_for_status()
                if i >= 10:  # warm-up
                    times[url].append(time.perf_counter() - start)
    return times[direct_url], times[router_url]


async def throughput(router_url: str, clients: int, seconds: float, max_tokens: int) -> float:
    body = {"model": "bench", "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True}
    tokens = 0
    deadline = time.monotonic() + seconds

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while time.monotonic() < deadline:
            answer = await client.post(router_url + "/v1/completions", json=body)
            answer.raise_for_status()
            tokens += answer.json()["usage"]["completion_tokens"]

    start = time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return tokens / (time.monotonic() - start)


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def main() -> None:
    models = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(models / "stories260K.gguf"))
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--redis", default="", help="the registry's Redis URL (default: in the router's memory)")
    args = parser.parse_args()
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as base:
        try:
            router, router_url = start_router(base, args.redis)
            processes.append(router)
            first, first_url = start_instance(base, "a", args.model, router_url)
            second, _ = start_instance(base, "b", args.model, router_url)
            processes += [first, second]
            _wait(router_url + "/v1/models", lambda r: live(router_url) == 2)

            direct, routed = latencies(first_url, router_url, args.requests)
            for name, values in (("direct", direct), ("router", routed)):
                p50, p99 = statistics.median(values) * 1e3, quantile(values, 0.99) * 1e3
                print(f"{name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            added_p50 = (statistics.median(routed) - statistics.median(direct)) * 1e3
            added_p99 = (quantile(routed, 0.99) - quantile(direct, 0.99)) * 1e3
            print(f"router adds: p50 {added_p50:.2f} ms, p99 {added_p99:.2f} ms ({args.requests} requests each)")

            two = asyncio.run(throughput(router_url, args.clients, args.seconds, args.max_tokens))
            second.terminate()
            second.wait(30)
            _wait(router_url + "/v1/models", lambda r: live(router_url) == 1)
            one = asyncio.run(throughput(router_url, args.clients, args.seconds, args.max_tokens))
            print(f"aggregate, {args.clients} clients x {args.max_tokens} tokens: one instance {one:.0f} tok/s, "
                  f"two instances {two:.0f} tok/s ({two / one:.2f}x)")  # fmt: skip
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(30)


if __name__ == "__main__":
    main()
