"""The decode step as one compiled graph per batch-size bucket (CPU: torch.compile) or one captured CUDA graph per
bucket (CUDA), with a reported fallback to the eager forward.

An eager decode step of a small model is mostly dispatch: ~25 ATen calls per layer, each with a fixed cost that
dwarfs its arithmetic (docs/performance.md). Compiled, the norms, RoPE, the cache write, the gather of each row's
blocks and the SwiGLU glue become a few fused C++ kernels per layer and one Python call per step.

What keeps it from recompiling every step: the batch is padded up to a bucket (1, 2, 4, ... up to the slot count),
so each bucket has one static-shaped graph, and the only size that changes from step to step, the number of blocks
a row reads, is marked dynamic (CPU) or padded to the whole context window (CUDA, where a graph replay cannot change
shape). Rows attend over every position of those blocks, the ones past their own masked, so no length is sliced. A
runner whose attention is "flex" has no such size: each row reads its live blocks in place, named by inputs of fixed
shape (flex_decode.py), so a replay's cost follows the tokens held rather than the window.
The padding rows write their keys and values to the pool's scratch block and read only scratch, so they never touch
a sequence's KV. After the warm-up a bucket's graph is final: a step that would need a new compilation raises
instead (`SealableBackend`) and the model goes back to the eager forward for good, with the reason in its `graphs`
report (hosted_model.py), never silently and never with a compile stall mid-serving.

Linear layers the compiler knows to be plain matmuls (nn.Linear, TransposedLinear: traced as `x @ weight_t`, which
inductor fuses, where eager steps call the C kernel) are traced; every other kind (oneDNN-packed, int8, 4-bit, the
float32 C kernel's: weights the compiler cannot lower, or calls it cannot see into) is called through the opaque
custom op `pantheon::linear_layer`, so each keeps its own kernel. The graph shares the model's parameters and the KV
pool: no weight is copied, and weights written in place (the trainer's barrier) are what the next step reads.

`DecodeGraph` runs the model's own blocks (transformer.Block.forward, the one description of a layer's step, with
every architecture switch in it), differing from the eager forward only in its way to the KV (`GatheredAttention`,
or `FlexDecodeAttention`) and in how its linear layers are called; test_compiled_step.py, test_flex_decode_graphs.py
and test_decode_description.py hold it to the eager forward's greedy tokens.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine.execution.eager_step import prefill_one_token
from inference.engine.execution.flex_decode import FlexCall, FlexDecodeAttention, FlexInputs, flex_call
from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.model.rope import rotate_half
from inference.engine.model.transformer import (
    Attention,
    FeedForward,
    RMSNorm,
    Transformer,
    TransposedLinear,
    run_blocks,
)

log = logging.getLogger(__name__)

# Linear layers whose forward is a plain matmul (+ bias) the compiler traces; any other kind is called opaquely.
TRACEABLE_LINEARS = (nn.Linear, TransposedLinear)

# The opaque linear layers of the model whose compiled step this thread is running (DecodeGraphs sets it around the
# call). The graph names a layer by its index in the model, not by the object, so two loads of the same architecture
# compile to the same code and the second one is an inductor cache hit.
_running = threading.local()


@torch.library.custom_op("pantheon::linear_layer", mutates_args=())
def linear_layer(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    """Calls opaque linear layer number `index` of the model whose step is running on x."""
    # x: [..., in] -> [..., out_features]
    return _running.layers[index](x)


@linear_layer.register_fake
def _(x: torch.Tensor, index: int, out_features: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


class OpaqueLinear(nn.Module):
    """A linear layer as the compiled graph calls it: traced when it is a plain matmul, else through
    `pantheon::linear_layer` (outside a compilation, and in a CUDA-graph capture, it is called directly)."""

    def __init__(self, layer: nn.Module, out_features: int, index: int):
        super().__init__()
        self.layer = layer
        self.traced = type(layer) in TRACEABLE_LINEARS
        self.out_features = out_features
        self.index = index  # in DecodeGraph.linear_layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out_features]
        if self.traced or not torch.compiler.is_dynamo_compiling():
            return self.layer(x)
        return linear_layer(x, self.index, self.out_features)


def with_linears(module: nn.Module, wrap: Callable[[str, nn.Module], nn.Module]) -> nn.Module:
    """A shallow copy of a block (or of its attention or feed-forward) whose linear layers are `wrap(name, layer)`:
    the block's own code, norms and parameters, its linear layers called as the graph calls them."""
    clone = copy.copy(module)  # shares the parameters; only the children's dict is its own
    children = {}
    for name, child in module.named_children():
        if isinstance(child, (Attention, FeedForward)):
            children[name] = with_linears(child, wrap)
        else:
            children[name] = child if isinstance(child, RMSNorm) else wrap(name, child)
    clone.__dict__["_modules"] = children
    return clone


