"""Decode speed of grammar-constrained batches against an unconstrained one, engine only (no HTTP, no IPC).

The random ~85M-parameter Llama (bench/random_model.py, stories260K's 512-token vocabulary), float32. A batch of 8
sequences goes through the scheduler as the worker runs it (`Scheduler.add`, then `step()` until every sequence
is done), each asked for DECODE_TOKENS tokens with temperature 1 and its own seed: once with no grammar, once with
the grammar the API edge builds for a json_schema response_format (inference/api/response_format.py) whose
answers cannot end before DECODE_TOKENS (an array of 64 to 200 small integers), and once with the grammar of
`tool_choice: "required"` (inference/engine/contract/dialects/grammar.py, Hermes dialect) for one tool whose
argument is that array. The batches alternate, `--rounds` times each; the figure is generated tokens / wall time
of the steps, prefill included (the prompts are 8 tokens). The target: a constrained batch keeps >= 90% of the
unconstrained rate.

Run: .venv/bin/python bench/grammar_bench.py [--rounds 5] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

BATCH = 8
DECODE_TOKENS = 64
SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 64, "maxItems": 200}
TOOL = {
    "type": "function",
    "function": {
        "name": "record",
        "parameters": {"type": "object", "properties": {"values": SCHEMA}, "required": ["values"]},
    },
}


def run_batch(model, scheduler, grammars, grammar: str | None, seed: int) -> tuple[int, float]:
    """One batch of BATCH sequences through the scheduler -> (tokens generated, seconds)."""
    from inference.engine.contract.params import GenerationOptions, SamplingParams
    from inference.engine.sampler import SequenceSampling
    from inference.engine.sequence import Sequence
    from inference.engine.text.detokenizer import IncrementalDetokenizer

    sequences = []
    for i in range(BATCH):
        params = SamplingParams(temperature=1.0, seed=seed + i, grammar=grammar)
        matcher = grammars.matcher(grammar) if grammar is not None else None
        sequences.append(
            Sequence(
                f"r{seed}-{i}",
                model.tokenizer.encode("Once upon a time there was"),
                sampling=SequenceSampling(params, model.runner.vocab_size, matcher),
                detokenizer=IncrementalDetokenizer(model.tokenizer),
                options=GenerationOptions(max_tokens=DECODE_TOKENS),
                eos_token_ids=model.eos_token_ids,
                context_window=model.runner.context_window,
            )
        )
    start = time.perf_counter()
    for seq in sequences:
        scheduler.add(seq)
    while scheduler.has_work:
        scheduler.step()
    seconds = time.perf_counter() - start
    return sum(len(seq.output_ids) for seq in sequences), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import llguidance
    from random_model import write_random_llama

    from inference.api.response_format import plan_response_format
    from inference.engine.contract.dialects.grammar import tool_call_grammar
    from inference.engine.grammar import GrammarCompiler
    from inference.engine.loaders.loading import load_model
    from inference.engine.scheduler import Scheduler

    hf_dir, _ = write_random_llama(args.models / "stories260K-hf", args.models / "stories260K.gguf")
    model = load_model(hf_dir, max_concurrent=BATCH, context_window=256)
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=BATCH, queue_depth=BATCH, prefill_chunk=128)
    grammars = GrammarCompiler(model.tokenizer, model.runner.vocab_size)
    plan = plan_response_format({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, tools_present=False)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, {args.threads} threads; "
        f"vocabulary {model.runner.vocab_size}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    tool_grammar = llguidance.LLMatcher.grammar_from_lark(tool_call_grammar("hermes", [TOOL], mode="required"))
    batches = {"free": None, "json_schema": plan.grammar, "tool_call": tool_grammar}
    for grammar in batches.values():  # warm-up: compiles the grammars too
        run_batch(model, scheduler, grammars, grammar, seed=10_000)
    rates: dict[str, list[float]] = {kind: [] for kind in batches}
    tokens_seen: dict[str, list[int]] = {kind: [] for kind in batches}
    for round_ in range(args.rounds):
        for kind, grammar in list(batches.items())[:: 1 if round_ % 2 else -1]:
            tokens, seconds = run_batch(model, scheduler, grammars, grammar, seed=round_ * BATCH)
            rates[kind].append(tokens / seconds)
            tokens_seen[kind].append(tokens)
    print(f"batch of {BATCH}, {DECODE_TOKENS} tokens each, {args.rounds} rounds alternated: tok/s median (min-max)")
    for kind, values in rates.items():
        print(
            f"{kind:>12}: {statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f}), "
            f"tokens per batch {min(tokens_seen[kind])}-{max(tokens_seen[kind])}"
        )
    for kind in ("json_schema", "tool_call"):
        print(f"{kind} / free: {statistics.median(rates[kind]) / statistics.median(rates['free']):.2f}")


if __name__ == "__main__":
    main()
