"""GGUF tensors stored quantized (Q4_0, Q4_K, Q5_K, Q6_K, Q8_0, and the rest the reader decodes) stay quantized in
memory on CPU: logits within a tolerance per type of the same file expanded to float32, a fraction of the weight
bytes, small layers and float tensors computed as before, and stories260K's greedy tokens from a Q8_0 file those of
the float32 expansion."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from torch import nn

from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.gguf import read_gguf
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.loaders.loading import linear_formats, load_model, weight_bytes
from inference.engine.model.layout import EMBEDDING, linear_sources
from inference.engine.model.transformer import Transformer
from inference.engine.quant.block_codecs import (
    decode_q4_1,
    decode_q4_k,
    decode_q5_0,
    decode_q5_1,
    decode_q5_k,
    decode_q6_k,
    decode_q8_0,
)
from inference.engine.quant.block_quant import BlockParts
from inference.engine.quant.int4 import GROUP_SIZE, group_quantize
from inference.engine.quant.stored_embedding import StoredEmbedding
from inference.engine.quant.stored_quant import LAYERS, QUANTIZED_TYPES, KeepQuantized
from tests.engine.gguf_builders import gguf_name, meta_permute, tokenizer_of, write_gguf
from tests.engine.kernel_marks import needs_block_kernel
from tests.engine.test_gguf_quant import CONFIG, MATRICES, NORMS, encode
from tests.greedy import greedy

PROMPTS = [[1, 5, 9, 3, 7, 2, 11, 4], [1, 15, 14, 13, 12, 6, 8, 10, 0, 3]]

# A one-layer llama whose five linear layers (the output head too) are large enough to stay quantized.
WIDE = CONFIG | {
    "vocab_size": 512,
    "hidden_size": 512,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
VOCAB_ROWS = ("token_embd.weight", "output.weight")
# test_gguf_quant's tensors at twice the width, and the vocabulary's rows at WIDE's vocabulary.
WIDE_MATRICES = {name: (512 if name in VOCAB_ROWS else 2 * rows, 2 * cols) for name, (rows, cols) in MATRICES.items()}
WIDE_NORMS = {name: (2 * width,) for name, (width,) in NORMS.items()}

# max |logit difference| / max |reference logit| on these models, per in-memory form and stored type. q4_0, q8_0,
# q4_k, q5_k, q6_k of the same type: the file's blocks, activations quantized to 8 bits per 32 values
# (quant/block_quant.py); int4: the bfloat16 rounding of
# activations, scales and zeros (the file's 16 levels are kept, quant/int4.py); int8: the weights requantized per
# output channel and the activations per call (7 bits on a CPU without VNNI, quant/quantize.py).
# docs/quantized-weights.md lists what was measured.
TOLERANCE = {
    ("q4_0", "Q4_0"): 0.02,
    ("q8_0", "Q8_0"): 0.02,
    ("q4_k", "Q4_K"): 0.02,
    ("q6_k", "Q6_K"): 0.05,  # the file's weights: what is left is the activations' 8 bits, which this model amplifies
    ("q5_k", "Q5_K"): 0.02,
    ("q5_0", "Q5_0"): 0.03,
    ("q4_1", "Q4_1"): 0.03,
    ("q5_1", "Q5_1"): 0.03,
    ("q3_k", "Q3_K"): 0.02,  # held in Q6_K's layout
    ("q8_0", "IQ4_XS"): 0.02,  # Q8_0 blocks re-encoded from the expansion, a second rounding
    ("int4", "Q4_0"): 0.02,
    ("int4", "Q4_K"): 0.02,
    ("int8", "Q4_0"): 0.1,
    ("int8", "Q4_K"): 0.02,
    ("int8", "Q5_K"): 0.02,
    ("int8", "Q6_K"): 0.2,
    ("int8", "Q8_0"): 0.1,
}


def _model(path: Path, keep: KeepQuantized | None = None) -> Transformer:
    checkpoint = read_gguf(path)
    return build_model(checkpoint.config, checkpoint.tensors, context_window=64, keep=keep)


def _keep(path: Path, form: str, **options) -> KeepQuantized:
    """What keeps the stored types quantized in `form` ("q4_0", "q8_0", "q4_k", "q5_k", "q6_k", "q5_0", "int4" or
    "int8") on any CPU; `options` are KeepQuantized's others."""
    checkpoint = read_gguf(path)
    stored = {n: t for n, t in checkpoint.tensor_types.items() if t in QUANTIZED_TYPES}
    block_kernel = form not in ("int4", "int8")
    return KeepQuantized(
        stored, checkpoint.file_bytes, block_kernel=block_kernel, int4_kernel=form == "int4", **options
    )


