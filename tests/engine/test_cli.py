"""The engine's command line, run as a user runs it: a subprocess with real model files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inference.engine", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_generate_json_matches_transformers_greedy(fmt, stories_hf_dir, stories_gguf_path):
    path = stories_hf_dir if fmt == "hf" else stories_gguf_path
    result = run_cli("generate", str(path), "--prompt", "Once upon a time", "--max-tokens", "24", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)

    tokenizer = AutoTokenizer.from_pretrained(stories_hf_dir)
    model = AutoModelForCausalLM.from_pretrained(stories_hf_dir)
    ids = tokenizer("Once upon a time", return_tensors="pt").input_ids
    reference = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()

    assert out["prompt_token_ids"] == ids[0].tolist()
    assert out["token_ids"] == reference
    assert out["text"] == tokenizer.decode(reference, skip_special_tokens=True)
    assert out["finish_reason"] == "length"
    assert out["decode_tokens_per_s"] > 0


def test_generate_streams_text_without_json(stories_hf_dir):
    result = run_cli("generate", str(stories_hf_dir), "--prompt", "Once upon a time", "--max-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(", there was")


def test_seeded_sampling_reproduces(stories_hf_dir):
    def sample(seed: str) -> list[int]:
        sampled = ("--temperature", "1.0", "--seed", seed, "--max-tokens", "32")
        result = run_cli("generate", str(stories_hf_dir), "--prompt", "Once", *sampled, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["token_ids"]

    first, second = sample("7"), sample("7")
    assert first == second
    assert sample("8") != first  # the seed decides the draw: an ignored seed or temperature would not show above


def test_demo_model_round_trip_with_chat(tmp_path):
    demo = tmp_path / "demo"
    made = run_cli("make-demo-model", str(demo))
    assert made.returncode == 0, made.stderr
    result = run_cli("generate", str(demo), "--chat", "--prompt", "hello", "--max-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    tokenizer = AutoTokenizer.from_pretrained(demo)
    expected_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    if not isinstance(expected_prompt, list):  # transformers 5 returns a BatchEncoding
        expected_prompt = expected_prompt["input_ids"]
    assert out["prompt_token_ids"] == expected_prompt
    assert len(out["token_ids"]) == 8 or out["finish_reason"] == "stop"


def test_missing_model_is_a_clear_error(tmp_path):
    result = run_cli("generate", str(tmp_path / "nope"), "--prompt", "x")
    assert result.returncode == 2
    assert "no such file or directory" in result.stderr
    assert str(tmp_path / "nope") in result.stderr
