"""One decoder-only transformer for the llama, mistral, qwen2 and qwen3 checkpoints `ModelConfig` describes.

The architectures differ only in switches the config carries, each read once, by the module it changes: q/k/v bias
(the q/k/v linear layer; qwen2), per-head q/k RMSNorm before RoPE (Attention; qwen3), the norms' eps (RMSNorm), RoPE's
theta and Llama-3 scaling (rope.py's tables), tied embeddings (the head's weight). Mistral's sliding window never
matters because the engine caps its context at the window (`ModelConfig.context_window`). `Block.forward` is the one
description of a layer's step: the eager forward and the compiled decode step (execution/compiled_step.py) run it,
each with its own way to the KV (`Attend`); the decode plan (execution/decode_plan.py) lowers it to kernel calls.

The model is built on the meta device and receives its weights with `load_state_dict(assign=True)`, so no memory is
spent on a random init. q/k/v and gate/up are fused into one matrix each at load: one matmul instead of three (two)
per layer, which matters most at batch 1 where every call is a pass over the weights.

The forward pass calls its submodules' `forward` directly: `nn.Module.__call__`'s hook dispatch costs about a
microsecond per call, some ten calls per layer and step, and the model registers no hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine import kernels
from inference.engine.kernels.pointwise import kernel_serves, rms_norm, swiglu
from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.model.attention import Attend, CacheAttention
from inference.engine.model.config import ModelConfig
from inference.engine.model.flex_attention import FlexAttention
from inference.engine.weights.shared_storage import SharedArena


class RMSNorm(nn.Module):
    """Normalizes over the last dim in float32 whatever the model's dtype, then scales in the model's dtype (as
    transformers does). The weight may carry leading dims to broadcast over (per-head norms)."""

    def __init__(self, shape: int | tuple[int, ...], eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(shape))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The norm of x; with `residual`, of x + residual, which x becomes in place (the residual stream's add,
        done by the norm that reads it: one call fewer per norm)."""
        # x, residual: [..., dim] -> [..., dim]
        # one C call (pointwise.py); a compiled step traces torch's, which the compiler fuses
        if self.weight.dim() == 1 and kernel_serves(x, self.weight) and not torch.compiler.is_dynamo_compiling():
            return rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x.add_(residual)
        if x.dtype == torch.float32 and self.weight.dim() == 1:  # the arithmetic below in one call: ~25% faster
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype) * self.weight


# The batch size oneDNN is told to expect when it reorders a weight. The reordered weight serves any batch size with
# the same per-row arithmetic (a row's output does not depend on its batch-mates); 8 is where serving batches live.
PACK_BATCH_HINT = 8
# Smaller weights stay plain: they sit in cache, where re-packing is cheap, and the oneDNN call's fixed cost (tens of
# microseconds through torch.ops) would dominate a tiny model's step.
PACK_MIN_ELEMENTS = 1 << 18
# Whether the CPU runs the C kernel for those smaller float32 weights (TransposedLinear), asked once.
TRANSPOSED_KERNEL = kernels.transposed_kernel_runs()
# Up to this many rows (a decode step's) that kernel is faster than torch.matmul; from ~64 rows on (a prompt's) MKL's
# larger tiles win (docs/performance.md).
TRANSPOSED_KERNEL_ROWS = 48


def transposed_product(
    weight_t: torch.Tensor, on_kernel: bool, bias: torch.Tensor | None, rows: torch.Tensor, out: torch.Tensor
) -> None:
    """out[R, out] = rows[R, in] @ weight_t[in, out] (+ bias); `on_kernel` where the layer is on the C kernel. The
    one product TransposedLinear's forward and the decode plan share (the plan binds the first three arguments once:
    at a microsecond a call, each lookup counts), so the plan's logits are the forward's bit for bit."""
    m = rows.shape[0]
    if on_kernel and m <= TRANSPOSED_KERNEL_ROWS:
        kernels.transposed_matmul(out, rows, weight_t)
    else:
        torch.matmul(rows, weight_t, out=out)
    if bias is not None:
        out.add_(bias)


