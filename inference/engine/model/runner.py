"""The step-level API the worker's scheduler builds on: prefill a slot, decode a batch of slots, free a slot.

A slot is a handle to one sequence's KV, a table of blocks in a shared pool (see kv_cache.py). Prefill appends
tokens after what a slot already holds, so chunked prefill, a prompt that starts from a cached prefix and
continuing a kept session are the same call. Decode runs one token for every slot in the
batch, each at its own position, as one forward pass: rows of different lengths are handled by masks and indexed
writes, never by a Python loop over rows. With `compile_decode` the decode step runs as a compiled graph per
batch-size bucket (or a CUDA graph on CUDA; compiled_step.py), falling back to the eager forward with a reason.
"""

from __future__ import annotations

import torch

from inference.engine.model.compiled_step import DecodeGraphs
from inference.engine.model.kv_cache import KVCache
from inference.engine.model.transformer import Transformer

DEFAULT_BLOCK_SIZE = 16


def pool_blocks(pool_tokens: int, block_size: int) -> int:
    """Blocks for `pool_tokens` positions."""
    return -(-pool_tokens // block_size)


class ModelRunner:
    """Runs a model's forward steps over a KV pool of `pool_tokens` positions, and never fewer than `max_concurrent`
    sequences at the full `context_window` need: the sequences the scheduler runs can always grow to the window, by
    taking back cached blocks and idle sessions' blocks if need be (sessions.py)."""

    def __init__(
        self,
        model: Transformer,
        *,
        max_concurrent: int,
        context_window: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        pool_tokens: int = 0,
    ):
        config = model.config
        self.model = model
        self.max_concurrent = max_concurrent
        self.context_window = context_window
        self.vocab_size = config.vocab_size
        self.device = model.embed.weight.device
        per_sequence = pool_blocks(context_window, block_size)
        with torch.inference_mode():
            self.cache = KVCache(
                num_layers=config.num_layers,
                num_blocks=max(pool_blocks(pool_tokens, block_size), max_concurrent * per_sequence),
                block_size=block_size,
                num_kv_heads=config.num_kv_heads,
                context_window=context_window,
                head_dim=config.head_dim,
                dtype=model.embed.weight.dtype,
                device=self.device,
            )
        self.graphs: DecodeGraphs | None = None  # the compiled decode step, when compile_decode made one

    def compile_decode(self, *, threads: int | None = None, buckets: list[int] | None = None) -> DecodeGraphs:
        """Compiles (CPU) or captures (CUDA) the decode step for each batch-size bucket (default: powers of two up
        to `max_concurrent`, and it), now: slow, seconds per bucket on a CPU. `threads` is the number of intra-op
        threads the steps will run with (the C++ kernels are generated for it). A failure to compile does not
        raise: decode stays eager, with the reason in the returned report. A batch larger than every bucket decodes
        eagerly."""
        if buckets is not None and not all(0 < b <= self.max_concurrent for b in buckets):
            raise ValueError(f"buckets {buckets} must be batch sizes from 1 to max_concurrent {self.max_concurrent}")
        graphs = DecodeGraphs(self, buckets)
        graphs.warm_up(threads=threads)
        self.graphs = graphs
        return graphs

    def allocate_slot(self) -> int:
        """A new, empty slot (blocks are taken as tokens are written; KVCacheFull when the pool has none left)."""
        return self.cache.allocate()

    def reuse_prefix(self, slot: int, token_ids: list[int]) -> int:
        """Starts an empty slot from the cached blocks `token_ids` begins with; the number of tokens reused."""
        return self.cache.reuse_prefix(slot, token_ids)

    def free_slot(self, slot: int) -> None:
        self.cache.free(slot)

    def slot_length(self, slot: int) -> int:
        return self.cache.length(slot)

    def truncate(self, slot: int, length: int) -> None:
        """Drops the slot's KV past `length`, keeping the prefix for reuse."""
        self.cache.truncate(slot, length)

    @torch.inference_mode()
    def prefill(self, slot: int, token_ids: list[int], *, all_logits: bool = False) -> torch.Tensor:
        """Appends `token_ids` to the slot's KV; float32 logits of the last position [V], or of all of them [S, V]."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        view = self.cache.view([slot], [len(token_ids)], len(token_ids))
        tokens = torch.tensor([token_ids], device=self.device)
        logits = self.model(tokens, self.cache, view, last_only=not all_logits)  # [1, S or 1, V]
        self.cache.advance(slot, token_ids)
        return logits[0].float() if all_logits else logits[0, -1].float()

    @torch.inference_mode()
    def embed(self, token_ids: list[list[int]], pooling: str) -> torch.Tensor:
        """Each input's embedding, all in one forward pass (padded as in prefill_batch): its final hidden states
        pooled ("mean" over its positions, or the "last" one) and L2-normalised, float32 [B, D]. Each input takes a
        slot for the pass, freed at once (its full blocks stay cached, so a generation on the same text reuses
        them)."""
        slots = [self.allocate_slot() for _ in token_ids]
        try:
            width = max(len(ids) for ids in token_ids)
            view = self.cache.view(slots, [len(ids) for ids in token_ids], width)
            tokens = torch.tensor([ids + ids[-1:] * (width - len(ids)) for ids in token_ids], device=self.device)
            states = self.model(tokens, self.cache, view, hidden=True).float()  # [B, W, D]
            for slot, ids in zip(slots, token_ids, strict=True):
                self.cache.advance(slot, ids)
        finally:
            for slot in slots:
                self.free_slot(slot)
        lengths = torch.tensor([len(ids) for ids in token_ids], device=states.device)
        if pooling == "mean":
            valid = (torch.arange(width, device=states.device)[None, :] < lengths[:, None]).to(states.dtype)
            pooled = (states * valid[..., None]).sum(1) / lengths[:, None]
        else:
            pooled = states[torch.arange(len(token_ids), device=states.device), lengths - 1]
        return torch.nn.functional.normalize(pooled, dim=-1)

    @torch.inference_mode()
    def prefill_batch(self, slots: list[int], token_ids: list[list[int]]) -> torch.Tensor:
        """Appends each `token_ids[i]` to `slots[i]`'s KV in one forward pass; float32 logits of each one's last
        position [B, V]. One pass over the weights instead of one per prompt: a burst of short prompts costs little
        more than the longest of them.

        Shorter lists are padded at their end to the longest. The padding's keys and values go to the pool's scratch
        block, where no real token attends (the causal mask). Every slot must have room for the longest list, or
        the call raises ContextOverflow before writing anything.
        """
        if len(slots) != len(token_ids) or not all(token_ids):
            raise ValueError("prefill_batch needs one non-empty token list per slot")
        width = max(len(ids) for ids in token_ids)
        view = self.cache.view(slots, [len(ids) for ids in token_ids], width)
        tokens = torch.tensor([ids + ids[-1:] * (width - len(ids)) for ids in token_ids], device=self.device)
        last = torch.tensor([len(ids) - 1 for ids in token_ids], device=self.device)
        logits = self.model(tokens, self.cache, view, last_index=last)  # [B, 1, V]
        for slot, ids in zip(slots, token_ids, strict=True):
            self.cache.advance(slot, ids)
        return logits[:, 0].float()

    @torch.inference_mode()
    def decode(self, slots: list[int], token_ids: list[int]) -> torch.Tensor:
        """One token per slot, each appended at its slot's own length; float32 logits [B, V]."""
        if len(slots) != len(token_ids) or not slots:
            raise ValueError(f"decode needs one token per slot, got {len(slots)} slots and {len(token_ids)} tokens")
        view = self.cache.view(slots, [1] * len(slots), 1)
        logits = self.graphs.forward(token_ids, view) if self.graphs is not None else None  # [B, 1, V]
        if logits is None:
            tokens = torch.tensor(token_ids, device=self.device)[:, None]
            logits = self.model(tokens, self.cache, view)  # [B, 1, V]
        for slot, token_id in zip(slots, token_ids, strict=True):
            self.cache.advance(slot, [token_id])
        return logits[:, 0].float()
