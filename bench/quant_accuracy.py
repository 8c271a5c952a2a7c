"""How far a GGUF file's quantized in-memory form (load dtype automatic) is from the same file expanded to float32
(load dtype "float32"): logits on fixed prompts, and for how many greedy tokens they agree. Model: the random 85M
Llama as Q8_0 and Q4_0 (bench/random_model.py), and any other file of it --gguf names (a K-quant); stories260K's
Q8_0 case is a test (tests/engine/test_quantized_weights.py).

Run: .venv/bin/python bench/quant_accuracy.py [--models DIR] [--tokens 64] [--gguf var/bench/random85m-Q4_K_M.gguf]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.random_model import write_quantized_gguf  # noqa: E402
from inference.engine.loaders.loading import linear_formats, load_model  # noqa: E402

PROMPTS = [[1, 403, 407, 261, 378], [1, 365, 185, 30, 300, 420, 9, 15], [1, 22, 33, 44, 55, 66, 77, 88, 99]]


def greedy(runner, prompt: list[int], count: int) -> tuple[torch.Tensor, list[int]]:
    slot = runner.allocate_slot()
    logits = runner.prefill(slot, prompt, all_logits=True)
    token, tokens = int(logits[-1].argmax()), []
    for _ in range(count):
        tokens.append(token)
        token = int(runner.decode([slot], [token])[0].argmax())
    runner.free_slot(slot)
    return logits, tokens


def compare(path: Path, count: int) -> dict:
    kept = load_model(path, max_concurrent=1, context_window=256)
    expanded = load_model(path, dtype="float32", max_concurrent=1, context_window=256)
    worst, agree, total = 0.0, 0, 0
    for prompt in PROMPTS:
        (got, got_tokens), (want, want_tokens) = (greedy(m.runner, prompt, count) for m in (kept, expanded))
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        pairs = enumerate(zip(got_tokens, want_tokens, strict=True))
        agree += next((i for i, (a, b) in pairs if a != b), count)
        total += count
    return {
        "formats": linear_formats(kept.runner.model),
        "max_logit_diff": worst,
        "greedy_prefix_agreement": f"{agree}/{total}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared/models")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--gguf",
        action="append",
        default=[],
        type=Path,
        help="another GGUF file of the 85M model (a K-quant that llama.cpp's llama-quantize wrote); repeatable",
    )
    args = parser.parse_args()
    stories_hf, stories_gguf = args.models / "stories260K-hf", args.models / "stories260K.gguf"
    for qtype in ("Q8_0", "Q4_0"):
        path = write_quantized_gguf(stories_hf, stories_gguf, qtype)
        print(f"85M {qtype}", compare(path, args.tokens), flush=True)
    for path in args.gguf:
        print(path.stem, compare(path, args.tokens), flush=True)


if __name__ == "__main__":
    main()
