"""What a step that prefills costs when decoders are running: one forward pass for a prompt chunk and the decode
rows together (ModelRunner.step, what the scheduler runs) against the same work as two passes (the chunk, then the
decode batch), per chunk size, for the random 85M Llama (bench/random_model.py) in F32 and Q8_0. The chunk sizes
are what the scheduler's per-step prompt budget (`prefill_chunk`) can be set to; the table says what each costs
the decoders that share the step.

Run: .venv/bin/python bench/mixed_step_bench.py [--models DIR] [--decoders 8] [--chunks 16,64,128,256,512]
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

CONTEXT = 128  # tokens each decoder holds
ROUNDS = 7
KINDS = ("decode only", "chunk alone", "one pass", "two passes")


def measure(path: Path, decoders: int, chunks: list[int]) -> list[dict]:
    longest = max(chunks)
    loaded = load_model(path, max_concurrent=decoders + 1, context_window=CONTEXT + longest + 64)
    runner = loaded.runner
    gen = torch.Generator().manual_seed(0)

    def prompt(length: int) -> list[int]:
        return torch.randint(3, loaded.config.vocab_size, (length,), generator=gen).tolist()

    slots = [runner.allocate_slot() for _ in range(decoders)]
    for slot in slots:
        runner.prefill(slot, prompt(CONTEXT))
    tokens = [5] * decoders

    def once(kind: str, chunk: int) -> float:
        """ms of one step of that kind; the decoders are put back at CONTEXT tokens afterwards."""
        fresh, ids = runner.allocate_slot(), prompt(chunk)
        start = time.perf_counter()
        if kind == "decode only":
            runner.decode(slots, tokens)
        elif kind == "chunk alone":
            runner.prefill(fresh, ids)
        elif kind == "one pass":
            runner.step([(fresh, ids)], slots, tokens)
        else:
            runner.prefill(fresh, ids)
            runner.decode(slots, tokens)
        elapsed = 1000 * (time.perf_counter() - start)
        runner.free_slot(fresh)
        for slot in slots:
            runner.truncate(slot, CONTEXT)
        return elapsed

    rows = []
    for chunk in chunks:  # the kinds alternate within each round, so a busy minute hits them alike
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(ROUNDS):
            for kind in KINDS:
                times[kind].append(once(kind, chunk))
        rows.append({"chunk": chunk} | {kind: statistics.median(t) for kind, t in times.items()})
    return rows


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", repo.parent / "shared" / "models"))
    )
    parser.add_argument("--decoders", type=int, default=8)
    parser.add_argument("--chunks", default="16,64,128,256,512")
    parser.add_argument("--formats", default="F32,Q8_0")
    args = parser.parse_args()
    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    _, f32 = write_random_llama(stories_hf, stories_gguf)
    chunks = [int(c) for c in args.chunks.split(",")]
    threads = torch.get_num_threads()
    print(f"{threads} threads; {args.decoders} decoders at {CONTEXT} tokens; median ms of {ROUNDS} interleaved rounds")
    print("| format | chunk | decode only | chunk alone | chunk + decode, one pass | two passes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.formats.split(","):
        path = f32 if name == "F32" else write_quantized_gguf(stories_hf, stories_gguf, name)
        for row in measure(path, args.decoders, chunks):
            print(f"| {name} | {row['chunk']} | " + " | ".join(f"{row[kind]:.1f}" for kind in KINDS) + " |")


if __name__ == "__main__":
    main()
