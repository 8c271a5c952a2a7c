"""Engine-only throughput: prefill and decode tokens/s at batch 1, 8 and 32, with no HTTP or IPC in the way.

Models: stories260K (the real tiny model) and a random ~85M-parameter Llama (bench/random_model.py), from its HF
directory and as GGUF in F32, Q8_0 and Q4_0 (in memory: float32, then what quant/stored_quant.py picks for this CPU).
Decode is greedy (argmax of the batch's logits). Also measures this machine's copy bandwidth, to put batch-1 decode
next to its floor: weight bytes read per token / bandwidth. Run: .venv/bin/python bench/engine_bench.py [--models DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from random_model import write_quantized_gguf, write_random_llama  # noqa: E402

from inference.engine.loaders.loading import load_model  # noqa: E402

PROMPT_TOKENS = 128
DECODE_STEPS = 64
BATCHES = (1, 8, 32)


def copy_bandwidth_gbs(nbytes: int = 512 * 2**20, repeats: int = 10) -> float:
    """Bytes read plus bytes written per second by a large tensor copy."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    return 2 * nbytes * repeats / (time.perf_counter() - start) / 1e9


def bench_model(path: Path, label: str) -> list[dict]:
    loaded = load_model(path, max_concurrent=max(BATCHES), context_window=PROMPT_TOKENS + DECODE_STEPS + 8)
    runner = loaded.runner
    vocab = loaded.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in BATCHES:
        prompts = [torch.randint(3, vocab, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(batch)]
        slots = [runner.allocate_slot() for _ in range(batch)]
        start = time.perf_counter()
        last = torch.stack([runner.prefill(slot, prompt) for slot, prompt in zip(slots, prompts, strict=True)])
        prefill_s = time.perf_counter() - start
        tokens = last.argmax(-1).tolist()
        runner.decode(slots, tokens)  # warm-up step
        start = time.perf_counter()
        for _ in range(DECODE_STEPS):
            tokens = runner.decode(slots, tokens).argmax(-1).tolist()
        decode_s = time.perf_counter() - start
        for slot in slots:
            runner.free_slot(slot)
        rows.append(
            {
                "model": label,
                "batch": batch,
                "prefill_tok_s": batch * PROMPT_TOKENS / prefill_s,
                "decode_tok_s": batch * DECODE_STEPS / decode_s,
                "decode_ms_per_step": 1000 * decode_s / DECODE_STEPS,
                "weight_bytes": loaded.weight_bytes,
            }
        )
    return rows


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", repo.parent / "shared" / "models"))
    )
    parser.add_argument(
        "--only", help="comma-separated model labels (stories260K, random85M, 85M-F32, 85M-Q8_0, 85M-Q4_0)"
    )
    args = parser.parse_args()
    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    random_hf, random_gguf = write_random_llama(stories_hf, stories_gguf)
    quantized = [(write_quantized_gguf(stories_hf, stories_gguf, q), f"85M-{q}") for q in ("Q8_0", "Q4_0")]
    bandwidth = copy_bandwidth_gbs()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; copy bandwidth {bandwidth:.1f} GB/s (read+write)"
    )
    print(
        f"{'model':<12} {'batch':>5} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/step':>8} {'floor ms':>9} "
        f"{'step/floor':>10}"
    )
    models = [(stories_hf, "stories260K"), (random_hf, "random85M"), (random_gguf, "85M-F32"), *quantized]
    if args.only:
        models = [(path, label) for path, label in models if label in args.only.split(",")]
    for path, label in models:
        for row in bench_model(path, label):
            floor_ms = 1000 * row["weight_bytes"] / (bandwidth * 1e9)  # weight bytes per token / copy bandwidth
            print(
                f"{row['model']:<12} {row['batch']:>5} {row['prefill_tok_s']:>14.0f} {row['decode_tok_s']:>13.1f} "
                f"{row['decode_ms_per_step']:>8.2f} {floor_ms:>9.2f} {row['decode_ms_per_step'] / floor_ms:>10.2f}"
            )


if __name__ == "__main__":
    main()