def bound_transposed_product(
    weight_t: torch.Tensor, on_kernel: bool, bias: torch.Tensor | None, rows: torch.Tensor, out: torch.Tensor
) -> list[Callable[[], None]]:
    """transposed_product of these very tensors as calls with nothing left to decide or check (the decode plan's,
    whose buffers keep their rows): the same choice of product, so the same bits."""
    if on_kernel and rows.shape[0] <= TRANSPOSED_KERNEL_ROWS:
        calls = [kernels.bind(kernels.transposed_matmul_call, out, rows, weight_t)]
    else:
        calls = [partial(torch.matmul, rows, weight_t, out=out)]
    return calls if bias is None else [*calls, partial(out.add_, bias)]


class TransposedLinear(nn.Module):
    """A CPU linear layer too small to share out, weight kept as [in, out]: a float32 one multiplies a decode step's
    few rows on the C kernel for that layout (`_transposed_matmul.h`) where the CPU runs it, whose call costs a
    fraction of torch.matmul's at these sizes; otherwise `x @ weight_t` (for small weights MKL is faster with this
    layout than with nn.Linear's [out, in], and than a oneDNN call, see PackedLinear)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = linear.bias
        self.in_features, self.out_features = self.weight_t.shape

    def on_kernel(self) -> bool:
        """Whether a few rows' product is the C kernel's."""
        return self.weight_t.dtype == torch.float32 and TRANSPOSED_KERNEL

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        if torch.compiler.is_dynamo_compiling():  # the compiled step traces the plain product, which inductor fuses
            out = x @ self.weight_t
            return out if self.bias is None else out + self.bias
        rows = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, self.in_features).contiguous()
        out = torch.empty(rows.shape[0], self.out_features, dtype=self.weight_t.dtype)
        transposed_product(self.weight_t, self.on_kernel(), self.bias, rows, out)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)


class PackedLinear(nn.Module):
    """A CPU float32 linear layer whose weight oneDNN reordered once, at load, into its own blocked layout.

    MKL's plain sgemm re-packs the weight on every call, which for a few rows (decode batches) costs more than the
    arithmetic. Measured on this project's 2-core AVX-512 machine, one thread, the 12 layers' matmuls of the
    hidden-768 85M model (ms per step, batch 1 / 8 / 32): `x @ W` with W [in, out] 27 / 72 / 96, nn.Linear's
    layout 30 / 73 / 89, this 33 / 42 / 72. A batch of 8 costs 1.3x one row instead of 2.7x, which is what
    continuous batching is for; the price is ~20% at batch 1. Each row's result is bitwise the same whatever else
    shares its batch. The reordered weight is opaque (no storage), so `weight_nbytes` reports its size.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach()
        self.weight_packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)
        self.bias = linear.bias
        self.weight_nbytes = weight.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return _linear_pointwise(x, self.weight_packed, self.bias, "none", [], "")


_linear_pointwise = torch.ops.mkldnn._linear_pointwise.default  # the overload itself: no per-call resolution


