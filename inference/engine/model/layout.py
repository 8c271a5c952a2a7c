"""The model's tensors and the Hugging Face tensors each is made of, in one table (`TOP`, `LAYER`).

The engine fuses some checkpoint tensors into one: q/k/v into one matrix (and one bias), gate/up into another, and
qwen3's per-head q_norm/k_norm (one row each in a checkpoint) into one [H + Hkv, hd] weight with each row repeated
per head, so a layer runs one matmul (one norm) where the checkpoint has several. Each model tensor lists its parts
in the order they are stacked along its first dim, with their shapes, so everything that maps one naming to the
other reads it from here: the loaders' shape checks (`expected_hf_shapes`) and GGUF names, the fusion at load
(`fuse_hf_weights`), the linear layers' sources (`linear_sources`) and the trainer's views of the fused tensors
(weights/parameter_views.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from inference.engine.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class PartSpec:
    """One checkpoint tensor of a model tensor; names after "model.layers.N." (HF) or "blk.N." (GGUF) in a layer."""

    hf: str
    gguf: str  # llama.cpp's name
    shape: tuple[str, ...]  # its dims as stored, by name (see `dims`): [out, in] for a weight
    copies: str | None = None  # a one-row norm the model repeats this many times (a dim's name), one per head
    rope_heads: str | None = None  # rows RoPE rotates, in this many heads (a dim's name): q's and k's


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of the model's state dict (after "layers.N." in a layer), present when `when` holds."""

    name: str
    parts: tuple[PartSpec, ...]
    linear: bool = False  # a linear layer's weight
    when: Callable[[ModelConfig], bool] = lambda config: True


def _proj(p: str, rows: str, kind: str = "weight", rope: str | None = None) -> PartSpec:
    """q_proj's, k_proj's or v_proj's weight [rows, d] or bias [rows]."""
    shape = (rows, "d") if kind == "weight" else (rows,)
    return PartSpec(f"self_attn.{p}_proj.{kind}", f"attn_{p}.{kind}", shape, rope_heads=rope)


# The Hugging Face names of the token embedding and the output head (tied: the embedding stands for both).
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
_EMBED = PartSpec(EMBEDDING, "token_embd.weight", ("vocab", "d"))
TOP = (
    TensorSpec("embed.weight", (_EMBED,)),
    TensorSpec("norm.weight", (PartSpec("model.norm.weight", "output_norm.weight", ("d",)),)),
    TensorSpec(
        "lm_head.weight",
        (PartSpec(LM_HEAD, "output.weight", ("vocab", "d")),),
        linear=True,
        when=lambda c: not c.tie_word_embeddings,
    ),
    TensorSpec("lm_head.weight", (_EMBED,), linear=True, when=lambda c: c.tie_word_embeddings),
)
LAYER = (
    TensorSpec(
        "attention.wqkv.weight",
        (_proj("q", "q", rope="heads"), _proj("k", "kv", rope="kv_heads"), _proj("v", "kv")),
        linear=True,
    ),
    TensorSpec(
        "attention.wo.weight", (PartSpec("self_attn.o_proj.weight", "attn_output.weight", ("d", "q")),), linear=True
    ),
    TensorSpec(
        "feed_forward.w13.weight",
        (
            PartSpec("mlp.gate_proj.weight", "ffn_gate.weight", ("ffn", "d")),
            PartSpec("mlp.up_proj.weight", "ffn_up.weight", ("ffn", "d")),
        ),
        linear=True,
    ),
    TensorSpec(
        "feed_forward.w2.weight", (PartSpec("mlp.down_proj.weight", "ffn_down.weight", ("d", "ffn")),), linear=True
    ),
    TensorSpec("attention_norm.weight", (PartSpec("input_layernorm.weight", "attn_norm.weight", ("d",)),)),
    TensorSpec("ffn_norm.weight", (PartSpec("post_attention_layernorm.weight", "ffn_norm.weight", ("d",)),)),
    TensorSpec(
        "attention.wqkv.bias",
        (_proj("q", "q", "bias", "heads"), _proj("k", "kv", "bias", "kv_heads"), _proj("v", "kv", "bias")),
        when=lambda c: c.attention_bias,
    ),
    TensorSpec(
        "attention.qk_norm.weight",
        (
            PartSpec("self_attn.q_norm.weight", "attn_q_norm.weight", ("hd",), copies="heads"),
            PartSpec("self_attn.k_norm.weight", "attn_k_norm.weight", ("hd",), copies="kv_heads"),
        ),
        when=lambda c: c.qk_norm,
    ),
)


