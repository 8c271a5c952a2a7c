"""What the HTTP path costs: median latency of a `max_tokens: 1` chat completion through the whole platform
(HTTP, validation, dispatch, zmq to the worker, scheduling, back) against the same request run directly on the
engine in this process (chat template, tokenization, prefill, one sampled token).

Starts `manage.py serve` on a free loopback port with a temporary data folder and the embedded SQLite database,
so it needs no services. Run: .venv/bin/python bench/api_overhead.py [--model PATH] [--requests N]
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(REPO))

from inference.engine.contract import messages as p  # noqa: E402
from inference.engine.contract.params import GenerationOptions, SamplingParams  # noqa: E402
from inference.engine.hosted_model import HostedModel  # noqa: E402
from inference.engine.step_results import Ended  # noqa: E402

MESSAGES = [{"role": "user", "content": "Once upon a time"}]


def engine_latencies(model_path: str, requests: int) -> list[float]:
    hosted = HostedModel.load(p.Load(request_id="bench", name="bench", path=model_path), "cpu")
    latencies = []
    for i in range(requests):
        start = time.perf_counter()
        greedy = SamplingParams(temperature=0)
        seq = hosted.prepare(
            p.Submit(
                request_id=f"r{i}",
                model="bench",
                messages=MESSAGES,
                sampling=greedy,
                options=GenerationOptions(max_tokens=1),
            )
        )
        hosted.scheduler.add(seq)
        while not any(isinstance(m, Ended) for m in hosted.scheduler.step()):
            pass
        latencies.append(time.perf_counter() - start)
    return latencies


def http_latencies(model_path: str, requests: int) -> list[float]:
    with tempfile.TemporaryDirectory() as data_dir:
        env = {**os.environ, "PANTHEON_DATA_DIR": data_dir}
        env.pop("DATABASE_URL", None)
        env.pop("REDIS_URL", None)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=REPO, env=env, check=True)
        subprocess.run(
            [*manage, "load_model", model_path, "--name", "bench"],
            cwd=REPO,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        port = _free_port()
        server = subprocess.Popen(
            [*manage, "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for_model(url)
            body = {"model": "bench", "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
            latencies = []
            with httpx.Client(timeout=30) as client:
                for _ in range(requests):
                    start = time.perf_counter()
                    client.post(url + "/v1/chat/completions", json=body).raise_for_status()
                    latencies.append(time.perf_counter() - start)
            return latencies
        finally:
            server.terminate()
            server.wait(30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_model(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=1).json()["data"]:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not serve the model within {timeout} s")


def main() -> None:
    models = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(models / "stories260K.gguf"))
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    warm = 10
    direct = engine_latencies(args.model, args.requests + warm)[warm:]
    http = http_latencies(args.model, args.requests + warm)[warm:]
    d, h = statistics.median(direct), statistics.median(http)
    print(f"model {args.model}, {args.requests} requests each, max_tokens 1, median latency:")
    print(f"  engine, in process: {d * 1000:7.2f} ms")
    print(f"  HTTP, whole path:   {h * 1000:7.2f} ms  (p90 {statistics.quantiles(http, n=10)[-1] * 1000:.2f} ms)")
    print(f"  difference:         {(h - d) * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