class FloatLinear(nn.Module):
    """A CPU float32 linear layer on the C kernel (`_float_matmul.h`, kernels/matmul.py), weight in nn.Linear's
    layout: faster than PackedLinear for a decode step's few rows, slower for a prompt's many, and its threads are
    the kernel's elastic pool, which a serving host's other work does not stall (docs/performance.md)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().contiguous(), requires_grad=False)
        self.bias = linear.bias
        self.out_features, self.in_features = self.weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]; never traced: a compiled step calls it opaquely (compiled_step.py)
        rows = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, self.in_features).contiguous()
        out = torch.empty(rows.shape[0], self.out_features)
        kernels.float_matmul(out, rows, self.weight)
        if x.dim() != 2:
            out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out.add_(self.bias)


def cpu_linears(model: nn.Module, *, float32: bool) -> nn.Module:
    """Replaces every nn.Linear in place: large float32 ones with a FloatLinear where the CPU runs its kernel, else
    with a PackedLinear where oneDNN is there; the rest with a TransposedLinear."""
    kernel, onednn = kernels.float_kernel_runs(), torch.backends.mkldnn.is_available()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            large = float32 and child.weight.numel() >= PACK_MIN_ELEMENTS
            if large and kernel:
                setattr(parent, name, FloatLinear(child))
            elif large and onednn:
                setattr(parent, name, PackedLinear(child))
            else:
                setattr(parent, name, TransposedLinear(child))
    return model


class Attention(nn.Module):
    """The layer's attention: q/k/v (their bias, qwen3's per-head q/k norm), then `attend` (how the execution reaches
    the KV: rotation, store, attention), then o_proj."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        heads = self.num_heads + 2 * self.num_kv_heads
        self.wqkv = nn.Linear(config.hidden_size, heads * self.head_dim, bias=config.attention_bias)
        self.wo = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        # qwen3's q_norm and k_norm as one norm over the q and k heads: weight [H + Hkv, hd] (rows repeated per head)
        qk_heads = self.num_heads + self.num_kv_heads
        self.qk_norm = RMSNorm((qk_heads, self.head_dim), config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        qkv = self.wqkv.forward(x).view(x.shape[0], -1, self.head_dim)  # [T, H + 2 Hkv, hd]
        if self.qk_norm is not None:
            qk, v = qkv.split_with_sizes((self.num_heads + self.num_kv_heads, self.num_kv_heads), dim=1)
            qkv = torch.cat((self.qk_norm.forward(qk), v), dim=1)
        return self.wo.forward(attend(self.layer, qkv))


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up as one matmul."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w13 = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        gate_up = self.w13.forward(x)
        if kernel_serves(gate_up) and not torch.compiler.is_dynamo_compiling():  # one C call (pointwise.py)
            return self.w2.forward(swiglu(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.w2.forward(F.silu(gate) * up)


class Block(nn.Module):
    """One decoder layer, the one description of its step that the eager forward and the compiled decode step run
    (and the decode plan lowers to kernel calls, execution/decode_plan.py). The residual stream's adds are left to
    the norms that read their results: a block takes the stream `x` and the previous block's output `delta` not yet
    added to it, and returns the same pair."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config, layer)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        # x, delta: [T, D] -> x, delta: [T, D] (x updated in place)
        delta = self.attention.forward(self.attention_norm.forward(x, delta), attend)
        return x, self.feed_forward.forward(self.ffn_norm.forward(x, delta))


def run_blocks(blocks: Iterable[Block], x: torch.Tensor, attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream through every block: x [T, D] -> (x, delta), whose sum the final norm reads."""
    delta = None
    for block in blocks:
        x, delta = block.forward(x, delta, attend)
    return x, delta


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # Passing the weight skips Embedding's random init, which on the meta device drags in torch._dynamo
        # (seconds of import on every worker start) only for the load to replace it.
        self.embed = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin_signed", torch.empty(0), persistent=False)
        self.arena: SharedArena | None = None  # holds the weights of an attachable CPU load
        # rank 0 of a tensor-parallel split: hands each forward pass's plan to the other ranks first (parallel/)
        self.step_sink: Callable[[torch.Tensor, list[CacheView], torch.Tensor | None], None] | None = None

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        views: list[CacheView],
        *,
        select: torch.Tensor | None = None,
        hidden: bool = False,
    ) -> torch.Tensor:
        """Logits (or with `hidden`, the final hidden states, after the last norm) of every token, or of the tokens
        `select` names.

        `tokens` are the step's tokens of every group, flattened: group g is the `[B, S]` rows `views[g]` describes
        (its `positions`), row-major, and the groups follow each other. Every linear layer runs once over all of
        them, so a prompt's chunk and a batch of decode rows share one pass over the weights; attention runs per
        group, since each has its own shape (a chunk of S positions, or one position per decode row), or with the
        cache's "flex" backend over every group at once (model/flex_attention.py)."""
        # tokens: [T] long; select: [N] long -> logits: [T or N, V]
        if self.step_sink is not None:
            self.step_sink(tokens, views, select)
        positions = torch.cat([view.positions.reshape(-1) for view in views]) if len(views) > 1 else None
        x = self.embed.forward(tokens)
        cos, sin_signed = self.rope_rows(views[0].positions.reshape(-1) if positions is None else positions, x.dtype)
        backend = FlexAttention if cache.attention == "flex" else CacheAttention
        attend = backend(cache, views, cos, sin_signed, self.config.num_heads, self.config.num_kv_heads)
        x, delta = run_blocks(self.layers, x, attend)
        if select is not None:
            x, delta = x[select], delta[select]
        x = self.norm.forward(x, delta)
        return x if hidden else self.lm_head.forward(x)

    def rope_rows(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE rows (cos, sign-flipped sin) of `positions` [T], as the blocks' `attend` rotates with them."""
        # -> cos, sin_signed: [T, 1, hd]
        return self.rope_cos[positions].to(dtype).unsqueeze(1), self.rope_sin_signed[positions].to(dtype).unsqueeze(1)
