"""The weights barrier's costs through the HTTP API, on the random 85M Llama (float32, served from its HF directory).

Starts `manage.py serve` (bench/serve_bench.py's Server), creates a trainer token (so the load is attachable) and
measures, with a trainer in this process using pantheon_trainer/client.py:
  * attach: the call, and mapping every storage (one shared-memory file) into this process;
  * --cycles write cycles (quiesce, commit-begin, an in-place write, commit-end, resume) of two sizes: one norm
    vector, and every parameter (`add_(0)` over all of them); per cycle the wall time of the whole bracket and the
    server's commit_ms (commit-begin to commit-end, the span the watchdog guards);
  * save (every parameter to safetensors, fsynced) and an in-place load of that checkpoint;
  * decode throughput of the attachable layout (plain [out, in] linears, so parameters are views) against the usual
    repacked one, with serve_bench's streaming clients at N = 1 and 8.

Run: .venv/bin/python bench/weights_bench.py [--models DIR] [--cycles 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from random_model import write_random_llama  # noqa: E402
from serve_bench import Server, run_streams  # noqa: E402

from pantheon_trainer.client import WeightsClient  # noqa: E402


def create_token(server: Server, role: str, label: str) -> str:
    env = {**os.environ, "PANTHEON_DATA_DIR": str(server.data_dir)}
    done = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "create_token", "--role", role, "--label", label],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1].strip()


def load(server: Server, path: Path, name: str) -> None:
    body = {"path": str(path), "name": name, "max_concurrent": 8, "ctx_cap": 256, "device": "cpu"}
    headers = {"Authorization": f"Bearer {server.admin_secret}"}
    response = httpx.post(f"{server.url}/admin/models/load", json=body, headers=headers, timeout=600)
    response.raise_for_status()


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered) * 1000:7.2f} ms, p99 {p99 * 1000:7.2f} ms"


def cycles(client: WeightsClient, count: int, write) -> tuple[list[float], list[float]]:
    walls, commits = [], []
    for _ in range(count):
        started = time.perf_counter()
        with client.write() as tensors:
            write(tensors)
        walls.append(time.perf_counter() - started)
        commits.append(client.last_commit["commit_ms"] / 1000.0)
    return walls, commits


def decode(server: Server, name: str) -> str:
    rows = [asyncio.run(run_streams(server.url, name, n, 2, 64, True)) for n in (1, 8)]
    return ", ".join(f"N={n}: {row['tok_s']:.1f} tok/s" for n, row in zip((1, 8), rows, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    )
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()
    hf_dir, _ = write_random_llama(args.models / "stories260K-hf", args.models / "stories260K.gguf")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")

    server = Server({"WEIGHTS_HOLD_TIMEOUT_S": "60", "WEIGHTS_COMMIT_WATCHDOG_MS": "60000"})
    try:
        load(server, hf_dir, "packed")
        print(f"decode, usual layout:      {decode(server, 'packed')}")
        httpx.post(
            f"{server.url}/admin/models/unload",
            json={"name": "packed"},
            timeout=120,
            headers={"Authorization": f"Bearer {server.admin_secret}"},
        ).raise_for_status()
        token = create_token(server, "trainer", "bench")
        load(server, hf_dir, "random85m")
        print(f"decode, attachable layout: {decode(server, 'random85m')}")
        client = WeightsClient(server.url, token)
        started = time.perf_counter()
        client.attach()
        attach_s = time.perf_counter() - started
        pinned = client.attached["release"]["pinned_bytes"]
        print(
            f"attach: {attach_s * 1000:.1f} ms for {len(client.tensors)} parameters in "
            f"{len(client.attached['storages'])} storage(s), {pinned / 2**20:.1f} MiB"
        )
        walls, commits = cycles(client, args.cycles, lambda t: t["model.norm.weight"].mul_(1.0))
        print(f"cycle, one norm vector:   bracket {ms(walls)}; commit {ms(commits)}")
        walls, commits = cycles(client, args.cycles, lambda t: [p.add_(0.0) for p in t.values()])
        print(f"cycle, every parameter:   bracket {ms(walls)}; commit {ms(commits)}")
        started = time.perf_counter()
        saved = client.save("bench")
        print(f"save: {(time.perf_counter() - started) * 1000:.0f} ms")
        started = time.perf_counter()
        client.call("load", {"checkpoint": saved["name"]})
        print(
            f"in-place load of the checkpoint (sha256 check, read, write): "
            f"{(time.perf_counter() - started) * 1000:.0f} ms"
        )
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
