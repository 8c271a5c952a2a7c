"""The decode step eager against compiled (compiled_step.py), engine only: ms per step at batch 1, 8 and 32, and the
warm-up each bucket costs. Eager and compiled steps alternate in rounds on the same runner and KV, so a noisy
machine slows both alike; the medians are reported.

Models: stories260K (GGUF) and the random ~85M Llama (bench/random_model.py, GGUF F32), float32.
Run: .venv/bin/python bench/compiled_step_bench.py [--models DIR] [--only stories260K,85M-F32] [--threads 1]
[--cold] (--cold: a fresh inductor cache, so the warm-up includes generating and building every kernel).

--serve: the same through the whole server instead (serve_bench.py's server and streaming clients), each model
loaded with compile off and then on (max_concurrent 32, ctx_cap 256): tok/s, TTFT and ITL at N = 1, 8, 32, with
the load's time and its `graphs` report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from random_model import write_random_llama  # noqa: E402

from inference.engine.loaders.loading import load_model  # noqa: E402

PROMPT_TOKENS = 128
ROUNDS = 8
STEPS_PER_ROUND = 8
BATCHES = (1, 8, 32)


def step_ms(runner, slots: list[int], tokens: list[int], compiled: bool, graphs) -> tuple[float, list[int]]:
    runner.graphs = graphs if compiled else None
    start = time.perf_counter()
    tokens = runner.decode(slots, tokens).argmax(-1).tolist()
    return 1000 * (time.perf_counter() - start), tokens


def bench_model(path: Path, label: str, threads: int) -> None:
    steps = 2 * ROUNDS * STEPS_PER_ROUND + 1
    loaded = load_model(path, max_concurrent=max(BATCHES), context_window=PROMPT_TOKENS + steps + 8)
    runner = loaded.runner
    graphs = runner.compile_decode(threads=threads, buckets=list(BATCHES))
    warm = ", ".join(f"{b}: {ms / 1000:.1f} s" for b, ms in sorted(graphs.bucket_ms.items()))
    print(
        f"{label}: mode {graphs.mode}, warm-up {graphs.warmup_ms / 1000:.1f} s ({warm}) {graphs.fallback_reason or ''}"
    )
    gen = torch.Generator().manual_seed(0)
    for batch in BATCHES:
        prompts = [torch.randint(3, loaded.config.vocab_size, (PROMPT_TOKENS,), generator=gen).tolist() for _ in
                   range(batch)]  # fmt: skip
        slots = [runner.allocate_slot() for _ in range(batch)]
        tokens = runner.prefill_batch(slots, prompts).argmax(-1).tolist()
        _, tokens = step_ms(runner, slots, tokens, True, graphs)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(ROUNDS):
            for compiled in (False, True):
                for _ in range(STEPS_PER_ROUND):
                    ms, tokens = step_ms(runner, slots, tokens, compiled, graphs)
                    times[compiled].append(ms)
        for slot in slots:
            runner.free_slot(slot)
        eager, compiled = statistics.median(times[False]), statistics.median(times[True])
        print(f"{label:<12} {batch:>5} {eager:>10.2f} {compiled:>13.2f} {eager / compiled:>8.2f}x", flush=True)
    runner.graphs = graphs


def bench_serving(models: list[tuple[Path, str]], streams: list[int], rounds: int) -> None:
    import asyncio

    import httpx
    from serve_bench import Server, run_streams, unload

    server = Server({})
    headers = {"Authorization": f"Bearer {server.admin_secret}", "X-Pantheon-Actor": "compiled_step_bench"}
    try:
        header = f"{'model':<12} {'compile':>7} {'N':>3} {'tok/s':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}"
        print(f"{header} {'ITL p50 ms':>11}")
        for path, label in models:
            max_tokens, logprobs = (128, False) if label == "stories260K" else (64, True)
            for compile_ in (False, True):
                body = {"path": str(path), "name": label, "max_concurrent": 32, "ctx_cap": 256, "compile": compile_}
                started = time.perf_counter()
                response = httpx.post(f"{server.url}/admin/models/load", json=body, headers=headers, timeout=1800)
                response.raise_for_status()
                took = time.perf_counter() - started
                print(f"{label}: compile {compile_}, load {took:.1f} s, graphs {response.json()['graphs']}")
                for n in streams:
                    row = asyncio.run(run_streams(server.url, label, n, rounds, max_tokens, logprobs))
                    print(
                        f"{label:<12} {compile_!s:>7} {n:>3} {row['tok_s']:>8.1f} {row['ttft_median_ms']:>12.1f} "
                        f"{row['ttft_p99_ms']:>12.1f} {row['itl_median_ms']:>11.2f}",
                        flush=True,
                    )
                unload(server.url, server.admin_secret, label)
    finally:
        server.stop()


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", repo.parent / "shared" / "models"))
    )
    parser.add_argument("--only", help="comma-separated model labels (stories260K, 85M-F32)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads, eager and compiled alike")
    parser.add_argument("--cold", action="store_true", help="start from an empty inductor cache")
    parser.add_argument("--serve", action="store_true", help="through the whole server (serve_bench.py's clients)")
    parser.add_argument("--streams", default="1,8,32", help="with --serve: comma-separated client counts")
    parser.add_argument("--rounds", type=int, default=2, help="with --serve: requests per client")
    args = parser.parse_args()
    if args.cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")
    torch.set_num_threads(args.threads)
    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    _, random_gguf = write_random_llama(stories_hf, stories_gguf)
    cache = "cold" if args.cold else "warm"
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, {args.threads} threads, inductor cache {cache}")
    models = [(stories_gguf, "stories260K"), (random_gguf, "85M-F32")]
    if args.only:
        models = [(path, label) for path, label in models if label in args.only.split(",")]
    if args.serve:
        bench_serving(models, [int(n) for n in args.streams.split(",")], args.rounds)
        return
    print(f"{'model':<12} {'batch':>5} {'eager ms':>10} {'compiled ms':>13} {'speed-up':>9}")
    for path, label in models:
        bench_model(path, label, args.threads)


if __name__ == "__main__":
    main()
