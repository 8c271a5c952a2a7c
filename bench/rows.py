"""The real-size benchmark's rows, each against its bound: decode tok/s at a batch and a context, whose bound is the
bytes a step must read (the weights a step streams, and every row's live KV) over the card's bandwidth, and prefill
tok/s, whose bound is the FLOPs the prompts need over the card's matmul rate.

A decode row's contexts are filled without a forward pass: each slot is given random keys and values on the device
(`KVCache.write`), so a 64 x 2k-token row costs no 131k-token prefill; attention reads bytes whatever they hold. The
timed steps then decode greedily from there, and the slots are truncated back to the context for the next batch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
from card import Card, synchronize
from real_model import RandomModel

from inference.engine.execution.runner import DEFAULT_BLOCK_SIZE, ModelRunner, pool_blocks

WARMUP_STEPS = 2  # untimed decode steps before the timed ones (cuBLAS and allocator warm-up)
WORKING_BYTES = 2 << 30  # device memory a row needs beside its KV pool (activations, logits, graphs' pool)


@dataclass(frozen=True, slots=True)
class Settings:
    """How the rows are run: timed decode steps, CUDA graphs (compile_decode) or eager, a fixed window or none."""

    steps: int
    graphs: bool
    window: int | None  # a context window for every decode runner, where larger than the row's context and steps


def free_bytes(device: torch.device) -> int:
    """Memory a new KV pool may take now: the device's free memory and what torch's allocator holds unused."""
    if device.type == "cuda":
        return (
            torch.cuda.mem_get_info(device)[0]
            + torch.cuda.memory_reserved(device)
            - torch.cuda.memory_allocated(device)
        )
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def window_for(context: int, settings: Settings) -> int:
    """The runner's context window for rows at `context`: room for the warm-up and timed steps, in whole blocks, or
    settings.window where that is larger (a serving window longer than the rows' sequences)."""
    needed = pool_blocks(context + WARMUP_STEPS + settings.steps + 1, DEFAULT_BLOCK_SIZE) * DEFAULT_BLOCK_SIZE
    return max(needed, settings.window or 0)


def pool_bytes(built: RandomModel, sequences: int, window: int) -> int:
    """Bytes of the KV pool a ModelRunner allocates for `sequences` full windows."""
    return sequences * pool_blocks(window, DEFAULT_BLOCK_SIZE) * DEFAULT_BLOCK_SIZE * built.kv_bytes_per_token()


def decode_bound(built: RandomModel, card_bandwidth: float | None, batch: int, kv_tokens: float) -> float | None:
    """tok/s if a step took only the time to read the streamed weights and the live KV at `card_bandwidth`."""
    if card_bandwidth is None:
        return None
    step_bytes = built.streamed_bytes + kv_tokens * built.kv_bytes_per_token()
    return batch * card_bandwidth / step_bytes


def prefill_flops(built: RandomModel, prompts: int, tokens: int) -> int:
    """FLOPs of prefilling `prompts` prompts of `tokens` tokens: every linear layer over every token, the output
    head over each prompt's last position, causal attention (q.k and p.v over the positions at or before each)."""
    c = built.config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    linear = 2 * prompts * tokens * c.num_layers * per_layer + 2 * prompts * c.hidden_size * c.vocab_size
    attention = c.num_layers * prompts * 2 * 2 * q * tokens * (tokens + 1) // 2
    return linear + attention


def ratio(measured: float, bound: float | None) -> float | None:
    return None if bound is None else measured / bound


def skipped(kind: str, built: RandomModel, attention: str, batch: int, context: int, reason: str) -> dict:
    return {
        "kind": kind, "model": built.name, "attention": attention, "batch": batch, "context": context,
        "skipped": reason,
    }  # fmt: skip


def fill(runner: ModelRunner, slots: list[int], context: int, seed: int) -> None:
    """Gives each slot `context` random token ids and random keys and values, made on the device: one tensor of
    each serves every layer and slot (the bytes attention reads are each slot's own blocks all the same)."""
    cache = runner.cache
    generator = torch.Generator(device=runner.device).manual_seed(seed)
    shape = (runner.model.config.num_kv_heads, context, runner.model.config.head_dim)
    keys, values = (
        torch.randn(shape, generator=generator, device=runner.device, dtype=cache.keys[0].dtype) for _ in range(2)
    )
    layers = len(cache.keys)
    ids = torch.randint(3, runner.vocab_size, (len(slots), context), generator=torch.Generator().manual_seed(seed))
    for slot, token_ids in zip(slots, ids.tolist(), strict=True):
        cache.write(slot, token_ids, [keys] * layers, [values] * layers)


@torch.inference_mode()
def seconds_per_step(runner: ModelRunner, slots: list[int], steps: int) -> float:
    """Seconds per greedy decode step of `slots` as one batch, over `steps` steps after WARMUP_STEPS untimed."""
    tokens = [1] * len(slots)
    for _ in range(WARMUP_STEPS):
        tokens = runner.decode(slots, tokens).argmax(-1).tolist()
    synchronize(runner.device)
    start = time.perf_counter()
    for _ in range(steps):
        tokens = runner.decode(slots, tokens).argmax(-1).tolist()
    synchronize(runner.device)
    return (time.perf_counter() - start) / steps


def decode_row(
    built: RandomModel, card: Card, attention: str, mode: str, batch: int, context: int, step_s: float, steps: int
) -> dict:
    """A measured decode row: the live KV a timed step reads on average is each row's context, the warm-up's
    tokens and half the timed ones (plus the token the step writes)."""
    kv_tokens = batch * (context + WARMUP_STEPS + (steps + 1) / 2)
    tok_s = batch / step_s
    bound = decode_bound(built, card.bandwidth, batch, kv_tokens)
    nominal = decode_bound(built, card.nominal_bandwidth, batch, kv_tokens)
    return {
        "kind": "decode", "model": built.name, "attention": attention, "mode": mode, "batch": batch,
        "context": context, "tok_s": tok_s, "ms_per_step": 1000 * step_s, "kv_tokens": kv_tokens,
        "streamed_bytes": built.streamed_bytes, "kv_bytes": kv_tokens * built.kv_bytes_per_token(),
        "bandwidth": card.bandwidth, "bound_tok_s": bound, "ratio": ratio(tok_s, bound),
        "nominal_bound_tok_s": nominal, "nominal_ratio": ratio(tok_s, nominal),
    }  # fmt: skip


def decode_rows(built: RandomModel, card: Card, attention: str, context: int, batches: list[int], settings: Settings):
    """Yields the decode rows of `batches` at `context` through one runner: its pool sized for the largest batch
    whose KV fits in the device's free memory (the others are skipped rows, saying why), its decode steps captured
    per batch when settings.graphs, its slots filled once and truncated back to `context` after each row."""
    device, window = built.model.norm.weight.device, window_for(context, settings)
    fitting = []
    for batch in batches:
        need, free = pool_bytes(built, batch, window) + WORKING_BYTES, free_bytes(device)
        if need > free:
            reason = f"KV pool {pool_bytes(built, batch, window) / 1e9:.1f} GB + {WORKING_BYTES / 1e9:.1f} GB working"
            yield skipped("decode", built, attention, batch, context, f"{reason} > {free / 1e9:.1f} GB free")
        else:
            fitting.append(batch)
    if not fitting:
        return
    runner = ModelRunner(built.model, max_concurrent=max(fitting), context_window=window, attention=attention)
    if settings.graphs:  # before the fill: each bucket's warm-up takes fresh slots of its own
        graphs = runner.compile_decode(buckets=fitting)
        print(f"  {attention} @ {context}: decode graphs {graphs.mode}, warm-up {graphs.warmup_ms:.0f} ms")
    slots = [runner.allocate_slot() for _ in range(max(fitting))]
    fill(runner, slots, context, seed=context)
    for batch in fitting:
        step_s = seconds_per_step(runner, slots[:batch], settings.steps)
        mode = "eager" if runner.graphs is None else runner.graphs.mode  # "eager" too when the graphs fell back
        if runner.graphs is not None and runner.graphs.fallback_reason:
            print(f"  {attention} @ {context}: decode graphs fell back to eager: {runner.graphs.fallback_reason}")
        yield decode_row(built, card, attention, mode, batch, context, step_s, settings.steps)
        for slot in slots[:batch]:
            runner.truncate(slot, context)


@torch.inference_mode()
def prefill_row(built: RandomModel, card: Card, attention: str, prompts: int, tokens: int, repeats: int) -> dict:
    """`prompts` random prompts of `tokens` tokens prefilled as one batch (ModelRunner.prefill_batch), the best of
    `repeats` timed runs after an untimed one; the slots are freed between runs."""
    runner = ModelRunner(built.model, max_concurrent=prompts, context_window=tokens, attention=attention)
    ids = torch.randint(3, runner.vocab_size, (prompts, tokens), generator=torch.Generator().manual_seed(tokens))
    best = float("inf")
    for run in range(repeats + 1):
        slots = [runner.allocate_slot() for _ in range(prompts)]
        synchronize(runner.device)
        start = time.perf_counter()
        runner.prefill_batch(slots, ids.tolist())
        synchronize(runner.device)
        if run:
            best = min(best, time.perf_counter() - start)
        for slot in slots:
            runner.free_slot(slot)
    flops = prefill_flops(built, prompts, tokens)
    tok_s = prompts * tokens / best
    bound = card.matmul * prompts * tokens / flops
    nominal = None if card.nominal_matmul is None else card.nominal_matmul * prompts * tokens / flops
    return {
        "kind": "prefill", "model": built.name, "attention": attention, "mode": "eager", "batch": prompts,
        "context": tokens, "tok_s": tok_s, "ms_per_step": 1000 * best, "flops": flops, "matmul": card.matmul,
        "bound_tok_s": bound, "ratio": tok_s / bound, "nominal_bound_tok_s": nominal,
        "nominal_ratio": ratio(tok_s, nominal),
    }  # fmt: skip


TABLE_HEADER = (
    f"{'row':<8} {'model':<13} {'attention':<9} {'mode':<11} {'batch':>5} {'context':>7} {'tok/s':>10} "
    f"{'ms/step':>8} {'bound tok/s':>11} {'ratio':>6} {'nominal':>7}"
)


def table_line(row: dict) -> str:
    """One row of TABLE_HEADER: the measured figures, the bound from the measured card and the ratio to it, and the
    ratio to the bound from the card's nominal figure."""
    head = f"{row['kind']:<8} {row['model']:<13} {row['attention']:<9}"
    if "skipped" in row:
        return f"{head} {'':<11} {row['batch']:>5} {row['context']:>7} skipped: {row['skipped']}"
    nominal = "-" if row["nominal_ratio"] is None else f"{row['nominal_ratio']:.2f}"
    return (
        f"{head} {row['mode']:<11} {row['batch']:>5} {row['context']:>7} {row['tok_s']:>10.1f} "
        f"{row['ms_per_step']:>8.2f} {row['bound_tok_s']:>11.1f} {row['ratio']:>6.2f} {nominal:>7}"
    )
