"""A decode step on the CPU as a flat list of C kernel calls: the same kernels, in the same order, as the model's
forward, without the modules in between.

At decode sizes the forward's Python is most of a small model's step and a real part of a large one's: each layer
goes through a dozen module calls, checks and wrapper functions, each allocating its output, some ten microseconds
per layer call by call. A plan resolves all of that once, when the model is built: each linear layer becomes its
kernel call with the weight's address bound, each norm its weight's address, and every intermediate result a buffer
sized for the largest batch so far, reused step after step. A step is then the embedding lookup, two table lookups
and eight calls per layer. The logits are the forward's bit for bit (`tests/engine/test_decode_plan.py`).

The plan is the lowering of the model's one layer description, transformer.Block.forward: its switches (q/k/v bias
in the linear layers, the norms' eps, RoPE's tables, the tied head) are read from the model's modules, never from the
config, and `lowers` refuses a block with one it has no kernel call for. A plan serves float32 CPU models whose
decode attends through the paged kernel (paged_attention.py) and whose linear layers are the C kernel's
(block_quant.py's, FloatLinear) or small transposed ones; for any other model `DecodePlan.build` returns None and the
forward serves (qwen3's per-head q/k norms, oneDNN-packed or int8 layers, CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial

import torch

from inference.engine import kernels
from inference.engine.kernels import paged_attention, pointwise
from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.model.transformer import (
    Block,
    FloatLinear,
    RMSNorm,
    Transformer,
    TransposedLinear,
    bound_transposed_product,
    transposed_product,
)
from inference.engine.quant.block_quant import BlockLinear, BlockParts


class _BlockCall:
    """A block layer (block_quant.py): the block kernel on its codes and scales, or on each part's into its columns."""

    __slots__ = ("parts", "in_features", "bias")

    def __init__(self, layer: BlockLinear | BlockParts):
        parts = list(zip(layer.parts, layer.columns, strict=True)) if isinstance(layer, BlockParts) else [(layer, 0)]
        # each part: (codes, scales, format, its first column)
        self.parts = [(p.codes, p.scales, p.FORMAT, c) for p, c in parts]
        self.in_features, self.bias = layer.in_features, layer.bias

    def run(self, x: torch.Tensor, out: torch.Tensor) -> None:
        for codes, scales, format_name, column in self.parts:
            kernels.block_matmul(out, x, codes, scales, format_name, self.in_features, column)
        if self.bias is not None:
            out.add_(self.bias)

    def bind(self, x: torch.Tensor, out: torch.Tensor) -> list[Callable[[], None]]:
        """`run(x, out)` for these buffers, as calls checked once."""
        calls = [
            kernels.bind(kernels.block_matmul_call, out, x, codes, scales, format_name, self.in_features, column)
            for codes, scales, format_name, column in self.parts
        ]
        return calls if self.bias is None else [*calls, partial(out.add_, self.bias)]


class _FloatCall:
    """A float32 layer on the C kernel."""

    __slots__ = ("weight", "bias")

    def __init__(self, layer: FloatLinear):
        self.weight, self.bias = layer.weight, layer.bias

    def run(self, x: torch.Tensor, out: torch.Tensor) -> None:
        kernels.float_matmul(out, x, self.weight)
        if self.bias is not None:
            out.add_(self.bias)

    def bind(self, x: torch.Tensor, out: torch.Tensor) -> list[Callable[[], None]]:
        """`run(x, out)` for these buffers, as calls checked once."""
        call = kernels.bind(kernels.float_matmul_call, out, x, self.weight)
        return [call] if self.bias is None else [call, partial(out.add_, self.bias)]


class _TransposedCall:
    """A small float32 layer ([in, out] weight): the layer's own product (transformer.transposed_product) with its
    weight bound, into the buffer: `run(x, out)`."""

    __slots__ = ("run", "bind")

    def __init__(self, layer: TransposedLinear):
        self.run = partial(transposed_product, layer.weight_t, layer.on_kernel(), layer.bias)
        self.bind = partial(bound_transposed_product, layer.weight_t, layer.on_kernel(), layer.bias)


