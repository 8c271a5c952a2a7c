"""The served weights under their Hugging Face names, each a view of the storage the engine computes with.

A trainer thinks in Hugging Face parameters; the engine fuses them (q/k/v into one matrix, gate/up into another,
qwen3's q_norm/k_norm repeated per head). In an attachable load every fused tensor is laid out so that each Hugging
Face parameter is a slice of it: a write through a view is a write to the served weights, with no copy to make
afterwards. The one exception is the per-head norm rows: a view can only be one row, so after a write the others
must be brought level with it (`repack`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from inference.engine.model.config import ModelConfig
from inference.engine.model.transformer import Transformer, expected_hf_shapes
from inference.engine.weights.shared_storage import SharedArena

if TYPE_CHECKING:
    from inference.engine.loaders.loading import LoadedModel

EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
CPU_DTYPES = (torch.float32,)
CUDA_DTYPES = (torch.float16, torch.bfloat16)


class ParameterMismatch(ValueError):
    """Tensors given for the served weights do not fit them: an unknown name or another shape."""


def _linear_weight(module: nn.Module, name: str) -> torch.Tensor:
    if not isinstance(module, nn.Linear):
        raise ValueError(f"{name} is a {type(module).__name__}: only an attachable load keeps [out, in] weights")
    return module.weight.detach()


class ParameterViews:
    """`views`: every Hugging Face parameter of the model by name, each sharing memory with the model's weights.

    `repacked` names the views that stand for several rows of a fused tensor (q_norm, k_norm): write them, then
    call `repack` (copy_in does). `arena` is the shared-memory file of a CPU load (None on CUDA), kept alive here
    as long as the views are.
    """

    def __init__(self, model: Transformer, config: ModelConfig):
        self.config = config
        self.arena: SharedArena | None = model.arena
        self._qk_norms: list[torch.Tensor] = []  # per layer's [H + Hkv, hd] weight, when the model has them
        hd, heads = config.head_dim, config.num_heads
        q, kv, inter = heads * hd, config.num_kv_heads * hd, config.intermediate_size
        views = {EMBED: model.embed.weight.detach(), "model.norm.weight": model.norm.weight.detach()}
        if not config.tie_word_embeddings:
            views[LM_HEAD] = _linear_weight(model.lm_head, LM_HEAD)
        self.repacked: list[str] = []
        for i, layer in enumerate(model.layers):
            p, attn, ffn = f"model.layers.{i}.", layer.attention, layer.feed_forward
            wqkv = _linear_weight(attn.wqkv, p + "self_attn.q_proj.weight")
            w13 = _linear_weight(ffn.w13, p + "mlp.gate_proj.weight")
            views |= {
                p + "self_attn.q_proj.weight": wqkv[:q],
                p + "self_attn.k_proj.weight": wqkv[q : q + kv],
                p + "self_attn.v_proj.weight": wqkv[q + kv :],
                p + "self_attn.o_proj.weight": _linear_weight(attn.wo, p + "self_attn.o_proj.weight"),
                p + "mlp.gate_proj.weight": w13[:inter],
                p + "mlp.up_proj.weight": w13[inter:],
                p + "mlp.down_proj.weight": _linear_weight(ffn.w2, p + "mlp.down_proj.weight"),
                p + "input_layernorm.weight": layer.attention_norm.weight.detach(),
                p + "post_attention_layernorm.weight": layer.ffn_norm.weight.detach(),
            }
            if config.attention_bias:
                bias = attn.wqkv.bias.detach()
                views |= {
                    p + "self_attn.q_proj.bias": bias[:q],
                    p + "self_attn.k_proj.bias": bias[q : q + kv],
                    p + "self_attn.v_proj.bias": bias[q + kv :],
                }
            if config.qk_norm:
                norm = attn.qk_norm.weight.detach()  # [H + Hkv, hd]: row 0 stands for q's heads, row H for k's
                self._qk_norms.append(norm)
                views |= {p + "self_attn.q_norm.weight": norm[0], p + "self_attn.k_norm.weight": norm[heads]}
                self.repacked += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        expected = expected_hf_shapes(config)
        self.views = {name: views[name] for name in expected}  # in the order a checkpoint lists them
        wrong = [name for name, view in self.views.items() if tuple(view.shape) != expected[name]]
        if wrong:
            raise ValueError(f"the model's {wrong[0]} does not have the shape its config gives")

    @property
    def layout(self) -> str:
        """ "views" when every parameter is its own region of storage, "views+repack" when some need `repack`."""
        return "views+repack" if self.repacked else "views"

    @torch.no_grad()
    def repack(self) -> None:
        """Copies each per-head norm's written row (0 for q, H for k) to the other rows of its heads."""
        heads = self.config.num_heads
        for norm in self._qk_norms:
            norm[1:heads].copy_(norm[0].expand(heads - 1, -1))
            norm[heads + 1 :].copy_(norm[heads].expand(norm.shape[0] - heads - 1, -1))

    @torch.no_grad()
    def copy_in(self, tensors: dict[str, torch.Tensor]) -> None:
        """Writes Hugging Face-named tensors into the served weights (converted to their dtype and device), then
        repacks. Every tensor is checked before any is written, so a mismatch (ParameterMismatch) changes nothing.
        With tied embeddings an lm_head.weight may come along (a full state dict) if it equals the embedding."""
        given = dict(tensors)
        if LM_HEAD in given and LM_HEAD not in self.views:
            head = given.pop(LM_HEAD)
            embed = given.get(EMBED, self.views[EMBED])
            if head.shape != embed.shape or not torch.equal(head.to(embed.device, embed.dtype), embed):
                raise ParameterMismatch(f"{LM_HEAD} differs from {EMBED}, but this model ties them")
        for name, tensor in given.items():
            view = self.views.get(name)
            if view is None:
                raise ParameterMismatch(f"{name} is not a parameter of this model")
            if tensor.shape != view.shape:
                raise ParameterMismatch(f"{name} has shape {list(tensor.shape)}, the model's is {list(view.shape)}")
        for name, tensor in given.items():
            self.views[name].copy_(tensor)
        self.repack()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Contiguous CPU copies under Hugging Face names, as a checkpoint stores them (no lm_head when tied)."""
        return {name: view.to("cpu", copy=True).contiguous() for name, view in self.views.items()}


def attach_refusal(model: LoadedModel, *, attachable_load: bool) -> str | None:
    """Why a trainer may not attach to `model`, as the spec's NOT_ATTACHABLE reason, or None when it may.

    `attachable_load` is whether the load was asked to be attachable. Only the reasons the weights themselves
    decide are answered here; whether serving can be paused is the barrier's to say.
    """
    if model.format == "gguf":
        return "gguf"
    if model.quantized:
        return "quantized"
    if model.dtype not in (CPU_DTYPES if model.device.type == "cpu" else CUDA_DTYPES):
        return "dtype"
    if not attachable_load or model.parameters is None:
        return "allocator"
    return None
