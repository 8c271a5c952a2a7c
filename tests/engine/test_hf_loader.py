"""Reading Hugging Face checkpoint directories, and every way a bad one is refused with a LoadError."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoModelForCausalLM, LlamaConfig

from inference.engine.errors import LoadError
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.loaders.loading import load_model
from inference.engine.model.layout import expected_hf_shapes


@pytest.fixture
def stories_copy(stories_hf_dir, tmp_path):
    """A writable copy of stories260K-hf to break."""
    return shutil.copytree(stories_hf_dir, tmp_path / "model")


def save_tiny_llama(path, **save_kwargs):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=[2, 7],
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(path, **save_kwargs)


def test_reads_stories260k(stories_hf_dir):
    checkpoint = read_hf_dir(stories_hf_dir)
    config = checkpoint.config
    assert (config.architecture, config.num_layers, config.hidden_size, config.vocab_size) == ("llama", 5, 64, 512)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size) == (8, 4, 8, 172)
    assert config.tie_word_embeddings and "lm_head.weight" not in checkpoint.tensors
    assert checkpoint.generation_eos_ids == [2]
    on_disk = load_file(stories_hf_dir / "model.safetensors")
    assert checkpoint.tensors.keys() == on_disk.keys()
    assert all(torch.equal(checkpoint.tensors[name], on_disk[name]) for name in on_disk)


def test_sharded_checkpoint_reads_like_a_single_file(tmp_path):
    save_tiny_llama(tmp_path / "single")
    save_tiny_llama(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    single, sharded = read_hf_dir(tmp_path / "single"), read_hf_dir(tmp_path / "sharded")
    assert single.tensors.keys() == sharded.tensors.keys()
    assert all(torch.equal(single.tensors[name], sharded.tensors[name]) for name in single.tensors)
    assert sharded.config.eos_token_ids == [2, 7]


def test_half_precision_files_are_read_as_float32(tmp_path, stories_hf_dir):
    shutil.copy(stories_hf_dir / "config.json", tmp_path)
    tensors = load_file(stories_hf_dir / "model.safetensors")
    save_file({name: t.to(torch.bfloat16) for name, t in tensors.items()}, tmp_path / "model.safetensors")
    checkpoint = read_hf_dir(tmp_path)
    assert all(t.dtype == torch.float32 for t in checkpoint.tensors.values())
    assert checkpoint.generation_eos_ids == []


class MadeTensors(TorchDispatchMode):
    """Records the dtype and shape of every tensor an op makes off the meta device (the model is built on it)."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                self.made.append((tensor.dtype, tuple(tensor.shape)))
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoint_loads_in_its_dtype_without_a_float32_copy(tmp_path, stories_hf_dir, dtype):
    shutil.copytree(stories_hf_dir, tmp_path, dirs_exist_ok=True)
    on_disk = {name: t.to(dtype) for name, t in load_file(stories_hf_dir / "model.safetensors").items()}
    save_file(on_disk, tmp_path / "model.safetensors")
    checkpoint = read_hf_dir(tmp_path, dtype=dtype)
    assert all(t.dtype == dtype and torch.equal(t, on_disk[name]) for name, t in checkpoint.tensors.items())
    with MadeTensors() as recorder:
        loaded = load_model(tmp_path, dtype=dtype, max_concurrent=1, context_window=48)
    weight_shapes = set(expected_hf_shapes(loaded.config).values())
    assert [shape for made, shape in recorder.made if made == torch.float32 and shape in weight_shapes] == []
    assert torch.equal(loaded.runner.model.embed.weight, on_disk["model.embed_tokens.weight"])
    prompt = loaded.tokenizer.encode("Once upon a time")
    assert loaded.runner.prefill(loaded.runner.allocate_slot(), prompt).shape[-1] == loaded.config.vocab_size


def rewrite_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def assert_load_error(path, names, *words):
    with pytest.raises(LoadError) as caught:
        read_hf_dir(path)
    assert caught.value.path == str(names)
    for word in words:
        assert word in caught.value.problem
    return caught.value