@dataclass(frozen=True, slots=True)
class Part:
    """A PartSpec of one config: full names, sizes in numbers (0: no copies, no RoPE heads)."""

    hf: str
    gguf: str
    shape: tuple[int, ...]
    copies: int
    rope_heads: int

    @property
    def rows(self) -> int:
        """Rows it takes in the model's tensor."""
        return self.copies or self.shape[0]


@dataclass(frozen=True, slots=True)
class ModelTensor:
    name: str
    parts: tuple[Part, ...]
    linear: bool

    @property
    def module(self) -> str:
        return self.name.rpartition(".")[0]


def dims(config: ModelConfig) -> dict[str, int]:
    hd = config.head_dim
    return {
        "d": config.hidden_size,
        "vocab": config.vocab_size,
        "ffn": config.intermediate_size,
        "hd": hd,
        "q": config.num_heads * hd,
        "kv": config.num_kv_heads * hd,
        "heads": config.num_heads,
        "kv_heads": config.num_kv_heads,
    }


def model_tensors(config: ModelConfig) -> list[ModelTensor]:
    """Every tensor of the model's state dict with the checkpoint tensors it is made of, in the checkpoint's order."""
    size = dims(config)

    def tensor(spec: TensorSpec, model: str, hf: str, gguf: str) -> ModelTensor:
        parts = tuple(
            Part(
                hf=hf + p.hf,
                gguf=gguf + p.gguf,
                shape=tuple(size[dim] for dim in p.shape),
                copies=size[p.copies] if p.copies else 0,
                rope_heads=size[p.rope_heads] if p.rope_heads else 0,
            )
            for p in spec.parts
        )
        return ModelTensor(model + spec.name, parts, spec.linear)

    tensors = [tensor(spec, "", "", "") for spec in TOP if spec.when(config)]
    for i in range(config.num_layers):
        layer = [spec for spec in LAYER if spec.when(config)]
        tensors += [tensor(spec, f"layers.{i}.", f"model.layers.{i}.", f"blk.{i}.") for spec in layer]
    return tensors


def expected_hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by Hugging Face name, with its [out, in] shape (`lm_head` only when untied)."""
    return {part.hf: part.shape for tensor in model_tensors(config) for part in tensor.parts}


def linear_sources(config: ModelConfig) -> dict[str, list[str]]:
    """Each linear layer of the model, by module name, with the Hugging Face weights fuse_hf_weights makes it of."""
    return {t.module: [part.hf for part in t.parts] for t in model_tensors(config) if t.linear}


def fuse_hf_weights(
    config: ModelConfig, hf: Mapping[str, torch.Tensor], skip: set[str] | frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """Hugging Face weights as this model's state dict: a tensor of one part is the part itself (so tied weights stay
    one tensor), one of several their concatenation; the names in `skip` are left out, and the weights only they
    are made of never asked of `hf`."""
    fused = {}
    for tensor in model_tensors(config):
        if tensor.name in skip:
            continue
        parts = [hf[p.hf].expand(p.copies, -1) if p.copies else hf[p.hf] for p in tensor.parts]
        fused[tensor.name] = parts[0] if len(tensor.parts) == 1 and not tensor.parts[0].copies else torch.cat(parts)
    return fused
