"""Serving throughput through the HTTP API: N concurrent streaming /v1/chat/completions clients, N = 1, 8, 32.

Starts `manage.py serve` on a free loopback port with a temporary PANTHEON_DATA_DIR (or, with --url, uses a running
server whose admin secret --admin-secret gives), loads each model with max_concurrent 32 through POST
/admin/models/load, and drives it like PERFORMANCE-TARGETS' llama.cpp reference: "Once upon a time"-style prompts,
temperature 0, max_tokens 128 on stories260K and 64 on the random 85M model (served from its GGUF files: F32, Q8_0
and Q4_0). Each model is unloaded before the next loads; the worker's resident memory is read after its runs.

Each of the N clients runs a bounded loop of --rounds requests, one after another; a round is timed as a whole.
Reported per (model, N): aggregate completion tokens/s (usage.completion_tokens of every request / wall time of the
rounds), median and p99 time to first token, median inter-token latency (the gaps between a stream's events that
carry tokens; one token each unless the client fell behind), and the CPU seconds the client used
(it shares the machine's two cores with the server, as llama.cpp's reference client did).

With --openai URL it drives another OpenAI-compatible server instead (a side-by-side reference run on the same GGUF
file), which serves the one model --only names; nothing is loaded, and --pid names the process whose resident memory
is reported.

Run: .venv/bin/python bench/serve_bench.py [--models DIR] [--only stories260K,random85m-Q4_0,...] [--streams 1,8,32]
[--rounds 2] [--kv-dtype float16] [--openai URL --pid PID] [--gguf var/bench/random85m-Q4_K_M.gguf]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from random_model import write_quantized_gguf, write_random_llama  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "Once upon a time, there was a little girl",
    "Once upon a time, a dog found a ball",
    "Once upon a time in a big forest",
    "One day, a boy went to the park",
    "Once upon a time, there was a cat who liked to sing",
    "Lily and Ben were friends",
    "Once upon a time, a bird flew over the sea",
]


@dataclass(slots=True)
class StreamResult:
    completion_tokens: int = 0
    ttft: float | None = None  # seconds from sending the request to the first content event
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive content events


async def stream_once(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, logprobs: bool
) -> StreamResult:
    """One streaming chat completion; timestamps every event that carries tokens. A request the server closed its
    connection on before answering is sent again (llama.cpp's server does that now and then to a kept-alive
    connection at 8 streams; the request never started, so nothing is counted twice)."""
    for _ in range(3):
        try:
            return await _stream_once(client, model, prompt, max_tokens, logprobs)
        except httpx.RemoteProtocolError as unanswered:
            if "without sending a response" not in str(unanswered):
                raise
    return await _stream_once(client, model, prompt, max_tokens, logprobs)


async def _stream_once(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, logprobs: bool
) -> StreamResult:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": logprobs,
    }
    result = StreamResult()
    start = last = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            if event.get("usage"):
                result.completion_tokens = event["usage"]["completion_tokens"]
            choices = event.get("choices") or []
            if choices and (choices[0]["delta"].get("content") or choices[0].get("logprobs")):
                if result.ttft is None:
                    result.ttft = now - start
                else:
                    result.gaps.append(now - last)
                last = now
    return result


async def run_streams(url: str, model: str, streams: int, rounds: int, max_tokens: int, logprobs: bool) -> dict:
    """`streams` clients, each sending `rounds` requests in a row; returns the aggregate figures."""
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one_client(index: int) -> list[StreamResult]:
            return [
                await stream_once(client, model, PROMPTS[(index + r) % len(PROMPTS)], max_tokens, logprobs)
                for r in range(rounds)
            ]

        await stream_once(client, model, PROMPTS[0], 8, logprobs)  # warm-up: connection, first-request paths
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        per_client = await asyncio.gather(*(one_client(i) for i in range(streams)))
        wall = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    results = [r for rs in per_client for r in rs]
    tokens = sum(r.completion_tokens for r in results)
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    gaps = [g for r in results for g in r.gaps]
    client_cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {
        "streams": streams,
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "ttft_median_ms": 1000 * statistics.median(ttfts),
        "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "itl_median_ms": 1000 * statistics.median(gaps) if gaps else float("nan"),
        "client_cpu_s": client_cpu,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`manage.py serve` in a child process with its own data directory, stopped (SIGTERM) on exit."""

    def __init__(self, extra_env: dict[str, str]):
        self.data_dir = Path(tempfile.mkdtemp(prefix="pantheon-bench-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PANTHEON_DATA_DIR": str(self.data_dir), "PANTHEON_WORKER_DEVICES": "cpu", **extra_env}
        self.log = open(self.data_dir / "serve.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.admin_secret = self._wait_for_run_file()

    def _wait_for_run_file(self, timeout: float = 120.0) -> str:
        run_file = self.data_dir / "run" / "server.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {(self.data_dir / 'serve.log').read_text()[-2000:]}")
            if run_file.exists():
                return json.loads(run_file.read_text())["admin_secret"]
            time.sleep(0.2)
        raise RuntimeError("serve did not start in time")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def load(url: str, admin_secret: str, path: Path, name: str, ctx_cap: int, kv_dtype: str) -> None:
    body = {"path": str(path), "name": name, "max_concurrent": 32, "ctx_cap": ctx_cap, "device": "cpu"}
    body["kv_dtype"] = kv_dtype
    headers = {"Authorization": f"Bearer {admin_secret}", "X-Pantheon-Actor": "serve_bench"}
    response = httpx.post(f"{url}/admin/models/load", json=body, headers=headers, timeout=600)
    if response.status_code != 200:
        raise RuntimeError(f"loading {name} failed: HTTP {response.status_code} {response.text[:500]}")


def unload(url: str, admin_secret: str, name: str) -> None:
    headers = {"Authorization": f"Bearer {admin_secret}", "X-Pantheon-Actor": "serve_bench"}
    httpx.post(f"{url}/admin/models/unload", json={"name": name}, headers=headers, timeout=600).raise_for_status()


def worker_rss_mb(server: Server | None) -> float:
    """Resident memory of the server's worker process (nan with --url: its processes are not ours to look at)."""
    if server is None:
        return float("nan")
    import psutil

    for child in psutil.Process(server.process.pid).children():
        if "worker_process" in " ".join(child.cmdline()):
            return child.memory_info().rss / 2**20
    return float("nan")


def rss_mb(pid: int | None) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20 if pid else float("nan")


def print_rows(url: str, models: list, streams: list[int], rounds: int, memory_mb) -> None:
    """Runs each model at each client count against a server that serves it, printing a row per run."""
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; server {url}")
    print(
        f"{'model':<12} {'N':>3} {'reqs':>5} {'tokens':>7} {'tok/s':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} "
        f"{'ITL p50 ms':>11} {'client cpu s':>13} {'worker MB':>10}"
    )
    for name, _, max_tokens, _, logprobs in models:
        for n in streams:
            row = asyncio.run(run_streams(url, name, n, rounds, max_tokens, logprobs))
            print(
                f"{name:<12} {n:>3} {row['requests']:>5} {row['tokens']:>7} {row['tok_s']:>8.1f} "
                f"{row['ttft_median_ms']:>12.1f} {row['ttft_p99_ms']:>12.1f} {row['itl_median_ms']:>11.2f} "
                f"{row['client_cpu_s']:>13.2f} {memory_mb():>10.0f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    )
    parser.add_argument("--url", help="a running server (its models are loaded with --admin-secret)")
    parser.add_argument("--admin-secret", help="the running server's admin bearer token (with --url)")
    parser.add_argument("--only", help="comma-separated served names: stories260K, random85m, random85m-Q8_0, ...")
    parser.add_argument("--streams", default="1,8,32", help="comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client, one after another")
    parser.add_argument("--kv-dtype", default="", help="the load option kv_dtype (empty: the weights' dtype)")
    parser.add_argument("--openai", help="another OpenAI-compatible server, serving the one model --only names")
    parser.add_argument("--pid", type=int, help="with --openai: the process whose resident memory is reported")
    parser.add_argument(
        "--gguf",
        action="append",
        default=[],
        type=Path,
        help="another GGUF file of the random 85M model to serve, named by its stem (a K-quant that llama.cpp's "
        "llama-quantize wrote: the gguf package cannot write those); repeatable",
    )
    args = parser.parse_args()
    streams = [int(n) for n in args.streams.split(",")]
    stories_gguf = args.models / "stories260K.gguf"
    _, random_gguf = write_random_llama(args.models / "stories260K-hf", stories_gguf)
    # (served name, GGUF path, max_tokens, ctx_cap (prompt and output with room to spare), logprobs). The random
    # model's output is half byte tokens that are not text on their own, so it asks for logprobs: then every token
    # is an event, which is what time to first token and inter-token latency need.
    models = [("stories260K", stories_gguf, 128, 256, False), ("random85m", random_gguf, 64, 256, True)]
    for qtype in ("Q8_0", "Q4_0"):
        path = write_quantized_gguf(args.models / "stories260K-hf", stories_gguf, qtype)
        models.append((f"random85m-{qtype}", path, 64, 256, True))
    models += [(path.stem, path, 64, 256, True) for path in args.gguf]
    if args.only:
        models = [m for m in models if m[0] in args.only.split(",")]

    if args.openai:
        if len(models) != 1:
            parser.error("--openai serves one model: name it with --only")
        print_rows(args.openai.rstrip("/"), models, streams, args.rounds, lambda: rss_mb(args.pid))
        return
    server = None
    if args.url:
        url, secret = args.url.rstrip("/"), args.admin_secret or ""
    else:
        server = Server({})
        url, secret = server.url, server.admin_secret
    try:
        for model in models:
            name, path, _, ctx_cap, _ = model
            load(url, secret, path, name, ctx_cap, args.kv_dtype)
            print_rows(url, [model], streams, args.rounds, lambda: worker_rss_mb(server))
            unload(url, secret, name)
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
