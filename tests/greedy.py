"""The suite's one greedy reference: what a model generates when nothing but its runner decodes, one prompt on one
slot, one token at a time. Tests hold the scheduler, the worker, the HTTP routes and the other load paths (int8,
16-bit KV, attachable weights, quantized GGUF) to it; and, for the tests of batched execution (compiled,
planned), the same greedy decode of several prompts together (`greedy_batch`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Collection

    from inference.engine.execution.runner import ModelRunner


@dataclass
class Greedy:
    """The tokens, the prefill's logits ([V], or [S, V] when every position's was asked for) and each decode step's
    logits [V] (the step that chose tokens[i + 1] is steps[i])."""

    tokens: list[int]
    prompt_logits: torch.Tensor
    steps: list[torch.Tensor] = field(default_factory=list)


def greedy(
    runner: ModelRunner, prompt: list[int], count: int, *, stop: Collection[int] = (), all_logits: bool = False
) -> Greedy:
    """`count` greedy tokens after `prompt`, fewer when a token in `stop` (e.g. the model's EOS ids) comes first: that
    token is the last one kept. The slot is freed afterwards."""
    slot = runner.allocate_slot()
    try:
        prompt_logits = runner.prefill(slot, prompt, all_logits=all_logits)
        logits = prompt_logits[-1] if all_logits else prompt_logits
        result = Greedy([], prompt_logits)
        while True:
            result.tokens.append(int(logits.argmax()))
            if len(result.tokens) >= count or result.tokens[-1] in stop:
                return result
            logits = runner.decode([slot], [result.tokens[-1]])[0]
            result.steps.append(logits)
    finally:
        runner.free_slot(slot)


def greedy_batch(runner: ModelRunner, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], torch.Tensor]:
    """The prompts' greedy continuations decoded together (prefilled as one batch, then `steps` decode steps), and
    every decode step's logits [steps, B, V]. The slots are freed afterwards."""
    slots = [runner.allocate_slot() for _ in prompts]
    try:
        tokens = runner.prefill_batch(slots, prompts).argmax(-1).tolist()
        out, logits = [[token] for token in tokens], []
        for _ in range(steps):
            logits.append(runner.decode(slots, tokens))
            tokens = logits[-1].argmax(-1).tolist()
            for row, token in zip(out, tokens, strict=True):
                row.append(token)
        return out, torch.stack(logits)
    finally:
        for slot in slots:
            runner.free_slot(slot)
