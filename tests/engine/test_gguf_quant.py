"""GGUF dequantization against the `gguf` package's own reference decoder, one test per supported tensor type.

Types gguf-py can encode (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are quantized from random floats with
`gguf.quants.quantize`; the K-quants and i-quants, which it can only decode, are random raw blocks with sane f16
scales, which exercises every bit of the packing.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from inference.engine.errors import LoadError
from inference.engine.loaders.gguf import read_gguf
from inference.engine.quant.gguf_dequant import SUPPORTED_TYPES, dequantize
from tests.engine.gguf_builders import hf_permute, write_gguf

# The types decoded by this project's own torch code, then those gguf-py's decoder does for it.
OWN_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
LIBRARY_TYPES = [Q.IQ1_S, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS]
TYPES = OWN_TYPES + LIBRARY_TYPES

# Where each K-quant or i-quant block keeps its f16 scales (d, and dmin for Q2_K/Q4_K/Q5_K).
_K_SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,)} | {
    qtype: (0,) for qtype in LIBRARY_TYPES if qtype.name.startswith("IQ")
}

# A llama with every matrix's input dim a multiple of 256, the K-quant block size.
CONFIG = {
    "model_type": "llama",
    "vocab_size": 16,
    "hidden_size": 256,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MATRICES = {
    "token_embd.weight": (16, 256),
    "output.weight": (16, 256),
    "blk.0.attn_q.weight": (256, 256),
    "blk.0.attn_k.weight": (128, 256),
    "blk.0.attn_v.weight": (128, 256),
    "blk.0.attn_output.weight": (256, 256),
    "blk.0.ffn_gate.weight": (256, 256),
    "blk.0.ffn_up.weight": (256, 256),
    "blk.0.ffn_down.weight": (256, 256),
}
NORMS = {"output_norm.weight": (256,), "blk.0.attn_norm.weight": (256,), "blk.0.ffn_norm.weight": (256,)}
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
    "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
    "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
    "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
    "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
    "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    "blk.0.attn_norm.weight": "model.layers.0.input_layernorm.weight",
    "blk.0.ffn_norm.weight": "model.layers.0.post_attention_layernorm.weight",
}


def encode(
    rng: np.random.Generator, qtype: Q, shape: tuple[int, int], k_scales: tuple[float, float] = (1e-3, 2e-2)
) -> tuple[np.ndarray, Q]:
    """Random weights of `shape` (torch order) as the bytes of a `qtype` tensor: [rows, bytes per row] uint8.
    K-quant super-block scales are drawn from `k_scales`."""
    if qtype in _K_SCALE_OFFSETS:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, size=(shape[0] * shape[1] // block_size, type_size), dtype=np.uint8)
        for offset in _K_SCALE_OFFSETS[qtype]:
            scales = rng.uniform(*k_scales, size=(blocks.shape[0], 1)).astype(np.float16)
            blocks[:, offset : offset + 2] = scales.view(np.uint8)
        return blocks.reshape(shape[0], -1), qtype
    weights = rng.standard_normal(shape).astype(np.float32)
    raw = gguf.quants.quantize(weights, qtype)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(shape[0], -1), qtype


def reference(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> torch.Tensor:
    """gguf-py's own dequantization of `raw`, as a float32 torch tensor of `shape`."""
    values = gguf.quants.dequantize(np.ascontiguousarray(raw).view(np.uint8).reshape(shape[0], -1), qtype)
    return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)


def test_supported_types_are_these():
    assert set(SUPPORTED_TYPES) == set(TYPES)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_equals_gguf_reference(qtype: Q):
    rng = np.random.default_rng(int(qtype))
    shape = (3, 512)
    raw, _ = encode(rng, qtype, shape)
    got = dequantize(raw, qtype, shape)
    assert got.dtype == torch.float32 and tuple(got.shape) == shape
    assert torch.equal(got, reference(raw, qtype, shape))


# Half a quantization step, as a fraction of a block's largest |value| (Q4_1 and Q5_1 step over the block's range,
# up to twice that), with room for the float16 scales' rounding.
CLOSE = {Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 0.5 / 127, Q.Q4_0: 1 / 8, Q.Q4_1: 1 / 15, Q.Q5_0: 1 / 32, Q.Q5_1: 1 / 31}


@pytest.mark.parametrize("qtype", list(CLOSE), ids=lambda t: t.name)
def test_dequantized_weights_stay_close_to_the_originals(qtype: Q):
    weights = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    raw = gguf.quants.quantize(weights, qtype)
    got = dequantize(raw, qtype, weights.shape)
    bound = (CLOSE[qtype] + 1e-3) * np.abs(weights).max()
    assert (got - torch.from_numpy(weights)).abs().max().item() <= bound


def test_dequantize_refuses_wrong_byte_count():
    raw = np.zeros((2, 34), dtype=np.uint8)  # two Q8_0 blocks = 64 values
    with pytest.raises(ValueError, match="do not hold"):
        dequantize(raw, Q.Q8_0, (3, 32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quantized_model_loads_to_the_reference_weights(tmp_path: Path, qtype: Q):
    rng = np.random.default_rng(100 + int(qtype))
    tensors = {name: encode(rng, qtype, shape) for name, shape in MATRICES.items()}
    tensors |= {name: rng.standard_normal(shape).astype(np.float32) for name, shape in NORMS.items()}
    path = write_gguf(tmp_path / f"tiny-{qtype.name}.gguf", CONFIG, tensors)

    checkpoint = read_gguf(path)

    assert checkpoint.config.hidden_size == 256 and checkpoint.config.vocab_size == 16
    assert set(checkpoint.tensors) == set(HF_NAMES.values())
    for name, value in tensors.items():
        if isinstance(value, tuple):
            want = reference(value[0], qtype, MATRICES[name])
        else:
            want = torch.from_numpy(value)
        if name == "blk.0.attn_q.weight":
            want = hf_permute(want, CONFIG["num_attention_heads"])
        elif name == "blk.0.attn_k.weight":
            want = hf_permute(want, CONFIG["num_key_value_heads"])
        got = checkpoint.tensors[HF_NAMES[name]]
        assert got.dtype == torch.float32
        assert torch.equal(got, want), name


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path):
    """A ternary (TQ2_0) tensor, which only BitNet models hold, is refused by name."""
    rng = np.random.default_rng(7)
    tensors = {name: encode(rng, Q.Q8_0, shape) for name, shape in MATRICES.items()}
    tensors |= {name: np.ones(shape, dtype=np.float32) for name, shape in NORMS.items()}
    rows, cols = MATRICES["blk.0.ffn_up.weight"]
    block_size, type_size = GGML_QUANT_SIZES[Q.TQ2_0]
    tensors["blk.0.ffn_up.weight"] = (np.zeros((rows, cols // block_size * type_size), dtype=np.uint8), Q.TQ2_0)
    path = write_gguf(tmp_path / "tq2_0.gguf", CONFIG, tensors)

    with pytest.raises(LoadError, match=r"blk\.0\.ffn_up\.weight has type TQ2_0") as error:
        read_gguf(path)
    assert error.value.path == str(path)