def _logits(model: Transformer) -> list[torch.Tensor]:
    runner = ModelRunner(model, max_concurrent=1, context_window=64)
    out = []
    for ids in PROMPTS:
        slot = runner.allocate_slot()
        out.append(runner.prefill(slot, ids, all_logits=True))
        runner.free_slot(slot)
    return out


# Each K-quant's super-block scale range that puts its weights at a trained model's scale (|w| ~ 0.05): random
# blocks otherwise give weights up to ~80 (Q6_K), whose activations no trained model has.
K_SCALE_RANGE = {
    Q.Q4_K: (1e-4, 4e-4),
    Q.Q5_K: (5e-5, 2e-4),
    Q.Q6_K: (6.2e-5, 1.2e-4),
    Q.Q3_K: (2e-4, 8e-4),
    Q.IQ4_XS: (1e-5, 4e-5),
}


def encode_at_scale(rng: np.random.Generator, qtype: Q, shape: tuple[int, int]) -> tuple[np.ndarray, Q]:
    """Random weights of `shape` as `qtype` bytes, at a trained model's scale (test_gguf_quant.encode's are ~1)."""
    if qtype in K_SCALE_RANGE:
        blocks, _ = encode(rng, qtype, shape, K_SCALE_RANGE[qtype])
        if qtype == Q.Q6_K:  # its 16 int8 sub-block scales, as a quantizer sets them: within 2x of the largest
            per_block = blocks.reshape(-1, GGML_QUANT_SIZES[qtype][1])
            per_block[:, 192:208] = rng.integers(64, 128, size=(per_block.shape[0], 16), dtype=np.uint8)
        return blocks, qtype
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        return encode_values((0.05 * rng.standard_normal(shape)).astype(np.float32), qtype)
    return encode(rng, qtype, shape)


# A Q4_K_M file's mix (llama.cpp's llama-quantize): Q4_K, with v, the down projection (in half the layers) and the
# output head in Q6_K.
Q4_K_M = {"blk.0.attn_v.weight": Q.Q6_K, "blk.0.ffn_down.weight": Q.Q6_K, "output.weight": Q.Q6_K}


def write_wide_gguf(
    tmp_path: Path,
    qtype: Q,
    config=WIDE,
    matrices=WIDE_MATRICES,
    norms=WIDE_NORMS,
    tokenizer: Path | None = None,
    types: dict[str, Q] | None = None,
) -> Path:
    """A random llama (WIDE unless told otherwise) whose matrices are `qtype` (`types` names others by GGUF tensor
    name), with `tokenizer`'s vocabulary."""
    rng = np.random.default_rng(7 + int(qtype))
    types = types or {}
    tensors = {name: encode_at_scale(rng, types.get(name, qtype), shape) for name, shape in matrices.items()}
    tensors |= {name: (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in norms.items()}
    extra = tokenizer_of(tokenizer) if tokenizer else None
    return write_gguf(tmp_path / f"model-{qtype.name}.gguf", config, tensors, extra=extra)


@needs_block_kernel
@pytest.mark.parametrize(("form", "qtype"), list(TOLERANCE), ids=lambda v: v if isinstance(v, str) else v.name)
def test_quantized_tensors_stay_quantized_within_tolerance(tmp_path: Path, form: str, qtype: str):
    path = write_wide_gguf(tmp_path, Q[qtype])
    reference, kept = _model(path), _model(path, _keep(path, form))
    layers = [m for m in kept.modules() if isinstance(m, LAYERS[form])]
    assert len(layers) == 5  # wqkv, wo, w13, w2 and the output head
    assert weight_bytes(kept) < (0.6 if form == "int8" else 0.5) * weight_bytes(reference)
    for got, want in zip(_logits(kept), _logits(reference), strict=True):
        assert (got - want).abs().max().item() <= TOLERANCE[form, qtype] * want.abs().max().item()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.Q3_K], ids=lambda t: t.name)