_CALLS = {
    BlockLinear: _BlockCall,
    BlockParts: _BlockCall,
    FloatLinear: _FloatCall,
    TransposedLinear: _TransposedCall,
}


def _embed_into(embed: torch.nn.Module) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """Writes the tokens' embeddings into a buffer: a float table's rows copied straight in, a StoredEmbedding's
    (the file's quantized rows) expanded and copied."""
    if isinstance(embed, torch.nn.Embedding):
        weight = embed.weight
        return lambda tokens, out: torch.index_select(weight, 0, tokens, out=out)
    return lambda tokens, out: out.copy_(embed(tokens))


def lowers(block: Block, eps: float) -> bool:
    """Whether the plan's layer step is `block`'s: the plan lowers Block.forward as it stands (norm, q/k/v with its
    bias, the paged kernel's rotation, store and attention, o_proj, norm, gate/up, SwiGLU, down), reading every switch
    from the block's modules, with one eps for every norm; a block with a switch it does not lower (qwen3's q/k norm,
    a norm of another kind or eps) is the forward's to run."""
    norms = (block.attention_norm, block.ffn_norm)
    return block.attention.qk_norm is None and all(type(norm) is RMSNorm and norm.eps == eps for norm in norms)


def _call(layer: torch.nn.Module) -> _BlockCall | _FloatCall | _TransposedCall | None:
    for kind, call in _CALLS.items():
        if isinstance(layer, kind):
            return call(layer)
    return None


class _Layer:
    __slots__ = ("index", "attention_norm", "ffn_norm", "wqkv", "wo", "w13", "w2")

    def __init__(self, index: int, attention_norm: torch.Tensor, ffn_norm: torch.Tensor, linears: list):
        self.index, self.attention_norm, self.ffn_norm = index, attention_norm, ffn_norm
        self.wqkv, self.wo, self.w13, self.w2 = linears


@dataclass(slots=True)
class _Buffers:
    """Every intermediate result of a decode step, [rows, width] each."""

    x: torch.Tensor
    delta: torch.Tensor
    normed: torch.Tensor
    qkv: torch.Tensor
    attended: torch.Tensor
    gate_up: torch.Tensor
    activated: torch.Tensor
    cos: torch.Tensor
    sin_signed: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, hidden: int, qkv: int, attended: int, ffn: int, head_dim: int) -> _Buffers:
        widths = (hidden, hidden, hidden, qkv, attended, 2 * ffn, ffn, head_dim, head_dim)
        return cls(*(torch.empty(rows, width) for width in widths))

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    def rows_of(self, rows: int) -> _Buffers:
        """The first `rows` rows of each (contiguous views): a smaller batch's buffers."""
        return self if rows == self.rows else _Buffers(*(getattr(self, f.name)[:rows] for f in fields(self)))


@dataclass(slots=True)
class _BoundStep:
    """A batch size's step: its buffers and every kernel call on them, checked once and bound. Each layer is the
    calls before its attention and those after; the attention takes the step's block table and the layer's KV pool,
    which are checked as they come (kernels.BoundAttention)."""

    buffers: _Buffers
    attention: kernels.BoundAttention
    layers: list[tuple[int, list[Callable[[], None]], list[Callable[[], None]]]]
    final_norm: Callable[[], None]


