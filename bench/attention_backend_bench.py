"""A decode step's and a prefill's time per attention backend (gather, flex: docs/attention.md) on the CPU, float32:
stories260K (or the model at --path) with N rows each holding `--context` tokens, and one prompt of `--prompt`
tokens prefilled at once.

Run: .venv/bin/python bench/attention_backend_bench.py [--path DIR] [--batches 1,8] [--context 128] [--prompt 256]
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
from inference.engine.execution.runner import ATTENTION_BACKENDS  # noqa: E402
from inference.engine.loaders.loading import load_model  # noqa: E402

ROUNDS = 5
STEPS = 4  # decode steps per round


def timings(path: Path, attention: str, batches: list[int], context: int, prompt: int) -> dict[str, float]:
    """Median ms of a decode step at each batch size, and of the prefill."""
    loaded = load_model(path, max_concurrent=max(batches), context_window=max(context, prompt) + 64,
                        attention=attention)  # fmt: skip
    runner, gen = loaded.runner, torch.Generator().manual_seed(0)
    out = {}
    for batch in batches:
        slots = [runner.allocate_slot() for _ in range(batch)]
        for slot in slots:
            runner.prefill(slot, torch.randint(3, loaded.config.vocab_size, (context,), generator=gen).tolist())
        times = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            for _ in range(STEPS):
                runner.decode(slots, [5] * batch)
            times.append(1000 * (time.perf_counter() - start) / STEPS)
            for slot in slots:
                runner.truncate(slot, context)
        out[f"decode x{batch} ms"] = statistics.median(times)
        for slot in slots:
            runner.free_slot(slot)
    ids = torch.randint(3, loaded.config.vocab_size, (prompt,), generator=gen).tolist()
    times = []
    for _ in range(ROUNDS):
        slot = runner.allocate_slot()
        start = time.perf_counter()
        runner.prefill(slot, ids)
        times.append(1000 * (time.perf_counter() - start))
        runner.free_slot(slot)
        ids = [ids[-1], *ids[:-1]]  # another prompt each round: no prefix hit
    out[f"prefill {prompt} ms"] = statistics.median(times)
    return out


def main() -> None:
    models = Path(
        os.environ.get("PANTHEON_TEST_MODELS", Path(__file__).resolve().parent.parent.parent / "shared" / "models")
    )
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", type=Path, default=models / "stories260K-hf")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{args.path.name}, context {args.context}, one thread")
    for attention in ATTENTION_BACKENDS:
        row = timings(args.path, attention, batches, args.context, args.prompt)
        print(f"{attention:7s} " + "  ".join(f"{name} {ms:8.2f}" for name, ms in row.items()))


if __name__ == "__main__":
    main()