def test_layers_made_from_the_files_bytes_hold_its_weights_exactly(tmp_path: Path, qtype: Q):
    """Made from the file's bytes, each layer (q, k and v fused, q and k rows in the model's order; gate and up
    fused) stands for exactly the weights the file expands to."""
    path = write_wide_gguf(tmp_path, qtype)
    checkpoint = read_gguf(path)
    form = qtype.name.lower()
    model = _model(path, _keep(path, form))
    sources = linear_sources(checkpoint.config)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LAYERS[form])}
    assert sorted(layers) == sorted(sources)
    decode = {
        Q.Q4_K: decode_q4_k,
        Q.Q5_K: decode_q5_k,
        Q.Q6_K: decode_q6_k,
        Q.Q5_0: decode_q5_0,
        Q.Q4_1: decode_q4_1,
        Q.Q5_1: decode_q5_1,
        Q.Q3_K: decode_q6_k,
    }[qtype]
    for name, layer in layers.items():
        expanded = torch.cat([checkpoint.tensors[source] for source in sources[name]])
        assert torch.equal(decode(layer.codes, layer.scales), expanded), name


@needs_block_kernel
def test_a_layer_fused_from_several_types_keeps_each_ones_blocks(tmp_path: Path):
    """A Q4_K_M file's q and k (Q4_K) and v (Q6_K) make one layer of two block parts, each the file's weights."""
    path = write_wide_gguf(tmp_path, Q.Q4_K, types=Q4_K_M)
    reference, kept = _model(path), _model(path, _keep(path, "q4_k"))
    assert linear_formats(kept) == {"q4_k+q6_k": 1, "q4_k": 2, "q6_k": 2}
    wqkv = kept.layers[0].attention.wqkv
    assert isinstance(wqkv, BlockParts) and wqkv.columns == [0, 512 + 256]  # q and k, then v
    expanded = read_gguf(path).tensors
    q_k = torch.cat([expanded[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qk"])
    assert torch.equal(decode_q4_k(wqkv.parts[0].codes, wqkv.parts[0].scales), q_k)
    v = expanded["model.layers.0.self_attn.v_proj.weight"]
    assert torch.equal(decode_q6_k(wqkv.parts[1].codes, wqkv.parts[1].scales), v)
    for got, want in zip(_logits(kept), _logits(reference), strict=True):
        assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()


# A model whose hidden size is not a multiple of 256 (Qwen2.5-0.5B's 896, SmolLM2's 576 and 960), as llama.cpp's
# llama-quantize writes its Q4_K_M file: Q4_K cannot hold rows of 640 values, so those tensors are Q5_0 and the Q6_K
# ones (v, the output head) Q8_0; the down projection's rows (1,024 values) are Q4_K.
NARROW_ROWS = CONFIG | {
    "vocab_size": 512,
    "hidden_size": 640,
    "intermediate_size": 1024,
    "num_attention_heads": 10,
    "num_key_value_heads": 2,
}
NARROW_ROWS_MATRICES = {
    "token_embd.weight": (512, 640),
    "output.weight": (512, 640),
    "blk.0.attn_q.weight": (640, 640),
    "blk.0.attn_k.weight": (128, 640),
    "blk.0.attn_v.weight": (128, 640),
    "blk.0.attn_output.weight": (640, 640),
    "blk.0.ffn_gate.weight": (1024, 640),
    "blk.0.ffn_up.weight": (1024, 640),
    "blk.0.ffn_down.weight": (640, 1024),
}
Q4_K_M_FALLBACKS = {"blk.0.attn_v.weight": Q.Q8_0, "output.weight": Q.Q8_0, "blk.0.ffn_down.weight": Q.Q4_K}


@needs_block_kernel
def test_a_q4_k_m_file_with_rows_not_a_multiple_of_256_keeps_its_blocks(tmp_path: Path, stories_gguf_path: Path):
    """Its Q5_0 and Q8_0 layers, whose rows of 640 values are not whole super-blocks of the kernel, keep the file's
    weights exactly in rows padded with zero blocks; the logits stay near the float32 expansion's."""
    path = write_narrow_rows_gguf(tmp_path, stories_gguf_path)
    checkpoint = read_gguf(path)
    assert set(checkpoint.tensor_types.values()) == {"Q5_0", "Q8_0", "Q4_K", "F32"}
    kept = load_model(path, max_concurrent=1, context_window=64).runner.model
    assert linear_formats(kept) == {"q5_0+q8_0": 1, "q5_0": 2, "q4_k": 1, "q8_0": 1}
    wqkv = kept.layers[0].attention.wqkv
    q_k = torch.cat([checkpoint.tensors[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qk"])
    assert torch.equal(decode_q5_0(wqkv.parts[0].codes, wqkv.parts[0].scales, 640), q_k)
    v = checkpoint.tensors["model.layers.0.self_attn.v_proj.weight"]
    assert torch.equal(decode_q8_0(wqkv.parts[1].codes, wqkv.parts[1].scales, 640), v)
    reference = load_model(path, dtype="float32", max_concurrent=1, context_window=64).runner.model
    for got, want in zip(_logits(kept), _logits(reference), strict=True):
        assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()


def write_narrow_rows_gguf(tmp_path: Path, tokenizer: Path | None = None) -> Path:
    """The Q4_K_M-like file of NARROW_ROWS: Q5_0, with Q4_K_M_FALLBACKS."""
    norms = {name: (640,) for name in WIDE_NORMS}
    return write_wide_gguf(tmp_path, Q.Q5_0, NARROW_ROWS, NARROW_ROWS_MATRICES, norms, tokenizer, Q4_K_M_FALLBACKS)


@needs_block_kernel
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q5_0, Q.Q5_1], ids=lambda t: t.name)
def test_a_load_never_expands_the_layers_it_keeps_in_blocks(tmp_path: Path, qtype: Q):
    """Made from the file's bytes, the kept layers' weights are never decoded to float32: only the embedding and
    the norms are (so a load's peak memory is near the file's size, not the float32 model's)."""
    path = write_wide_gguf(tmp_path, qtype, types=Q4_K_M if qtype == Q.Q4_K else None)
    checkpoint = read_gguf(path)
    stored = {n: t for n, t in checkpoint.tensor_types.items() if t in QUANTIZED_TYPES}
    keep = KeepQuantized(stored, checkpoint.file_bytes, block_kernel=True)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64, keep=keep)
    assert linear_formats(model).get("float32", 0) == 0
    assert checkpoint.tensors.decoded == {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.0.{norm}.weight" for norm in ("input_layernorm", "post_attention_layernorm")
    }
    for got, want in zip(_logits(model), _logits(_model(path)), strict=True):
        assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()


@needs_block_kernel
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.Q5_0, Q.Q3_K], ids=lambda t: t.name)
def test_a_large_quantized_embedding_keeps_the_files_rows(tmp_path: Path, qtype: Q):
    """Over the size threshold, the token embedding is the file's rows (never expanded whole), each looked-up row
    expanded exactly as the float table held it: the logits are the float table's bit for bit."""
    path = write_wide_gguf(tmp_path, qtype)
    checkpoint = read_gguf(path)
    keep = _keep(path, "q8_0", min_embedding_elements=512 * 512)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64, keep=keep)
    assert isinstance(model.embed, StoredEmbedding)
    assert torch.equal(model.embed.rows, checkpoint.file_bytes[EMBEDDING])
    assert EMBEDDING not in checkpoint.tensors.decoded
    float_table = _model(path, _keep(path, "q8_0", min_embedding_elements=512 * 512 + 1))
    assert isinstance(float_table.embed, nn.Embedding)
    assert weight_bytes(model) <= weight_bytes(float_table) - 512 * 512 * (4 - 34 / 32)  # at most Q8_0's bytes
    for got, want in zip(_logits(model), _logits(float_table), strict=True):
        assert torch.equal(got, want)