class DecodeGraph(nn.Module):
    """A Transformer's decode forward, one token per row, over the paged KV pool given as tensors: what is compiled
    (or captured). It runs the model's own blocks (transformer.Block, copies sharing the model's modules, so it
    costs no memory) with their linear layers wrapped in OpaqueLinear, and `GatheredAttention` (or, given `flex`,
    `FlexDecodeAttention`) as their way to the KV: an architecture switch of the blocks is the graph's without a word
    here."""

    def __init__(self, model: Transformer, flex: FlexCall | None = None):
        super().__init__()
        config = model.config
        self.flex = flex  # flex_attention as the graph calls it (flex_decode.py), or None: GatheredAttention
        self.model = model
        self.linear_layers: list[nn.Module] = []  # every linear layer, in the order OpaqueLinear.index counts
        self.linears: list[list[OpaqueLinear]] = []  # each block's wrapped linear layers, then the head's
        d, qkv = config.hidden_size, (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        widths = {"wqkv": qkv, "wo": d, "w13": 2 * config.intermediate_size, "w2": d, "lm_head": config.vocab_size}

        def wrap(name: str, layer: nn.Module) -> OpaqueLinear:
            self.linear_layers.append(layer)
            self.linears[-1].append(OpaqueLinear(layer, widths[name], len(self.linear_layers) - 1))
            return self.linears[-1][-1]

        blocks = []
        for block in model.layers:
            self.linears.append([])
            blocks.append(with_linears(block, wrap))
        self.blocks = nn.ModuleList(blocks)
        self.linears.append([])
        self.lm_head = wrap("lm_head", model.lm_head)
        self.heads, self.kv_heads = config.num_heads, config.num_kv_heads

    def forward(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        write_rows: torch.Tensor,
        **pages: torch.Tensor,
    ) -> torch.Tensor:
        # keys, values: per layer [Hkv, num_blocks + 1, bs, hd]; tokens, positions: [B, 1] long;
        # write_rows: [B * Hkv] long; pages: the blocks each row reads (StepInputs) -> logits [B, V]
        model = self.model
        x = model.embed(tokens.view(-1))  # [B, D]
        cos, sin_signed = model.rope_rows(positions.view(-1), x.dtype)  # [B, 1, hd]
        if self.flex is not None:
            attend = FlexDecodeAttention(
                keys, values, write_rows, positions, cos, sin_signed, self.heads, self.kv_heads, self.flex, **pages
            )
        else:
            blocks = pages["blocks"]  # [Hkv, B, nb] long
            # every position of the blocks read is attended over, those past a row's own masked: no slicing
            key_positions = torch.arange(blocks.shape[2] * keys[0].shape[2], device=positions.device)  # [nb * bs]
            mask = (key_positions[None, :] <= positions)[:, None, None, :]  # [B, 1, 1, nb * bs]
            attend = GatheredAttention(
                keys, values, write_rows, blocks, mask, cos, sin_signed, self.heads, self.kv_heads
            )
        x, delta = run_blocks(self.blocks, x, attend)
        return self.lm_head(model.norm(x, delta))


class GatheredAttention:
    """The compiled step's way to the KV (an attention.Attend): rotates one token's queries and keys per row, writes
    its key and value into the pool and attends over each row's blocks gathered whole, as CacheAttention does for a
    decode step."""

    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        write_rows: torch.Tensor,
        blocks: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        heads: int,
        kv_heads: int,
    ):
        # blocks: [Hkv, B, nb]; mask: [B, 1, 1, nb * bs]; cos, sin_signed: [B, 1, hd]
        self.keys, self.values, self.write_rows, self.mask = keys, values, write_rows, mask
        self.rows = blocks.reshape(-1)
        self.cos, self.sin_signed, self.heads, self.kv_heads = cos, sin_signed, heads, kv_heads

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        # qkv: [B, H + 2 Hkv, hd] -> [B, H * hd]
        batch, _, head_dim = qkv.shape
        heads, kv_heads = self.heads, self.kv_heads
        qk, v = qkv.split_with_sizes((heads + kv_heads, kv_heads), dim=1)
        q, k = rotate_half(qk, self.cos, self.sin_signed).split_with_sizes((heads, kv_heads), dim=1)
        key_pool, value_pool = self.keys[layer], self.values[layer]
        key_pool.view(-1, head_dim).index_copy_(0, self.write_rows, k.reshape(-1, head_dim).to(key_pool.dtype))
        value_pool.view(-1, head_dim).index_copy_(0, self.write_rows, v.reshape(-1, head_dim).to(value_pool.dtype))
        block_size = key_pool.shape[2]

        def gather(pool: torch.Tensor) -> torch.Tensor:
            gathered = pool.view(-1, block_size * head_dim).index_select(0, self.rows)  # [Hkv * B * nb, bs * hd]
            return gathered.view(kv_heads, batch, -1, head_dim).transpose(0, 1).to(q.dtype)  # [B, Hkv, nb * bs, hd]

        # each kv head's group of query heads attends as that many query positions (as the eager decode does)
        grouped = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
        out = F.scaled_dot_product_attention(grouped, gather(key_pool), gather(value_pool), attn_mask=self.mask)
        return out.reshape(batch, heads * head_dim)


