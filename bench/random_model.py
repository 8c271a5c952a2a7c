"""Writes the benchmarks' random ~85M-parameter Llama, as a Hugging Face directory and as GGUF files (F32, and
quantized with the `gguf` package: Q8_0 and Q4_0, the two types it can write).

Shaped like the model in PERFORMANCE-TARGETS (hidden 768, 12 layers, 12 heads, FFN 2048) with stories260K's
512-token vocabulary and tokenizer, so its numbers compare with llama.cpp's on the same shape. The weights are random
(seeded), so its text is noise; what it measures is arithmetic. Files go under var/bench/ and are reused.
`python bench/random_model.py random-w896` writes the other shape of SHAPES (Qwen2.5-0.5B's width) as F32 GGUF, for
llama.cpp's llama-quantize to make K-quant files of.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent
SHAPES = {
    "random85m": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 2048},
    # Qwen2.5-0.5B's width and FFN (896, 4864) in 6 layers: rows of 896 values, not a multiple of 256, which
    # llama.cpp's K-quant files hold as Q5_0 and Q8_0 (~98M parameters).
    "random-w896": {"hidden_size": 896, "num_hidden_layers": 6, "num_attention_heads": 14, "intermediate_size": 4864},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_random_llama(
    stories_hf: Path, stories_gguf: Path, out_dir: Path | None = None, seed: int = 0, name: str = "random85m"
) -> tuple[Path, Path]:
    """Returns (hf_dir, gguf_path) of the model of SHAPES[name], writing them unless they already exist."""
    out_dir = out_dir or REPO / "var" / "bench"
    hf_dir, gguf_path = out_dir / f"{name}-hf", out_dir / f"{name}.gguf"
    if (hf_dir / "model.safetensors").exists() and gguf_path.exists():
        return hf_dir, gguf_path
    hf_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((stories_hf / "config.json").read_text())
    config.update(
        SHAPES[name],
        num_key_value_heads=SHAPES[name]["num_attention_heads"],
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    tensors = _random_tensors(config, seed)
    save_file(tensors, str(hf_dir / "model.safetensors"))
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        shutil.copy(stories_hf / name, hf_dir / name)
    _write_gguf(gguf_path, config, tensors, stories_gguf)
    return hf_dir, gguf_path


def write_quantized_gguf(stories_hf: Path, stories_gguf: Path, qtype: str, out_dir: Path | None = None) -> Path:
    """The random Llama as a GGUF file whose matrices are `qtype` ("Q8_0" or "Q4_0"); norms stay F32."""
    hf_dir, _ = write_random_llama(stories_hf, stories_gguf, out_dir)
    path = hf_dir.parent / f"random85m-{qtype}.gguf"
    if not path.exists():
        from safetensors.torch import load_file

        config = json.loads((hf_dir / "config.json").read_text())
        tensors = load_file(str(hf_dir / "model.safetensors"))
        _write_gguf(path, config, tensors, stories_gguf, gguf.GGMLQuantizationType[qtype])
    return path


def _random_tensors(config: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            **{p + f"self_attn.{x}_proj.weight": (d, d) for x in "qkvo"},
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    return {
        name: torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * 0.02
        for name, shape in shapes.items()
    }


def _meta_order(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF rotate_half q/k rows back to the interleaved order llama.cpp stores for arch `llama`."""
    return w.view(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    layer_names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{layer_names[rest.removesuffix('.weight')]}.weight"


def _write_gguf(
    path: Path,
    config: dict,
    tensors: dict[str, torch.Tensor],
    stories_gguf: Path,
    qtype: gguf.GGMLQuantizationType | None = None,
) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    _copy_tokenizer_metadata(stories_gguf, writer)
    for name, tensor in tensors.items():
        if ".q_proj." in name or ".k_proj." in name:
            tensor = _meta_order(tensor, config["num_attention_heads"])
        values = np.ascontiguousarray(tensor.numpy())
        if qtype is not None and values.ndim == 2:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(_gguf_name(name), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _copy_tokenizer_metadata(source: Path, writer: gguf.GGUFWriter) -> None:
    reader = gguf.GGUFReader(str(source))
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(field.name, value)
        else:
            writer.add_key_value(field.name, value, vtype)


if __name__ == "__main__":
    import argparse
    import os

    parser = argparse.ArgumentParser(description="Writes a random Llama of SHAPES under var/bench/ (F32 GGUF).")
    parser.add_argument("name", choices=sorted(SHAPES))
    parser.add_argument(
        "--models", type=Path, default=Path(os.environ.get("PANTHEON_TEST_MODELS", REPO.parent / "shared" / "models"))
    )
    args = parser.parse_args()
    print(write_random_llama(args.models / "stories260K-hf", args.models / "stories260K.gguf", name=args.name)[1])