@needs_block_kernel
@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.IQ4_XS], ids=lambda t: t.name)
def test_a_tied_quantized_embedding(tmp_path: Path, qtype: Q):
    """Tied to the output head (no output.weight in the file), a Q6_K table is the head's blocks, made from the
    file's bytes, and the embedding reads its rows from them (held once): only the norms are decoded. An IQ4_XS one's
    head is Q8_0 blocks of the table's expansion (its bytes, kept for the embedding, are not Q8_0's), and the
    embedding keeps the file's rows. Either way the logits are the float table's bit for bit."""
    matrices = {name: shape for name, shape in WIDE_MATRICES.items() if name != "output.weight"}
    path = write_wide_gguf(tmp_path, qtype, WIDE | {"tie_word_embeddings": True}, matrices)
    checkpoint = read_gguf(path)
    assert checkpoint.config.tie_word_embeddings
    keep = _keep(path, "q8_0", min_embedding_elements=0)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64, keep=keep)
    assert isinstance(model.embed, StoredEmbedding)
    assert linear_formats(model) == {"q6_k" if qtype == Q.Q6_K else "q8_0": 5}
    expanded = {name for name in checkpoint.tensors.decoded if not name.endswith("norm.weight")}
    assert expanded == (set() if qtype == Q.Q6_K else {name for name in checkpoint.tensor_types if "norm" not in name})
    assert model.embed.weight_nbytes == (0 if qtype == Q.Q6_K else checkpoint.file_bytes[EMBEDDING].numel())
    float_table = _model(path, _keep(path, "q8_0", min_embedding_elements=1 << 40))
    for got, want in zip(_logits(model), _logits(float_table), strict=True):
        assert torch.equal(got, want)
    for got, want in zip(_logits(model), _logits(_model(path)), strict=True):
        assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()