def decode_buckets(max_concurrent: int) -> list[int]:
    """Batch sizes with a graph of their own: powers of two below the slot count, and the slot count."""
    return [b for b in (1 << i for i in range(max_concurrent.bit_length())) if b < max_concurrent] + [max_concurrent]


class StepInputs:
    """Turns a CacheView of `b` rows into the graph's inputs for a bucket of `bucket >= b` rows, padding rows that
    write to and read from the scratch block only, and (gather) the block table to at least `min_blocks` blocks per
    row, or (`flex`) each row's live blocks as FlexInputs gives them."""

    def __init__(self, cache: KVCache, max_bucket: int, *, flex: bool = False):
        self.flex = FlexInputs(cache, max_bucket) if flex else None
        kv_heads = cache.keys[0].shape[0]
        per_head_blocks = cache.scratch + 1
        self.cache = cache
        self.device = cache.device
        self.head_blocks = (torch.arange(kv_heads, device=self.device) * per_head_blocks)[:, None, None]
        self.scratch_rows = (self.head_blocks.view(-1) * cache.block_size + cache.scratch * cache.block_size).repeat(
            max_bucket
        )  # [max_bucket * Hkv]: position 0 of the scratch block, in every kv head
        self.max_blocks = -(-cache.context_window // cache.block_size)
        self.scratch_blocks = (self.head_blocks + cache.scratch).expand(-1, max_bucket, max(2, self.max_blocks))
        self.block_index = torch.arange(cache.scratch + 1, device=self.device)
        self.kv_heads = kv_heads

    def build(
        self, token_ids: list[int], view: CacheView, bucket: int, *, min_blocks: int = 2
    ) -> dict[str, torch.Tensor]:
        """The graph's inputs but the pools (gather: at least two blocks per row, one would be specialised on)."""
        rows, pad = len(token_ids), bucket - len(token_ids)
        positions, write_rows = view.positions, view.write_rows
        if pad:
            positions = torch.cat([positions, positions.new_zeros(pad, 1)])
            write_rows = torch.cat([write_rows, self.scratch_rows[: pad * self.kv_heads]])
        tokens = torch.tensor(token_ids + token_ids[-1:] * pad, device=self.device)[:, None]
        inputs = {"tokens": tokens, "positions": positions, "write_rows": write_rows}
        if self.flex is not None:
            return inputs | self.flex.build(view, bucket, positions)
        blocks_needed = -(-view.length // self.cache.block_size)
        if view.table is not None:  # a paged decode view: [B, nb] blocks, the same in every kv head
            table = self.head_blocks + view.table[None]  # [Hkv, B, nb]
        elif isinstance(view.blocks, slice):
            table = self.head_blocks + self.block_index[view.blocks][None, None, :]  # [Hkv, 1, nb]
        else:
            table = view.blocks.view(self.kv_heads, rows, blocks_needed)
        if blocks_needed < min_blocks:
            table = torch.cat([table, self.scratch_blocks[:, :rows, : min_blocks - blocks_needed]], dim=2)
        if pad:
            table = torch.cat([table, self.scratch_blocks[:, :pad, : table.shape[2]]], dim=1)
        return inputs | {"blocks": table}


class RecompileRefused(RuntimeError):
    """A step needed a new compilation after the warm-up (raised by the backend, so no time is spent on it)."""


class SealableBackend:
    """Inductor while a runner warms up; once `sealed`, a refusal: a new graph would stall serving for seconds.
    Holds nothing of the runner: dynamo keeps its backend for as long as the compiled code lives."""

    def __init__(self):
        self.sealed = False

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        if self.sealed:
            raise RecompileRefused("a step needed a new compilation after the warm-up")
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(graph, example_inputs)


class DecodeGraphs:
    """A runner's decode graphs: `mode` "compiled" (CPU), "cuda_graphs" (CUDA) or "eager" (off, or fallen back:
    `fallback_reason` says why), the `buckets` that hold a graph, and the warm-up's milliseconds."""

    def __init__(self, model: Transformer, cache: KVCache, buckets: list[int], *, attention: str = "gather"):
        self.model, self.cache = model, cache
        self.cuda = cache.device.type == "cuda"
        flex = attention == "flex"  # each row reads its live blocks in place (flex_decode.py), else gathered whole
        self.mode = "cuda_graphs" if self.cuda else "compiled"
        self.buckets = sorted(buckets)
        self.threads = torch.get_num_threads()  # the intra-op threads the graphs were made for
        self.warmup_ms = 0.0
        self.bucket_ms: dict[int, float] = {}  # each bucket's share of the warm-up
        self.pending = list(reversed(self.buckets))  # not warmed up yet; CUDA graphs share one memory pool, the
        # largest captured first
        self.fallback_reason: str | None = None
        self.graph = DecodeGraph(model, flex_call(cache.device, cache.block_size) if flex else None)
        self.inputs = StepInputs(cache, self.buckets[-1], flex=flex)
        self.backend = SealableBackend()
        self._compiled: torch.nn.Module | None = None
        self._captured: dict[int, CapturedStep] = {}
        self.cuda_pool: tuple[int, int] | None = None  # the memory pool the CUDA graphs share

    # -- the warm-up ----------------------------------------------------------------------------------------------

    def warm_up(self, *, threads: int | None = None, buckets: int | None = None) -> bool:
        """Compiles (or captures) the next `buckets` buckets not warmed up yet (None: every one) now, with `threads`
        intra-op threads (the number the steps will run with: the C++ kernels are generated for it); on any failure
        the runner stays eager, with the reason. Returns whether buckets remain: no step uses the graphs until none
        does, so a worker may warm them up one at a time between its other models' steps."""
        started = time.perf_counter()
        previous = torch.get_num_threads()
        try:
            if threads is not None:
                torch.set_num_threads(threads)
            self.threads = torch.get_num_threads()
            if not self.cuda and self._compiled is None:
                self._compiled = torch.compile(
                    self.graph,
                    backend=self.backend,
                    fullgraph=True,
                    dynamic=False,
                    isolate_recompiles=True,
                    options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
                )
            for _ in range(len(self.pending) if buckets is None else min(buckets, len(self.pending))):
                bucket = self.pending.pop(0)
                bucket_started = time.perf_counter()
                self._warm_bucket(bucket)
                self.bucket_ms[bucket] = 1000 * (time.perf_counter() - bucket_started)
            self.backend.sealed = not self.pending
        except Exception as exc:  # whatever went wrong, serving goes on eagerly and says why
            log.warning("the decode graphs' warm-up failed; decoding eagerly", exc_info=True)
            self.fall_back(f"warm-up failed: {type(exc).__name__}: {first_line(exc)}")
        finally:
            if threads is not None:
                torch.set_num_threads(previous)
            self.warmup_ms += 1000 * (time.perf_counter() - started)
        return bool(self.pending)

    def _warm_bucket(self, bucket: int) -> None:
        """Runs one decode step of `bucket` fresh one-token rows through the graph (its first run compiles it)."""
        cache = self.cache
        slots = [cache.allocate() for _ in range(bucket)]
        try:
            with torch.inference_mode():
                prefill_one_token(self.model, cache, slots, 0)
                token_ids = [0] * bucket
                view = cache.view(slots, 1)
                if self.cuda:
                    self._captured[bucket] = CapturedStep(self, bucket, view, token_ids)
                else:
                    self._run_compiled(bucket, token_ids, view)
        finally:
            for slot in slots:
                cache.free(slot)

    # -- a step ---------------------------------------------------------------------------------------------------

    def forward(self, token_ids: list[int], view: CacheView) -> torch.Tensor | None:
        """Logits [B, V] of a decode step whose view the caller made, or None: run it eagerly (mode eager, or a
        batch larger than every bucket). A failing step sends the runner back to eager for good (the caller then
        runs the step eagerly: it rewrites the same KV rows)."""
        if self.mode == "eager" or self.pending:
            return None
        bucket = next((b for b in self.buckets if b >= len(token_ids)), None)
        if bucket is None:
            return None
        if not self.cuda and torch.get_num_threads() != self.threads:  # dynamo would recompile (its guard)
            self.fall_back(f"a step ran with {torch.get_num_threads()} threads; the graphs are for {self.threads}")
            return None
        try:
            if self.cuda:
                return self._captured[bucket].replay(token_ids, view)
            return self._run_compiled(bucket, token_ids, view)
        except Exception as exc:
            log.warning("a compiled decode step failed; decoding eagerly from now on", exc_info=True)
            self.fall_back(f"a step of {len(token_ids)} rows failed: {type(exc).__name__}: {first_line(exc)}")
            return None

    def _run_compiled(self, bucket: int, token_ids: list[int], view: CacheView) -> torch.Tensor:
        inputs = self.inputs.build(token_ids, view, bucket)
        if "blocks" in inputs and not self.backend.sealed:  # the gather graph's first run: a row's blocks grow
            torch._dynamo.mark_dynamic(inputs["blocks"], 2)
        cache = self.cache
        _running.layers = self.graph.linear_layers
        try:
            return self._compiled(cache.keys, cache.values, **inputs)[: len(token_ids)]
        finally:
            _running.layers = None

    def fall_back(self, reason: str) -> None:
        """Serves eagerly from now on, and says why in the model's `graphs` report."""
        self.mode, self.fallback_reason, self.buckets, self.pending = "eager", reason, [], []
        self._compiled = None
        self._captured.clear()


class CapturedStep:
    """One bucket's decode step captured as a CUDA graph: static input buffers the step copies into, one replay.
    Every row reads the whole context window's blocks (scratch past its own, masked), or with flex names them all
    and visits its live ones, so no shape ever changes."""

    def __init__(self, graphs: DecodeGraphs, bucket: int, view: CacheView, token_ids: list[int]):
        cache = graphs.cache
        self.graphs, self.bucket = graphs, bucket
        inputs = graphs.inputs.build(token_ids, view, bucket, min_blocks=graphs.inputs.max_blocks)
        self.static = {name: tensor.clone() for name, tensor in inputs.items()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialisations (cuBLAS handles, workspaces) happen outside the capture
                graphs.graph(cache.keys, cache.values, **self.static)
        torch.cuda.current_stream().wait_stream(stream)
        if graphs.cuda_pool is None:
            graphs.cuda_pool = torch.cuda.graph_pool_handle()
        self.cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.cuda_graph, pool=graphs.cuda_pool):
            self.logits = graphs.graph(cache.keys, cache.values, **self.static)  # [bucket, V]

    def replay(self, token_ids: list[int], view: CacheView) -> torch.Tensor:
        inputs = self.graphs.inputs.build(token_ids, view, self.bucket, min_blocks=self.graphs.inputs.max_blocks)
        for name, tensor in inputs.items():
            self.static[name].copy_(tensor)
        self.cuda_graph.replay()
        return self.logits[: len(token_ids)].clone()  # the next replay overwrites the graph's output


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (compiler errors run to pages)."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""
