"""Writes small GGUF files for the loader tests with the `gguf` package's own GGUFWriter.

Weights come in Hugging Face naming and layout and are written the way llama.cpp's converter lays them out: GGUF
names, and for the `llama` architecture q/k rows in Meta's interleaved RoPE order. The name table and the RoPE
reordering here are written independently of the loader, so the tests compare two separate implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

# A tensor to write: float32/float16 numpy (type inferred), or already-encoded bytes with their ggml type.
Encoded = tuple[np.ndarray, gguf.GGMLQuantizationType]

_HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_TO_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name in _HF_TO_GGUF_TOP:
        return _HF_TO_GGUF_TOP[hf_name]
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF_LAYER[rest]}"


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved q/k rows -> HF rotate_half rows: the formula in shared/models/README.md."""
    head_dim = w.shape[0] // n_heads
    return w.view(n_heads, head_dim // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def meta_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF rotate_half q/k rows -> Meta's interleaved rows (what llama.cpp's converter stores for `llama`)."""
    head_dim = w.shape[0] // n_heads
    return w.view(n_heads, 2, head_dim // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_tensors_from_hf(hf_tensors: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """GGUF-named float32 arrays in torch [out, in] order; llama q/k reordered to the interleaved layout."""
    out = {}
    for name, tensor in hf_tensors.items():
        tensor = tensor.detach().float()
        if hf_config["model_type"] == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = hf_config["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"]
            tensor = meta_permute(tensor, heads)
        out[gguf_name(name)] = tensor.numpy().copy()
    return out


def write_gguf(
    path: Path,
    hf_config: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray | Encoded],
    *,
    arch: str | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Writes `tensors` (GGUF names, torch order) with the metadata llama.cpp would derive from `hf_config`."""
    arch = arch or hf_config["model_type"]
    writer = gguf.GGUFWriter(path, arch)
    rope = hf_config.get("rope_parameters") or {}
    writer.add_context_length(hf_config["max_position_embeddings"])
    writer.add_embedding_length(hf_config["hidden_size"])
    writer.add_block_count(hf_config["num_hidden_layers"])
    writer.add_feed_forward_length(hf_config["intermediate_size"])
    writer.add_head_count(hf_config["num_attention_heads"])
    writer.add_head_count_kv(hf_config["num_key_value_heads"])
    if hf_config.get("head_dim"):
        writer.add_key_length(hf_config["head_dim"])
        writer.add_value_length(hf_config["head_dim"])
    writer.add_layer_norm_rms_eps(hf_config["rms_norm_eps"])
    writer.add_rope_freq_base(hf_config.get("rope_theta") or rope.get("rope_theta", 10000.0))
    if hf_config.get("bos_token_id") is not None:
        writer.add_bos_token_id(hf_config["bos_token_id"])
    if hf_config.get("eos_token_id") is not None:
        writer.add_eos_token_id(hf_config["eos_token_id"])
    if extra is not None:
        extra(writer)
    for name, value in tensors.items():
        if isinstance(value, tuple):
            raw, qtype = value
            writer.add_tensor(name, raw, raw_dtype=qtype)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tokenizer_of(source: Path) -> Callable[[gguf.GGUFWriter], None]:
    """An `extra` for write_gguf that copies the `tokenizer.*` metadata of the GGUF file `source`."""
    fields = [f for f in gguf.GGUFReader(str(source)).fields.values() if f.name.startswith("tokenizer.")]

    def add(writer: gguf.GGUFWriter) -> None:
        for field in fields:
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                writer.add_array(field.name, field.contents())
            else:
                writer.add_key_value(field.name, field.contents(), field.types[0])

    return add
