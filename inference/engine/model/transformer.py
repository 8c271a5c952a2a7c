"""One decoder-only transformer for the llama, mistral, qwen2 and qwen3 checkpoints `ModelConfig` describes.

The architectures differ only in switches the config carries: q/k/v bias (qwen2), per-head q/k RMSNorm before RoPE
(qwen3), Llama-3 RoPE frequency scaling, tied embeddings. Mistral's sliding window never matters because the engine
caps its context at the window (`ModelConfig.context_window`).

The model is built on the meta device and receives its weights with `load_state_dict(assign=True)`, so no memory is
spent on a random init. q/k/v and gate/up are fused into one matrix each at load: one matmul instead of three (two)
per layer, which matters most at batch 1 where every call is a pass over the weights.

The forward pass calls its submodules' `forward` directly: `nn.Module.__call__`'s hook dispatch costs about a
microsecond per call, some ten calls per layer and step, and the model registers no hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine import kernels
from inference.engine.kernels.paged_attention import decode_attention
from inference.engine.kernels.pointwise import kernel_serves, rms_norm, swiglu
from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.model.config import ModelConfig
from inference.engine.quant.quantize import quantize_linears
from inference.engine.quant.stored_quant import KeepQuantized, keep_quantized, made_from_file
from inference.engine.weights.shared_storage import SharedArena, place_in_arena


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


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE in the Hugging Face layout: dimension i is paired with i + head_dim/2, i.e.
    x * cos + cat(-x2, x1) * sin, written as x * cos + roll(x) * cat(-sin1, sin2): three kernels instead of six."""
    # x: [..., H, hd]; cos, sin_signed: [..., 1, hd]
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), sin_signed)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the head_dim/2 rotation pairs, with Llama-3 scaling when the config asks for it."""
    # returns: [hd/2] float32
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # Llama 3: wavelengths longer than the original context / low_freq_factor are slowed down by `factor`, shorter
    # than original context / high_freq_factor are kept, and those in between are blended linearly.
    wavelen = 2 * math.pi / inv_freq
    original = scaling.original_max_position_embeddings
    slowed = torch.where(wavelen > original / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * slowed / scaling.factor + smooth * slowed
    medium = (wavelen >= original / scaling.high_freq_factor) & (wavelen <= original / scaling.low_freq_factor)
    return torch.where(medium, blended, slowed)


def rope_tables(config: ModelConfig, context_window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-flipped sin (first half negated, see rotate_half) of every position's angles, in float32."""
    # returns: cos, sin_signed: [context_window, hd]
    angles = torch.outer(torch.arange(context_window, dtype=torch.float32), rope_inv_freq(config))
    sin = angles.sin()
    return torch.cat((angles, angles), dim=-1).cos().to(device), torch.cat((-sin, sin), dim=-1).to(device)


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

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, cache: KVCache, views: list[CacheView]
    ) -> torch.Tensor:
        # x: [T, D]; cos, sin_signed: [T, 1, hd] -> [T, D]
        tokens = x.shape[0]
        qkv = self.wqkv.forward(x).view(tokens, -1, self.head_dim)  # [T, H + 2 Hkv, hd]
        if self.qk_norm is not None:
            qk, v = qkv.split_with_sizes((self.num_heads + self.num_kv_heads, self.num_kv_heads), dim=1)
            qkv = torch.cat((self.qk_norm.forward(qk), v), dim=1)
        outs, start = [], 0
        for view in views:
            end = start + view.positions.numel()
            outs.append(self._attend(qkv[start:end], cos[start:end], sin_signed[start:end], cache, view))
            start = end
        return self.wo.forward(outs[0] if len(outs) == 1 else torch.cat(outs))

    def _attend(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, cache: KVCache, view: CacheView
    ) -> torch.Tensor:
        """One group's attention: rotates its queries and keys, stores its new keys and values, attends over its
        rows' KV."""
        # qkv: [B * S, H + 2 Hkv, hd]; cos, sin_signed: [B * S, 1, hd] -> [B * S, H * hd]
        if view.table is not None:  # decode through the paged kernel: rotation, store and attention in one call
            keys, values = cache.keys[self.layer], cache.values[self.layer]
            out = decode_attention(qkv, cos, sin_signed, keys, values, view.write_rows, view.table, view.lengths)
            return out.to(qkv.dtype)
        batch, seq = view.positions.shape
        qk, v = qkv.split_with_sizes((self.num_heads + self.num_kv_heads, self.num_kv_heads), dim=1)
        q, k = rotate_half(qk, cos, sin_signed).split_with_sizes((self.num_heads, self.num_kv_heads), dim=1)
        group = (batch, seq, -1, self.head_dim)
        q, k, v = q.reshape(group), k.reshape(group), v.reshape(group)  # [B, S, H or Hkv, hd]
        keys, values = cache.update(self.layer, view, k, v)  # [B, Hkv, L, hd]
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # a no-op unless the KV cache has a dtype of its own
        if seq == 1 and self.num_heads != self.num_kv_heads:
            # decode: each kv head's group of query heads attends as if it were that many query positions, so the
            # keys are never repeated per query head (faster than enable_gqa at one token per row)
            q = q.reshape(batch, self.num_kv_heads, -1, self.head_dim)  # [B, Hkv, H / Hkv, hd]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=view.mask)
        else:
            q = q.transpose(1, 2)  # [B, H, S, hd]
            gqa = self.num_heads != self.num_kv_heads
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=view.mask, enable_gqa=gqa)
        return out.reshape(batch, self.num_heads, seq, self.head_dim).transpose(1, 2).reshape(batch * seq, -1)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up as one matmul."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w13 = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, D] -> [T, D]
        gate_up = self.w13.forward(x)
        if kernel_serves(gate_up):  # one C call (pointwise.py)
            return self.w2.forward(swiglu(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.w2.forward(F.silu(gate) * up)


class Block(nn.Module):
    """One decoder layer. The residual stream's adds are left to the norms that read their results: a block takes
    the stream `x` and the previous block's output `delta` not yet added to it, and returns the same pair."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config, layer)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(
        self,
        x: torch.Tensor,
        delta: torch.Tensor | None,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        cache: KVCache,
        views: list[CacheView],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # x, delta: [T, D] -> x, delta: [T, D] (x updated in place)
        delta = self.attention.forward(self.attention_norm.forward(x, delta), cos, sin_signed, cache, views)
        return x, self.feed_forward.forward(self.ffn_norm.forward(x, delta))


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

    @classmethod
    def from_hf_weights(
        cls,
        config: ModelConfig,
        tensors: Mapping[str, torch.Tensor],
        *,
        context_window: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        quantize: bool = False,
        attachable: bool = False,
        keep: KeepQuantized | None = None,
    ) -> Transformer:
        """Builds the model from Hugging Face-named weights (already checked by the loader), with RoPE up to
        context_window. The linear layers become int8 with `quantize`; on CPU, large float32 ones get oneDNN-packed
        weights and the others are kept transposed.

        `attachable` keeps every weight where another process can map it and in a layout where each Hugging Face
        tensor is a view of what the model computes with (inference/engine/weights): on CPU all of them in one
        shared-memory arena (`model.arena`), with the linear layers left as nn.Linear (slower than the repacked
        ones, which are copies); on CUDA the allocator's own storage is what CUDA IPC shares, so nothing changes.

        `keep` names the Hugging Face weights the checkpoint stores quantized: on CPU in float32, the linear layers
        made of them stay quantized in the form quant/stored_quant.py chooses, and a large quantized embedding table
        stays as the file's rows (quant/stored_embedding.py); what is made from the file's bytes is never asked of
        `tensors` (a GGUF checkpoint decodes each tensor when asked: loaders/gguf.py)."""
        if quantize and attachable:
            raise ValueError("a quantized model cannot be attachable: a trainer writes the float weights")
        with torch.device("meta"):
            model = cls(config)
        on_cpu = torch.device(device).type == "cpu"
        sources = linear_sources(config)
        keeps = keep is not None and on_cpu and not attachable and not quantize and dtype == torch.float32
        made = made_from_file(model, sources, keep) if keeps else set()
        from_file = {f"{name}.weight" for name in made}
        keeps_embedding = keeps and keep.keeps_embedding(config.hidden_size)
        if keeps_embedding:
            from_file.add("embed.weight")
        fused = fuse_hf_weights(config, tensors, skip=from_file)
        if attachable and on_cpu:
            model.arena, weights = place_in_arena(fused, dtype)
        else:
            converted: dict[int, torch.Tensor] = {}  # by source tensor, so tied weights stay one tensor
            weights = {}
            for name, tensor in fused.items():
                if id(tensor) not in converted:
                    converted[id(tensor)] = tensor.to(device=device, dtype=dtype)
                weights[name] = converted[id(tensor)]
            del converted  # so each replaced linear layer below frees its weight
        del fused
        weights |= {name: model.get_parameter(name) for name in from_file}  # left on the meta device
        model.load_state_dict(weights, assign=True)
        del weights
        model.rope_cos, model.rope_sin_signed = rope_tables(config, context_window, torch.device(device))
        model.requires_grad_(False).eval()
        if quantize:
            quantize_linears(model)
            return model
        if keeps:
            rows = {name: shape[0] for name, shape in expected_hf_shapes(config).items()}
            keep_quantized(model, sources, keep, rows)
        if keeps_embedding:
            model.embed = keep.stored_embedding(model, made)
        if on_cpu and not attachable:
            cpu_linears(model, float32=dtype == torch.float32)
        return model

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
        group, since each has its own shape (a chunk of S positions, or one position per decode row)."""
        # tokens: [T] long; select: [N] long -> logits: [T or N, V]
        positions = torch.cat([view.positions.reshape(-1) for view in views]) if len(views) > 1 else None
        positions = views[0].positions.reshape(-1) if positions is None else positions
        x, delta = self.embed.forward(tokens), None
        cos = self.rope_cos[positions].to(x.dtype).unsqueeze(1)  # [T, 1, hd]
        sin_signed = self.rope_sin_signed[positions].to(x.dtype).unsqueeze(1)
        for block in self.layers:
            x, delta = block.forward(x, delta, cos, sin_signed, cache, views)
        if select is not None:
            x, delta = x[select], delta[select]
        x = self.norm.forward(x, delta)
        return x if hidden else self.lm_head.forward(x)


def expected_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by Hugging Face name, with its [out, in] shape (`lm_head` only when untied)."""
    d, hd = config.hidden_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, d),
        "model.norm.weight": (d,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "mlp.gate_proj.weight": (config.intermediate_size, d),
            p + "mlp.up_proj.weight": (config.intermediate_size, d),
            p + "mlp.down_proj.weight": (d, config.intermediate_size),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
        if config.attention_bias:
            shapes |= {f"{p}self_attn.{n}_proj.bias": (size,) for n, size in (("q", q), ("k", kv), ("v", kv))}
        if config.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    return shapes


def linear_sources(config: ModelConfig) -> dict[str, list[str]]:
    """Each linear layer of the model, by module name, with the Hugging Face weights fuse_hf_weights makes it of."""
    sources = {"lm_head": ["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"]}
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        sources[dst + "attention.wqkv"] = [f"{src}self_attn.{n}_proj.weight" for n in "qkv"]
        sources[dst + "attention.wo"] = [src + "self_attn.o_proj.weight"]
        sources[dst + "feed_forward.w13"] = [src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"]
        sources[dst + "feed_forward.w2"] = [src + "mlp.down_proj.weight"]
    return sources


def fuse_hf_weights(
    config: ModelConfig, hf: Mapping[str, torch.Tensor], skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """Renames Hugging Face weights to this model's state dict, concatenating q/k/v and gate/up; the names in `skip`
    are left out, and the weights only they are made of never asked of `hf`."""
    parts: dict[str, Callable[[], torch.Tensor]] = {
        "embed.weight": lambda: hf["model.embed_tokens.weight"],
        "norm.weight": lambda: hf["model.norm.weight"],
        "lm_head.weight": lambda: hf["model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"],
    }
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        parts[dst + "attention.wqkv.weight"] = partial(_cat, hf, [f"{attn}{n}_proj.weight" for n in "qkv"])
        if config.attention_bias:
            parts[dst + "attention.wqkv.bias"] = partial(_cat, hf, [f"{attn}{n}_proj.bias" for n in "qkv"])
        if config.qk_norm:
            parts[dst + "attention.qk_norm.weight"] = partial(_qk_norm_rows, hf, attn, config)
        parts[dst + "attention.wo.weight"] = partial(hf.__getitem__, attn + "o_proj.weight")
        parts[dst + "feed_forward.w13.weight"] = partial(
            _cat, hf, [src + "mlp.gate_proj.weight", src + "mlp.up_proj.weight"]
        )
        parts[dst + "feed_forward.w2.weight"] = partial(hf.__getitem__, src + "mlp.down_proj.weight")
        parts[dst + "attention_norm.weight"] = partial(hf.__getitem__, src + "input_layernorm.weight")
        parts[dst + "ffn_norm.weight"] = partial(hf.__getitem__, src + "post_attention_layernorm.weight")
    return {name: make() for name, make in parts.items() if name not in skip}


def _cat(hf: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([hf[name] for name in names])


def _qk_norm_rows(hf: Mapping[str, torch.Tensor], attn: str, config: ModelConfig) -> torch.Tensor:
    q_rows = hf[attn + "q_norm.weight"].expand(config.num_heads, -1)
    k_rows = hf[attn + "k_norm.weight"].expand(config.num_kv_heads, -1)
    return torch.cat([q_rows, k_rows])