@needs_block_kernel
def test_a_tied_embedding_reads_padded_rows_of_the_head(tmp_path: Path):
    """A table 640 wide tied to a Q5_0 head, whose rows the kernel pads to 768 values: each looked-up row is the
    file's 640 values, and the logits are the float table's bit for bit."""
    matrices = {name: shape for name, shape in NARROW_ROWS_MATRICES.items() if name != "output.weight"}
    config = NARROW_ROWS | {"tie_word_embeddings": True}
    path = write_wide_gguf(tmp_path, Q.Q5_0, config, matrices, {name: (640,) for name in WIDE_NORMS})
    model = _model(path, _keep(path, "q5_0", min_embedding_elements=0))
    assert isinstance(model.embed, StoredEmbedding) and model.embed.weight_nbytes == 0
    float_table = _model(path, _keep(path, "q5_0", min_embedding_elements=1 << 40))
    for got, want in zip(_logits(model), _logits(float_table), strict=True):
        assert torch.equal(got, want)


def test_float_tensors_compute_as_before(tmp_path: Path):
    path = write_wide_gguf(tmp_path, Q.F32)
    model = _model(path, _keep(path, "q4_0"))
    assert linear_formats(model) == {"float32": 5}
    for got, want in zip(_logits(model), _logits(_model(path)), strict=True):
        assert torch.equal(got, want)