class DecodePlan:
    def __init__(self, model: Transformer, layers: list[_Layer], lm_head):
        config = model.config
        self.model, self.layers, self.lm_head = model, layers, lm_head
        self.eps, self.hidden, self.vocab = model.norm.eps, config.hidden_size, config.vocab_size
        self.kv_heads, self.head_dim = config.num_kv_heads, config.head_dim
        self.group = config.num_heads // config.num_kv_heads
        self.qkv_width = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.ffn = config.intermediate_size
        self.final_norm = model.norm.weight
        self.embed = _embed_into(model.embed)
        self.buffers: _Buffers | None = None  # for the largest batch so far
        self.steps: dict[int, _BoundStep] = {}  # on its first rows, by batch size

    @classmethod
    def build(cls, model: Transformer) -> DecodePlan | None:
        """The model's plan, or None where the forward must serve (see the module's docstring)."""
        if (
            paged_attention.KERNEL is None
            or pointwise.KERNEL is None
            or not kernels.block_kernel_runs()
            or model.norm.weight.device.type != "cpu"
            or model.norm.weight.dtype != torch.float32
            or type(model.norm) is not RMSNorm
        ):
            return None
        layers = []
        for i, block in enumerate(model.layers):
            if not lowers(block, model.norm.eps):
                return None
            attention, ffn = block.attention, block.feed_forward
            linears = [_call(layer) for layer in (attention.wqkv, attention.wo, ffn.w13, ffn.w2)]
            if any(call is None for call in linears):
                return None
            norms = (block.attention_norm.weight, block.ffn_norm.weight)
            layers.append(_Layer(i, *norms, linears))
        lm_head = _call(model.lm_head)
        return None if lm_head is None else cls(model, layers, lm_head)

    def serves(self, cache: KVCache, view: CacheView) -> bool:
        """Whether this step (one decode group) attends through the paged kernel."""
        return view.table is not None and cache.keys[0].dtype in paged_attention.KV_DTYPE_CODES

    def forward(self, tokens: torch.Tensor, cache: KVCache, view: CacheView) -> torch.Tensor:
        """The logits [B, V] of one decode token per row of `view`, as Transformer.forward computes them."""
        rows = tokens.shape[0]
        step = self.steps.get(rows) or self._bind(rows)
        b, attention, keys, values = step.buffers, step.attention, cache.keys, cache.values
        positions = view.positions.reshape(-1)
        self.embed(tokens, b.x)
        torch.index_select(self.model.rope_cos, 0, positions, out=b.cos)
        torch.index_select(self.model.rope_sin_signed, 0, positions, out=b.sin_signed)
        attention.step(view.write_rows, view.table, view.lengths)
        for index, before, after in step.layers:
            for call in before:
                call()
            attention(keys[index], values[index])
            for call in after:
                call()
        step.final_norm()
        logits = torch.empty(rows, self.vocab)
        self.lm_head.run(b.normed, logits)
        return logits

    def _bind(self, rows: int) -> _BoundStep:
        """The step of `rows` rows: its buffers (the first rows of the largest batch's) and its calls, bound."""
        if self.buffers is None or self.buffers.rows < rows:
            attended = self.kv_heads * self.group * self.head_dim
            self.buffers = _Buffers.allocate(rows, self.hidden, self.qkv_width, attended, self.ffn, self.head_dim)
            self.steps = {}
        b = self.buffers.rows_of(rows)
        norm = partial(kernels.bind, kernels.rms_norm_call)
        layers, residual = [], None  # the first layer's norm adds nothing
        for layer in self.layers:
            before = [norm(b.normed, b.x, layer.attention_norm, self.eps, residual), *layer.wqkv.bind(b.normed, b.qkv)]
            after = [
                *layer.wo.bind(b.attended, b.delta),
                norm(b.normed, b.x, layer.ffn_norm, self.eps, b.delta),
                *layer.w13.bind(b.normed, b.gate_up),
                kernels.bind(kernels.swiglu_call, b.activated, b.gate_up),
                *layer.w2.bind(b.activated, b.delta),
            ]
            layers.append((layer.index, before, after))
            residual = b.delta
        attention = kernels.BoundAttention(b.attended, b.qkv, b.cos, b.sin_signed, self.kv_heads)
        final_norm = norm(b.normed, b.x, self.final_norm, self.eps, residual)
        step = self.steps[rows] = _BoundStep(b, attention, layers, final_norm)
        return step
