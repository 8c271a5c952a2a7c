"""Time to first token of a repeated long prompt after another prompt pushed it out of the KV pool, with the prefix
cache's host tier (kv/host_tier.py) and without: the random 85M Llama (bench/random_model.py), F32, a pool of one
window, the engine's runner alone (no serve). With the tier the prompt's full blocks are copied back and only its
last positions are prefilled; without it the whole prompt is prefilled again.

Run: .venv/bin/python bench/host_tier_bench.py [--models DIR] [--prompt 1000] [--host-mb 128] [--device cpu]
[--path HF_DIR --window N] (another model, e.g. a real-shape one of bench/gpu_check.py, with a window for the prompt)
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
from bench.random_model import write_random_llama  # noqa: E402
from inference.engine.loaders.loading import load_model  # noqa: E402

ROUNDS = 5


def first_token_ms(path: Path, window: int, prompt_tokens: int, host_bytes: int, device: str) -> tuple[float, int]:
    """Median ms from the repeated prompt's arrival to its first token's logits, after each round's other prompt
    took the pool, and the tokens reused in the last round."""
    loaded = load_model(path, device=device, max_concurrent=1, context_window=window, host_cache_bytes=host_bytes)
    runner = loaded.runner
    gen = torch.Generator().manual_seed(0)
    repeated, other = (
        torch.randint(3, loaded.config.vocab_size, (n,), generator=gen).tolist() for n in (prompt_tokens, window)
    )

    def run(prompt: list[int]) -> int:
        slot = runner.allocate_slot()
        reused = runner.reuse_prefix(slot, prompt)
        runner.prefill(slot, prompt[reused:])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        runner.free_slot(slot)
        return reused

    run(repeated)
    times, reused = [], 0
    for _ in range(ROUNDS):
        run(other)  # a whole window: every block of the repeated prompt leaves the pool
        start = time.perf_counter()
        reused = run(repeated)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times), reused


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", repo.parent / "shared" / "models"))
    )
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--host-mb", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--path", type=Path, help="a Hugging Face directory (default: the random 85M Llama)")
    parser.add_argument("--window", type=int, default=1024, help="the pool's one window (the 85M model's limit)")
    args = parser.parse_args()
    hf_dir = args.path or write_random_llama(args.models / "stories260K-hf", args.models / "stories260K.gguf")[0]
    print(f"{'host tier':>10} {'prompt':>7} {'reused':>7} {'first token ms':>15}")
    for host_mb in (0, args.host_mb):
        ms, reused = first_token_ms(hf_dir, args.window, args.prompt, host_mb * 2**20, args.device)
        print(f"{host_mb:>7} MB {args.prompt:>7} {reused:>7} {ms:>15.1f}")


if __name__ == "__main__":
    main()
