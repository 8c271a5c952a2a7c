"""The demo model: deterministic files that transformers loads as a working Llama with a chat tokenizer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.engine.demo_model import write_demo_model
from inference.engine.text.tokenizer import Tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return write_demo_model(tmp_path_factory.mktemp("demo"))


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in FILES}


def test_same_seed_gives_identical_files_even_in_a_fresh_process(demo_dir, tmp_path):
    script = f"from inference.engine.demo_model import write_demo_model; write_demo_model({str(tmp_path)!r}, seed=0)"
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True, timeout=120)
    assert sorted(p.name for p in demo_dir.iterdir()) == FILES
    assert file_bytes(tmp_path) == file_bytes(demo_dir)


def test_other_seed_changes_weights_only(demo_dir, tmp_path):
    other = file_bytes(write_demo_model(tmp_path, seed=1))
    same = file_bytes(demo_dir)
    assert other["model.safetensors"] != same["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in same.items() if k != "model.safetensors"
    }


def test_loads_in_transformers(demo_dir):
    model = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32)
    reference = AutoTokenizer.from_pretrained(demo_dir)
    config = model.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 128, 4)
    assert (config.num_attention_heads, config.num_key_value_heads, config.max_position_embeddings) == (4, 2, 2048)
    assert 1000 <= config.vocab_size <= 2048 and config.vocab_size == len(reference)
    assert model.num_parameters() < 2_000_000

    ids = reference.apply_chat_template(
        [{"role": "user", "content": "Hello!"}], add_generation_prompt=True, return_dict=False
    )
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), config.vocab_size) and torch.isfinite(logits).all()


def test_tokenizer_and_eos(demo_dir):
    tokenizer = Tokenizer.from_hf_dir(demo_dir)
    reference = AutoTokenizer.from_pretrained(demo_dir)
    for text in ["Hello, world!", "A story about 42 boats 😀\n\n日本", "<|im_start|>user\nhi<|im_end|>"]:
        ids = tokenizer.encode(text)
        assert ids == reference(text).input_ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    im_end, endoftext = tokenizer.backend.token_to_id("<|im_end|>"), tokenizer.backend.token_to_id("<|endoftext|>")
    generation = json.loads((demo_dir / "generation_config.json").read_text())
    assert set(generation["eos_token_id"]) == {im_end, endoftext}
    assert set(json.loads((demo_dir / "config.json").read_text())["eos_token_id"]) == {im_end, endoftext}
    assert tokenizer.eos_token_id == im_end
    for markup in ["<think>", "</think>", "<tool_call>", "</tool_call>"]:
        assert len(tokenizer.encode(markup)) == 1
