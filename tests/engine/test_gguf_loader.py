"""The GGUF loader against real references: the stories260K HF checkpoint, transformers models, and broken files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inference.engine.errors import LoadError
from inference.engine.loaders.gguf import read_gguf
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.loaders.loading import load_model
from inference.engine.model.config import ModelConfig
from inference.engine.model.rope import rope_inv_freq
from tests.engine.gguf_builders import gguf_tensors_from_hf, write_gguf

TINY = {
    "vocab_size": 48,
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CASES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"attention_bias": True}),
    "llama-tied": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"tie_word_embeddings": True}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16, "rope_theta": 1e6}),
}


def tiny_hf_model(case: str, **overrides) -> tuple[dict, dict[str, torch.Tensor]]:
    """A random transformers model: its config as config.json would hold it, and the weights it would save."""
    config_cls, model_cls, extra = CASES[case]
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY, **extra, **overrides))
    for param in model.parameters():  # norms and biases start at constants; make every tensor distinguishable
        torch.nn.init.normal_(param, std=0.5)
    config = {k: v for k, v in model.config.to_dict().items() if v is not None}
    state = dict(model.state_dict())
    if config.get("tie_word_embeddings"):
        del state["lm_head.weight"]
    # transformers' llama attention_bias also biases o_proj, which the engine (and GGUF's qwen2) have no place for;
    # the q/k/v biases alone are what the llama case checks: that they are reordered like their weights.
    return config, {name: t for name, t in state.items() if not name.endswith("o_proj.bias")}


def write_tiny_gguf(tmp_path: Path, case: str = "llama", edit=None, **write_options) -> Path:
    config, state = tiny_hf_model(case)
    tensors = gguf_tensors_from_hf(state, config)
    if edit is not None:
        edit(tensors)
    return write_gguf(tmp_path / f"{case}.gguf", config, tensors, **write_options)


# --- the real model -----------------------------------------------------------------------------------------------


def test_stories_gguf_gives_the_hf_checkpoint_tensors(stories_gguf_path: Path, stories_hf_dir: Path):
    gguf_ckpt, hf_ckpt = read_gguf(stories_gguf_path), read_hf_dir(stories_hf_dir)

    # The GGUF stores the (tied) classifier explicitly; everything else is the same set, bit for bit.
    assert set(gguf_ckpt.tensors) == set(hf_ckpt.tensors) | {"lm_head.weight"}
    for name, tensor in hf_ckpt.tensors.items():
        assert gguf_ckpt.tensors[name].dtype == torch.float32
        assert torch.equal(gguf_ckpt.tensors[name], tensor), name
    assert torch.equal(gguf_ckpt.tensors["lm_head.weight"], hf_ckpt.tensors["model.embed_tokens.weight"])


def test_stories_gguf_config_equals_hf_config(stories_gguf_path: Path, stories_hf_dir: Path):
    gguf_config, hf_config = read_gguf(stories_gguf_path).config, read_hf_dir(stories_hf_dir).config
    assert dataclasses.replace(gguf_config, tie_word_embeddings=True) == hf_config
    assert gguf_config.rms_norm_eps == 1e-5  # stored as float32 in the file, read back as the decimal it was


def test_stories_gguf_and_hf_give_the_same_logits(stories_gguf_path: Path, stories_hf_dir: Path):
    from_gguf, from_hf = load_model(stories_gguf_path), load_model(stories_hf_dir)
    ids = from_hf.tokenizer.encode("Once upon a time there was a little girl named Lily.")
    assert from_gguf.tokenizer.encode("Once upon a time there was a little girl named Lily.") == ids
    logits = []
    for loaded in (from_gguf, from_hf):
        slot = loaded.runner.allocate_slot()
        logits.append(loaded.runner.prefill(slot, ids, all_logits=True))
    assert (logits[0] - logits[1]).abs().max().item() <= 1e-5


# --- GGUFs written from transformers models ------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_from_transformers_model_loads_to_its_weights(tmp_path: Path, case: str):
    config, state = tiny_hf_model(case)
    path = write_gguf(tmp_path / f"{case}.gguf", config, gguf_tensors_from_hf(state, config))

    checkpoint = read_gguf(path)

    # The engine refuses a Hugging Face llama with attention_bias (it would also bias o_proj); a GGUF llama with only
    # q/k/v biases is fine, so compare configs as if the HF one asked for exactly those.
    expected = ModelConfig.from_hf_dict({**config, "attention_bias": False})
    expected.attention_bias = bool(config.get("attention_bias")) or expected.attention_bias
    assert checkpoint.config == expected
    assert set(checkpoint.tensors) == set(state)
    for name, tensor in state.items():
        assert torch.equal(checkpoint.tensors[name], tensor), name


def _llama3_rope_freqs(config: transformers.LlamaConfig) -> np.ndarray:
    """What llama.cpp stores as rope_freqs.weight: how much Llama-3 scaling divides each default frequency by."""
    dim = config.head_dim
    default = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    return (default / scaled.double()).float().numpy()


LLAMA3_CASES = {  # name: (config overrides, rope parameters, whether the GGUF records the original context)
    "tiny-recorded": ({"head_dim": 16}, (10000.0, 8.0, 1.0, 8.0, 1024), True),
    "tiny-unrecorded": ({"head_dim": 16}, (10000.0, 8.0, 1.0, 8.0, 1024), False),
    # Llama 3.1 8B's RoPE; llama.cpp's converter records only rope_freqs for it.
    "llama-3.1": (
        {"hidden_size": 128, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 128},
        (500000.0, 8.0, 1.0, 4.0, 8192),
        False,
    ),
}


@pytest.mark.parametrize("case", list(LLAMA3_CASES))
def test_llama3_rope_freqs_give_transformers_frequencies(tmp_path: Path, case: str):
    overrides, (theta, factor, low, high, original), record = LLAMA3_CASES[case]
    rope = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low}
    rope |= {"high_freq_factor": high, "original_max_position_embeddings": original}
    hf_config = transformers.LlamaConfig(**(TINY | overrides | {"max_position_embeddings": 2 * original}))
    hf_config.rope_parameters = rope
    config = {k: v for k, v in hf_config.to_dict().items() if v is not None}
    torch.manual_seed(0)
    tensors = gguf_tensors_from_hf(transformers.LlamaForCausalLM(hf_config).state_dict(), config)
    tensors["rope_freqs.weight"] = _llama3_rope_freqs(hf_config)

    def extra(writer: gguf.GGUFWriter) -> None:
        if record:
            writer.add_rope_scaling_orig_ctx_len(original)

    checkpoint = read_gguf(write_gguf(tmp_path / "llama3.gguf", config, tensors, extra=extra))

    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    torch.testing.assert_close(rope_inv_freq(checkpoint.config), want.float(), rtol=1e-5, atol=0)
    if record or original == 8192:  # otherwise other (equivalent) low/high factors describe the same frequencies
        assert checkpoint.config == ModelConfig.from_hf_dict(config)
    assert "rope_freqs.weight" not in checkpoint.tensors


# --- bad files ----------------------------------------------------------------------------------------------------


def _load_error(path: Path, match: str) -> LoadError:
    with pytest.raises(LoadError, match=match) as error:
        read_gguf(path)
    assert error.value.path == str(path)
    return error.value


@pytest.mark.parametrize("keep", [0.5, 0.01], ids=["in-tensor-data", "in-metadata"])
def test_truncated_gguf(tmp_path: Path, stories_gguf_path: Path, keep: float):
    data = stories_gguf_path.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    _load_error(path, "truncated or corrupt GGUF file")


def test_text_file_is_not_a_gguf(tmp_path: Path):
    path = tmp_path / "notes.gguf"
    path.write_text("Once upon a time there was a text file.\n")
    _load_error(path, "not a GGUF file")


def test_empty_file_is_not_a_gguf(tmp_path: Path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    _load_error(path, "not a GGUF file")


def test_missing_file(tmp_path: Path):
    _load_error(tmp_path / "nowhere.gguf", "cannot read the file")


def test_unknown_architecture(tmp_path: Path):
    _load_error(write_tiny_gguf(tmp_path, arch="gpt2"), "unsupported architecture 'gpt2'")


def test_missing_tensor(tmp_path: Path):
    path = write_tiny_gguf(tmp_path, edit=lambda t: t.pop("blk.1.ffn_up.weight"))
    _load_error(path, r"missing tensor blk\.1\.ffn_up\.weight")


def test_misshaped_tensor(tmp_path: Path):
    def shrink(tensors: dict[str, np.ndarray]) -> None:
        tensors["blk.0.attn_k.weight"] = tensors["blk.0.attn_k.weight"][:8].copy()

    path = write_tiny_gguf(tmp_path, edit=shrink)
    _load_error(path, r"tensor blk\.0\.attn_k\.weight has shape \[32, 8\], expected \[32, 16\]")


def test_unexpected_tensor(tmp_path: Path):
    def add_qk_norm(tensors: dict[str, np.ndarray]) -> None:
        tensors["blk.0.attn_q_norm.weight"] = np.ones(8, dtype=np.float32)

    _load_error(write_tiny_gguf(tmp_path, edit=add_qk_norm), r"unexpected tensor blk\.0\.attn_q_norm\.weight")


def test_missing_metadata_key(tmp_path: Path):
    def drop_block_count(writer: gguf.GGUFWriter) -> None:
        del writer.kv_data[0]["llama.block_count"]

    _load_error(write_tiny_gguf(tmp_path, extra=drop_block_count), r"metadata key llama\.block_count is missing")


def test_zero_head_count(tmp_path: Path):
    def zero_heads(writer: gguf.GGUFWriter) -> None:
        del writer.kv_data[0]["llama.attention.head_count"]
        writer.add_uint32("llama.attention.head_count", 0)

    _load_error(
        write_tiny_gguf(tmp_path, extra=zero_heads), r"metadata key llama\.attention\.head_count has a bad value"
    )


def test_unsupported_rope_scaling(tmp_path: Path):
    def yarn(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)

    _load_error(write_tiny_gguf(tmp_path, extra=yarn), "unsupported rope scaling 'yarn'")


def test_rope_freqs_that_are_not_llama3_scaling(tmp_path: Path):
    def odd_freqs(tensors: dict[str, np.ndarray]) -> None:
        tensors["rope_freqs.weight"] = np.array([1.0, 3.0, 2.0, 5.0], dtype=np.float32)

    _load_error(write_tiny_gguf(tmp_path, edit=odd_freqs), "does not describe Llama-3 rope scaling")