def test_layers_that_fit_in_cache_stay_float(tmp_path: Path):
    narrow = CONFIG | {"vocab_size": 256}  # every layer, the output head too, under MIN_QUANTIZED_ELEMENTS
    matrices = {name: (shape[0] // 2, shape[1] // 2) for name, shape in WIDE_MATRICES.items()}
    path = write_wide_gguf(tmp_path, Q.Q8_0, narrow, matrices, {n: (256,) for n in WIDE_NORMS})
    model = _model(path, _keep(path, "q4_0"))
    assert linear_formats(model) == {"float32": 5}
    for got, want in zip(_logits(model), _logits(_model(path)), strict=True):
        assert torch.equal(got, want)


def test_a_group_of_sixteen_even_levels_is_kept_exactly():
    levels = torch.arange(16, dtype=torch.float32) * 0.25 - 2.0  # 16 evenly spaced values, bfloat16-exact
    weight = levels.repeat(16, 2 * GROUP_SIZE // 16)[:, torch.randperm(2 * GROUP_SIZE)]
    codes, scales_zeros = group_quantize(weight)
    groups = codes.reshape(16, 2, GROUP_SIZE).float() - 8
    scale, zero = scales_zeros.float().transpose(0, 1)[..., :1], scales_zeros.float().transpose(0, 1)[..., 1:]
    assert torch.equal((groups * scale + zero).reshape(16, -1), weight)


@needs_block_kernel
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q5_0, Q.Q3_K], ids=lambda t: t.name)
def test_a_load_reports_its_linear_layers_formats(tmp_path: Path, qtype: Q, stories_gguf_path: Path):
    path = write_wide_gguf(tmp_path, qtype, tokenizer=stories_gguf_path)
    automatic = load_model(path, max_concurrent=1, context_window=64)
    expected = qtype.name.lower()  # the file's blocks
    assert linear_formats(automatic.runner.model) == {expected: 5}
    assert linear_formats(load_model(path, dtype="float32", max_concurrent=1, context_window=64).runner.model) == {
        "float32": 5
    }


def _stories_as_gguf(path: Path, stories_hf_dir: Path, stories_gguf_path: Path, qtype: Q) -> Path:
    checkpoint = read_hf_dir(stories_hf_dir)
    config = checkpoint.config
    hf_config = CONFIG | {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "max_position_embeddings": config.context_limit,
        "rms_norm_eps": config.rms_norm_eps,
    }
    tensors = {}
    for name, tensor in checkpoint.tensors.items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            tensor = meta_permute(tensor, heads)
        values = tensor.float().numpy()
        tensors[gguf_name(name)] = (
            encode_values(values, qtype) if values.ndim == 2 and values.shape[1] % 32 == 0 else values
        )
    return write_gguf(path, hf_config, tensors, extra=tokenizer_of(stories_gguf_path))


def encode_values(values: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """float32 `values` [rows, cols] as the bytes of a `qtype` tensor (a type gguf-py can quantize to)."""
    raw = gguf.quants.quantize(np.ascontiguousarray(values), qtype)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(values.shape[0], -1), qtype


def test_stories260k_from_q8_0_decodes_the_float32_expansions_greedy_tokens(
    tmp_path: Path, stories_hf_dir: Path, stories_gguf_path: Path
):
    path = _stories_as_gguf(tmp_path / "stories260K-Q8_0.gguf", stories_hf_dir, stories_gguf_path, Q.Q8_0)
    assert "Q8_0" in read_gguf(path).tensor_types.values()
    outputs = []
    for dtype in (None, "float32"):
        runner = load_model(path, dtype=dtype, max_concurrent=1, context_window=256).runner
        outputs.append([token for prompt in PROMPTS for token in greedy(runner, prompt, 64).tokens])
    assert outputs[0] == outputs[1]
