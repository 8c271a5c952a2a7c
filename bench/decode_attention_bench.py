"""A decode step's time with attention through the paged kernel (paged_attention.py) against the gather-and-SDPA
path, and with a float32 against a 16-bit KV cache: the random 85M Llama (bench/random_model.py) in one format,
N rows each holding `--context` tokens, the kinds interleaved round by round on the same runner and KV.

Run: .venv/bin/python bench/decode_attention_bench.py [--models DIR] [--format Q8_0] [--batches 1,8,32]
     [--context 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.random_model import write_quantized_gguf, write_random_llama  # noqa: E402
from inference.engine.loaders.loading import load_model  # noqa: E402

ROUNDS = 6
STEPS = 3  # per round and kind


def step_ms(path: Path, batch: int, context: int, kv_dtype: str) -> dict[str, float]:
    """Median ms per decode step through the kernel and (for float32) through the gather path."""
    loaded = load_model(path, max_concurrent=batch, context_window=context + 64, kv_dtype=kv_dtype)
    runner = loaded.runner
    gen = torch.Generator().manual_seed(0)
    slots = [runner.allocate_slot() for _ in range(batch)]
    for slot in slots:
        runner.prefill(slot, torch.randint(3, loaded.config.vocab_size, (context,), generator=gen).tolist())
    tokens = [5] * batch
    kinds = {f"kernel {kv_dtype}": True} | ({"gather float32": False} if kv_dtype == "float32" else {})
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(ROUNDS):
        for kind, kernel in kinds.items():
            runner.cache.paged_decode = kernel
            start = time.perf_counter()
            for _ in range(STEPS):
                runner.decode(slots, tokens)
            times[kind].append(1000 * (time.perf_counter() - start) / STEPS)
            for slot in slots:
                runner.truncate(slot, context)
    return {kind: statistics.median(t) for kind, t in times.items()}


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", repo.parent / "shared" / "models"))
    )
    parser.add_argument("--format", default="Q8_0", choices=("F32", "Q8_0", "Q4_0"))
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    _, f32 = write_random_llama(stories_hf, stories_gguf)
    path = f32 if args.format == "F32" else write_quantized_gguf(stories_hf, stories_gguf, args.format)
    print(f"{torch.get_num_threads()} threads; 85M {args.format}; {args.context} tokens per row; median ms per step")
    print("| batch | gather float32 | kernel float32 | kernel float16 | kernel bfloat16 |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for batch in (int(b) for b in args.batches.split(",")):
        row: dict[str, float] = {}
        for kv_dtype in ("float32", "float16", "bfloat16"):
            row |= step_ms(path, batch, args.context, kv_dtype)
        cells = [row["gather float32"], row["kernel float32"], row["kernel float16"], row["kernel bfloat16"]]
        print(f"| {batch} | " + " | ".join(f"{ms:.1f}" for ms in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
