"""One decode step of a served model's runner, alone: microseconds per step at a batch size, on one thread (the
kernels' pool and torch's), the median of 7 blocks of steps. What a change to the step's Python costs shows here
before it drowns in the HTTP path's noise; run it in two trees, alternating, to compare them.

Run: .venv/bin/python bench/decode_step_bench.py [--batch 1] [--model ../shared/models/stories260K.gguf]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
torch.set_num_threads(1)  # before the kernels' pool is sized from it

from inference.engine.loaders.loading import load_model  # noqa: E402

MODELS = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--model", type=Path, default=MODELS / "stories260K.gguf")
    parser.add_argument("--steps", type=int, default=200, help="decode steps per block")
    args = parser.parse_args()
    runner = load_model(str(args.model)).runner
    blocks = []
    for _ in range(7):
        slots = [runner.allocate_slot() for _ in range(args.batch)]
        for slot in slots:
            runner.prefill(slot, [1, 400, 300])
        start = time.perf_counter()
        for _ in range(args.steps):
            runner.decode(slots, [5] * args.batch)
        blocks.append((time.perf_counter() - start) / args.steps * 1e6)
        for slot in slots:
            runner.free_slot(slot)
    planned = "planned" if getattr(runner, "plan", None) is not None else "forward"
    print(f"{args.model.name} batch {args.batch} ({planned}): {statistics.median(blocks):.1f} µs per step (median)")


if __name__ == "__main__":
    main()