def test_missing_config(stories_copy):
    (stories_copy / "config.json").unlink()
    assert_load_error(stories_copy, stories_copy / "config.json", "not found")


def test_config_that_is_not_json(stories_copy):
    (stories_copy / "config.json").write_text("{ this is not json")
    assert_load_error(stories_copy, stories_copy / "config.json", "JSON")


def test_unsupported_model_type(stories_copy):
    rewrite_config(stories_copy, model_type="gpt2")
    assert_load_error(stories_copy, stories_copy / "config.json", "model_type", "gpt2")


def test_unsupported_rope_type(stories_copy):
    rewrite_config(stories_copy, rope_scaling={"rope_type": "yarn", "factor": 4.0}, rope_parameters=None)
    assert_load_error(stories_copy, stories_copy / "config.json", "rope", "yarn")


def test_missing_safetensors(stories_copy):
    (stories_copy / "model.safetensors").unlink()
    assert_load_error(stories_copy, stories_copy, "safetensors")


def test_missing_tensor(stories_copy):
    tensors = load_file(stories_copy / "model.safetensors")
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, stories_copy / "model.safetensors")
    assert_load_error(stories_copy, stories_copy / "model.safetensors", "model.layers.3.mlp.up_proj.weight")


def test_untied_model_without_lm_head(stories_copy):
    rewrite_config(stories_copy, tie_word_embeddings=False)
    assert_load_error(stories_copy, stories_copy / "model.safetensors", "missing tensor lm_head.weight")


def test_misshaped_tensor(stories_copy):
    tensors = load_file(stories_copy / "model.safetensors")
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(64, 64)  # 4 KV heads of 8: should be [32, 64]
    save_file(tensors, stories_copy / "model.safetensors")
    error = assert_load_error(stories_copy, stories_copy / "model.safetensors", "k_proj", "[64, 64]", "[32, 64]")
    assert "model.layers.1" in error.problem


def test_config_disagreeing_with_the_weights(stories_copy):
    rewrite_config(stories_copy, intermediate_size=256)
    assert_load_error(stories_copy, stories_copy / "model.safetensors", "shape", "256")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(stories_copy, damage):
    file = stories_copy / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(b"\x13\x37 not a safetensors file" * 40 if damage == "garbage" else data[: len(data) // 2])
    assert_load_error(stories_copy, file, "safetensors")


def test_index_naming_a_missing_shard(tmp_path):
    save_tiny_llama(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    assert_load_error(tmp_path, shard, "not found")


def test_index_without_a_tensor(tmp_path):
    save_tiny_llama(tmp_path, max_shard_size="20KB")
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    del index["weight_map"]["model.norm.weight"]
    index_file.write_text(json.dumps(index))
    assert_load_error(tmp_path, index_file, "model.norm.weight")


def test_load_model_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(LoadError) as caught:
        load_model(tmp_path / "nothing-here")
    assert caught.value.path == str(tmp_path / "nothing-here")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(LoadError, match="not a Hugging Face checkpoint directory or a .gguf file"):
        load_model(tmp_path / "weights.bin")


def test_load_model_hf_directory(stories_hf_dir):
    loaded = load_model(stories_hf_dir, max_concurrent=2)
    assert loaded.format == "hf" and loaded.dtype == torch.float32 and loaded.device == torch.device("cpu")
    assert loaded.eos_token_ids == [2]
    assert loaded.runner.context_window == 512 and loaded.runner.max_concurrent == 2
    # every parameter once, plus the tied head's transposed copy (CPU linear layers keep [in, out] weights)
    assert loaded.weight_bytes == (260_032 + 512 * 64) * 4
    prompt = loaded.tokenizer.encode("Once upon a time")
    assert prompt == [1, 403, 407, 261, 378]
    slot = loaded.runner.allocate_slot()
    assert loaded.tokenizer.decode([int(loaded.runner.prefill(slot, prompt).argmax())]) == ","  # "Once upon a time,"
    with pytest.raises(LoadError, match="context_window"):
        load_model(stories_hf_dir, context_window=513)
