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

from inference.engine.execution.compiled_step import DecodeGraphs, decode_buckets
from inference.engine.execution.decode_plan import DecodePlan
from inference.engine.execution.eager_step import attention_backends, eager_step
from inference.engine.kv.kv_cache import KVCache
from inference.engine.kv.long_tensor import long_tensor
from inference.engine.model.transformer import Transformer

DEFAULT_BLOCK_SIZE = 16

# How a step's attention reaches the paged KV pool: "gather" copies each group's blocks into a dense tensor for SDPA
# (on a CPU, decode rows go through the C paged kernel instead); "flex" reads the pool in place with torch's
# flex_attention, every group of the step in one call (model/page_mask.py).
ATTENTION_BACKENDS = ("gather", "flex")
# The backend of a load that names none, on every device, until a CUDA run measures flex (docs/attention.md).
DEFAULT_ATTENTION = "gather"


def pool_blocks(positions: int, block_size: int) -> int:
    """Blocks for `positions` positions."""
    return -(-positions // block_size)


class ModelRunner:
    """Runs a model's forward steps over a KV pool with room for `max_concurrent` sequences at the full
    `context_window`, and `cache_tokens` positions more (whole blocks of them) for the prefix cache: the sequences the
    scheduler runs can always grow to the window, by taking back cached blocks and idle sessions' blocks if need be
    (sessions.py), and what they leave behind stays findable in the rest. The pool holds keys and values in
    `kv_dtype` (default: the model's dtype); attention computes in the model's dtype whatever the pool's, through the
    `attention` backend (ATTENTION_BACKENDS). With `host_cache_bytes` the cached blocks the pool takes back move to
    host memory, up to that many bytes, and come back on a prefix hit (kv/host_tier.py)."""

    def __init__(
        self,
        model: Transformer,
        *,
        max_concurrent: int,
        context_window: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cache_tokens: int = 0,
        kv_dtype: torch.dtype | None = None,
        attention: str = DEFAULT_ATTENTION,
        host_cache_bytes: int = 0,
    ):
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, not {attention!r}")
        config = model.config
        self.attention = attention
        self.model = model
        self.max_concurrent = max_concurrent
        self.context_window = context_window
        self.vocab_size = config.vocab_size
        self.device = model.norm.weight.device
        per_sequence = pool_blocks(context_window, block_size)
        self.cache_blocks = cache_tokens // block_size  # the pool's blocks beyond the sequences' full windows
        with torch.inference_mode():
            self.cache = KVCache(
                num_layers=config.num_layers,
                num_blocks=max_concurrent * per_sequence + self.cache_blocks,
                block_size=block_size,
                num_kv_heads=config.num_kv_heads,
                context_window=context_window,
                head_dim=config.head_dim,
                dtype=kv_dtype or model.norm.weight.dtype,
                device=self.device,
                host_cache_bytes=host_cache_bytes,
                attention=attention,
            )
        self.graphs: DecodeGraphs | None = None  # the compiled decode step, when compile_decode made one
        self._warm_up_threads: int | None = None  # what compile_decode(now=False) asked warm_up_next to use
        # the decode step as kernel calls, where the model allows (decode_plan.py); its paged kernel is gather's
        self.plan = DecodePlan.build(model) if attention == "gather" else None

    def compile_decode(
        self, *, threads: int | None = None, buckets: list[int] | None = None, now: bool = True
    ) -> DecodeGraphs:
        """Compiles (CPU) or captures (CUDA) the decode step for each batch-size bucket (default: powers of two up
        to `max_concurrent`, and it): `now`, slow, seconds per bucket on a CPU, or (now=False) bucket by bucket as
        `warm_up_next` is called. `threads` is the number of intra-op threads the steps will run with (the C++
        kernels are generated for it). A failure to compile does not raise: decode stays eager, with the reason in
        the returned report. A batch larger than every bucket, or any batch before every bucket is warm, decodes
        eagerly. With `attention` "flex" each row of a graph reads only its live blocks (flex_decode.py)."""
        if buckets is not None and not all(0 < b <= self.max_concurrent for b in buckets):
            raise ValueError(f"buckets {buckets} must be batch sizes from 1 to max_concurrent {self.max_concurrent}")
        self.graphs = DecodeGraphs(
            self.model, self.cache, buckets or decode_buckets(self.max_concurrent), attention=self.attention
        )
        self._warm_up_threads = threads
        if now:
            with attention_backends(self.device):
                self.graphs.warm_up(threads=threads)
        return self.graphs

    def warm_up_next(self) -> bool:
        """Compiles or captures the next bucket a `compile_decode(now=False)` left; whether any remain after it."""
        if self.graphs is None or not self.graphs.pending:
            return False
        with attention_backends(self.device):
            return self.graphs.warm_up(threads=self._warm_up_threads, buckets=1)

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
    def step(
        self,
        prefills: list[tuple[int, list[int]]],
        decode_slots: list[int],
        decode_tokens: list[int],
        *,
        all_logits: frozenset[int] = frozenset(),
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """A step's work in one forward pass over the weights: each `prefills[i] = (slot, token_ids)` appended to its
        slot's KV, and one token for each decode slot, at its slot's own length. Returns float32 logits: for each
        chunk, of its last position [V] (of every position, [S, V], when `i in all_logits`), and of the decode rows
        [D, V].

        Each chunk attends as its own group, unpadded, and the decode rows as one more (with flex: all of them in one
        call; Transformer.forward), so a burst of prompts and the running decoders cost one pass over the weights, not
        one per prompt plus one for the decode. A decode-only step runs the compiled graph of its batch size when there
        is one. A slot appears at most once; every slot must have room for what it appends, or the call raises
        ContextOverflow before writing anything."""
        slots = [slot for slot, _ in prefills] + decode_slots
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot appears twice in one step: {slots}")
        if not all(ids for _, ids in prefills) or len(decode_slots) != len(decode_tokens):
            raise ValueError("a step needs non-empty prefill chunks and one token per decode slot")
        if not slots:
            raise ValueError("a step needs at least one prefill chunk or decode slot")
        for slot, ids in prefills:
            self.cache.check_room(slot, len(ids))
        for slot in decode_slots:
            self.cache.check_room(slot, 1)
        views = [self.cache.view([slot], len(ids)) for slot, ids in prefills]
        decoded = None
        if decode_slots:
            views.append(self.cache.view(decode_slots, 1))
            if not prefills and self.graphs is not None:
                decoded = self.graphs.forward(decode_tokens, views[0])  # [D, V], None: eager
                decoded = None if decoded is None else decoded.float()
            elif not prefills and self.plan is not None and self.plan.serves(self.cache, views[0]):
                decoded = self.plan.forward(long_tensor(decode_tokens, self.device), self.cache, views[0])
        chunks = []
        if decoded is None:
            chunks, decoded = eager_step(self.model, self.cache, prefills, decode_tokens, views, all_logits)
        for slot, ids in prefills:
            self.cache.advance(slot, ids)
        for slot, token_id in zip(decode_slots, decode_tokens, strict=True):
            self.cache.advance(slot, [token_id])
        return chunks, decoded

    def prefill(self, slot: int, token_ids: list[int], *, all_logits: bool = False) -> torch.Tensor:
        """Appends `token_ids` to the slot's KV; float32 logits of the last position [V], or of all of them [S, V]."""
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        chunks, _ = self.step([(slot, token_ids)], [], [], all_logits=frozenset({0} if all_logits else ()))
        return chunks[0]

    def prefill_batch(self, slots: list[int], token_ids: list[list[int]]) -> torch.Tensor:
        """Appends each `token_ids[i]` to `slots[i]`'s KV in one forward pass; float32 logits of each one's last
        position [B, V]. One pass over the weights instead of one per prompt: a burst of short prompts costs little
        more than its tokens."""
        if len(slots) != len(token_ids) or not all(token_ids):
            raise ValueError("prefill_batch needs one non-empty token list per slot")
        chunks, _ = self.step(list(zip(slots, token_ids, strict=True)), [], [])
        return torch.stack(chunks)

    def decode(self, slots: list[int], token_ids: list[int]) -> torch.Tensor:
        """One token per slot, each appended at its slot's own length; float32 logits [B, V]."""
        if len(slots) != len(token_ids) or not slots:
            raise ValueError(f"decode needs one token per slot, got {len(slots)} slots and {len(token_ids)} tokens")
        return self.step([], slots, token_ids)[1]

    @torch.inference_mode()
    def embed(self, token_ids: list[list[int]], pooling: str) -> torch.Tensor:
        """Each input's embedding, all in one forward pass (each input its own attention group, as in `step`): its
        final hidden states pooled ("mean" over its positions, or the "last" one) and L2-normalised, float32 [B, D].
        Each input takes a slot for the pass, freed at once (its full blocks stay cached, so a generation on the
        same text reuses them)."""
        slots = [self.allocate_slot() for _ in token_ids]
        try:
            for slot, ids in zip(slots, token_ids, strict=True):
                self.cache.check_room(slot, len(ids))
            views = [self.cache.view([slot], len(ids)) for slot, ids in zip(slots, token_ids, strict=True)]
            tokens = long_tensor([t for ids in token_ids for t in ids], self.device)
            with attention_backends(self.device):
                states = self.model(tokens, self.cache, views, hidden=True).float()  # [T, D]
            for slot, ids in zip(slots, token_ids, strict=True):
                self.cache.advance(slot, ids)
        finally:
            for slot in slots:
                self.free_slot(slot)
        inputs = states.split([len(ids) for ids in token_ids])
        pooled = torch.stack([rows.mean(0) if pooling == "mean" else rows[-1] for rows in inputs])
        return torch.nn.functional.normalize(pooled, dim=-1)
