"""The weights a trainer attaches to (inference/engine/weights): an attachable load serves what a normal one does from
a shared-memory file, every Hugging Face parameter is a view of what the engine computes with, another process can
rebuild and write them, and a saved checkpoint is whole, verifiable and loads like any other."""

from __future__ import annotations

import gc
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.engine.contract.checkpoint import CheckpointCorrupt
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.loading import load_model
from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import expected_hf_shapes
from inference.engine.model.transformer import Transformer
from inference.engine.weights.checkpoint_files import (
    CheckpointExists,
    read_weights,
    save_checkpoint,
    verify_checkpoint,
)
from inference.engine.weights.handles import export_handles, rebuild_parameters
from inference.engine.weights.parameter_views import ParameterMismatch, ParameterViews
from inference.engine.weights.served_weights import attach_refusal
from inference.engine.weights.shared_storage import SharedArena
from tests.greedy import greedy

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT = [1, 403, 407, 261, 378, 432, 383, 286]
K_PROJ = "model.layers.0.self_attn.k_proj.weight"
DOWN_PROJ = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture
def attached(stories_hf_dir):
    """A fresh attachable load of stories260K (tests write to its weights)."""
    return load_model(stories_hf_dir, max_concurrent=1, attachable=True)


def test_attachable_load_serves_the_same_output_from_a_file_that_leaves_with_it(stories_hf_dir):
    plain = load_model(stories_hf_dir, max_concurrent=1)
    attachable = load_model(stories_hf_dir, max_concurrent=1, attachable=True)
    reference = greedy(plain.runner, PROMPT, 24, all_logits=True)
    served = greedy(attachable.runner, PROMPT, 24, all_logits=True)
    assert served.tokens == reference.tokens
    assert torch.allclose(served.prompt_logits, reference.prompt_logits, atol=1e-4)

    arena = attachable.parameters.arena
    path = Path(arena.path)
    if Path("/dev/shm").is_dir():
        assert path.parent == Path("/dev/shm")
    assert path.name.startswith(f"pantheon-weights-{os.getpid()}-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    start = arena.tensor.data_ptr()
    for name, param in attachable.runner.model.named_parameters():
        assert start <= param.data_ptr() < start + arena.nbytes, f"{name} is not in the shared file"

    del attachable, arena, served
    gc.collect()
    assert not path.exists()


def test_closing_an_arena_removes_its_file_and_keeps_its_views():
    arena = SharedArena(4096)
    view = arena.carve(128, (4, 8), torch.float32).fill_(2.0)
    with pytest.raises(ValueError, match="aligned"):
        arena.carve(4, (1,), torch.float32)
    with pytest.raises(ValueError, match="outside"):
        arena.carve(4032, (32,), torch.float32)
    arena.close()
    assert not os.path.exists(arena.path)
    arena.close()
    assert torch.all(view == 2.0) and torch.all(arena.tensor[128:256].view(torch.float32) == 2.0)


def test_every_parameter_view_is_the_engines_own_memory(attached):
    views = attached.parameters.views
    config = attached.config
    assert attached.parameters.layout == "views" and attached.parameters.repacked == []
    assert list(views) == list(expected_hf_shapes(config))
    wqkv = attached.runner.model.layers[0].attention.wqkv.weight
    before = wqkv.detach().clone()
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim

    views[K_PROJ].zero_()

    assert torch.count_nonzero(wqkv[q : q + kv]) == 0
    assert torch.equal(wqkv[:q], before[:q]) and torch.equal(wqkv[q + kv :], before[q + kv :])
    assert not torch.equal(before[q : q + kv], wqkv[q : q + kv])


def test_a_write_through_the_views_changes_what_is_served(attached):
    before = greedy(attached.runner, PROMPT, 24).tokens
    attached.parameters.views[DOWN_PROJ].mul_(-3.0)
    after = greedy(attached.runner, PROMPT, 24).tokens
    assert after != before


CHILD = """
import json, sys, torch
from inference.engine.weights.handles import rebuild_parameters

opened = {}
from_file = torch.from_file
def counting(path, *args, **kwargs):
    opened[path] = opened.get(path, 0) + 1
    return from_file(path, *args, **kwargs)
torch.from_file = counting

request = json.loads(sys.stdin.read())
tensors = rebuild_parameters(request["body"])
sums = {name: t.double().sum().item() for name, t in tensors.items()}
with torch.no_grad():
    for name, value in request["writes"].items():
        tensors[name].fill_(value)
storages = {t.untyped_storage().data_ptr() for t in tensors.values()}
print(json.dumps({"opened": opened, "storages": len(storages), "sums": sums}))
"""


def test_another_process_rebuilds_the_weights_once_and_writes_them_in_place(attached):
    views = attached.parameters.views
    body = export_handles(attached.parameters)
    assert attached.config.tie_word_embeddings  # stories260K: embed and lm_head are one tensor, one name
    assert len(body["storages"]) == 1 and body["storages"][0]["path"] == attached.parameters.arena.path
    assert [p["name"] for p in body["parameters"]] == list(views) and "lm_head.weight" not in views
    assert body["pinned_bytes"] == attached.parameters.arena.nbytes

    sums = {name: view.double().sum().item() for name, view in views.items()}
    v_proj = "model.layers.2.self_attn.v_proj.weight"  # rows in the middle of the arena and of wqkv
    wqkv = attached.runner.model.layers[2].attention.wqkv.weight
    qk_rows = wqkv[: -views[v_proj].shape[0]].clone()
    request = {"body": body, "writes": {"model.embed_tokens.weight": 0.25, v_proj: 0.5}}
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=True,
    )
    report = json.loads(child.stdout)

    assert report["opened"] == {attached.parameters.arena.path: 1}
    assert report["storages"] == 1 and report["sums"] == sums  # every name rebuilt onto the same bytes
    assert torch.all(views["model.embed_tokens.weight"] == 0.25)
    assert torch.all(attached.runner.model.lm_head.weight == 0.25)  # the tied head is the same memory
    assert torch.all(wqkv[-views[v_proj].shape[0] :] == 0.5) and torch.equal(wqkv[: qk_rows.shape[0]], qk_rows)
    assert views[DOWN_PROJ].double().sum().item() == sums[DOWN_PROJ]


def test_rebuild_refuses_another_torch_and_an_unloaded_model(stories_hf_dir):
    model = load_model(stories_hf_dir, max_concurrent=1, attachable=True)
    body = export_handles(model.parameters)
    other = {**body, "producer": {**body["producer"], "torch": "0.0.1"}}
    with pytest.raises(ValueError, match="torch 0.0.1"):
        rebuild_parameters(other)
    path = body["storages"][0]["path"]
    del model
    gc.collect()
    with pytest.raises(ValueError, match="unloaded"):
        rebuild_parameters(body)
    assert not os.path.exists(path)  # refused before torch.from_file could create an empty file


def test_copy_in_checks_every_tensor_before_writing_any(attached, stories_hf_dir):
    parameters = attached.parameters
    down = parameters.views[DOWN_PROJ].clone()
    with pytest.raises(ParameterMismatch, match=K_PROJ):
        parameters.copy_in({DOWN_PROJ: torch.zeros_like(down), K_PROJ: torch.zeros(3, 64)})
    with pytest.raises(ParameterMismatch, match="model.layers.9.mlp.up_proj.weight"):
        parameters.copy_in({DOWN_PROJ: torch.zeros_like(down), "model.layers.9.mlp.up_proj.weight": down})
    embed = parameters.views["model.embed_tokens.weight"]
    with pytest.raises(ParameterMismatch, match="lm_head.weight"):
        parameters.copy_in({DOWN_PROJ: torch.zeros_like(down), "lm_head.weight": embed + 1})
    assert torch.equal(parameters.views[DOWN_PROJ], down)

    state = read_weights(stories_hf_dir)
    state = {name: tensor.to(torch.float64) for name, tensor in state.items()}  # converted on the way in
    parameters.views[DOWN_PROJ].zero_()
    parameters.copy_in({**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    assert torch.equal(parameters.views[DOWN_PROJ], state[DOWN_PROJ].float())


def tiny_qwen3() -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A random qwen3-style model with q/k/v bias too, so every kind of view is there."""
    config = ModelConfig(
        architecture="qwen3",
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        attention_bias=True,
        qk_norm=True,
    )
    generator = torch.Generator().manual_seed(0)
    tensors = {
        name: torch.randn(shape, generator=generator) * (1.0 if "norm" in name else 0.1)
        for name, shape in expected_hf_shapes(config).items()
    }
    return config, tensors


def prompt_logits(model: Transformer) -> torch.Tensor:
    """The logits [S, V] of a short prompt on `model`."""
    return greedy(ModelRunner(model, max_concurrent=1, context_window=64), [5, 6, 7], 1, all_logits=True).prompt_logits


def test_per_head_norms_are_repacked_after_a_write():
    config, tensors = tiny_qwen3()
    model = build_model(config, tensors, context_window=64, attachable=True)
    parameters = ParameterViews(model, config)
    assert parameters.layout == "views+repack"
    assert parameters.repacked == [f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(2) for n in "qk"]
    plain = build_model(config, tensors, context_window=64)
    assert torch.allclose(prompt_logits(model), prompt_logits(plain), atol=1e-4)

    written = {
        "model.layers.1.self_attn.q_norm.weight": torch.linspace(0.5, 1.5, 16),
        "model.layers.1.self_attn.k_norm.weight": torch.linspace(2.0, 1.0, 16),
        "model.layers.1.self_attn.k_proj.bias": torch.full((32,), 0.3),
    }
    parameters.copy_in(written)

    norm = model.layers[1].attention.qk_norm.weight  # [H + Hkv, hd]
    assert torch.equal(norm[:4], written["model.layers.1.self_attn.q_norm.weight"].expand(4, -1))
    assert torch.equal(norm[4:], written["model.layers.1.self_attn.k_norm.weight"].expand(2, -1))
    saved = parameters.state_dict()
    assert all(torch.equal(saved[name], tensor) for name, tensor in written.items())
    rebuilt = build_model(config, {**tensors, **written}, context_window=64)
    assert torch.allclose(prompt_logits(model), prompt_logits(rebuilt), atol=1e-4)


def test_a_saved_checkpoint_is_whole_verifiable_and_serves_the_written_weights(attached, stories_hf_dir, tmp_path):
    attached.parameters.views[DOWN_PROJ].mul_(-3.0)
    served = greedy(attached.runner, PROMPT, 24).tokens
    save = dict(source_dir=stories_hf_dir, root=tmp_path, run_id="run-1", base_model="stories260K", parent=None)

    manifest = save_checkpoint(attached.parameters, step=3, **save)

    step = tmp_path / "run-1" / "step-3"
    assert manifest["path"] == str(step.resolve())
    assert manifest["name"] == "stories260K:run-1:step-3" and (manifest["run_id"], manifest["step"]) == ("run-1", 3)
    assert verify_checkpoint(step) == {k: v for k, v in manifest.items() if k != "path"}
    assert (tmp_path / "run-1" / "latest").resolve() == step.resolve()
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= {
        f.name for f in step.iterdir()
    }
    assert sorted(f.name for f in (tmp_path / "run-1").iterdir()) == ["latest", "step-3"]  # no temporary left
    assert greedy(load_model(step, max_concurrent=1).runner, PROMPT, 24).tokens == served

    attached.parameters.views[DOWN_PROJ].zero_()
    with pytest.raises(CheckpointExists):
        save_checkpoint(attached.parameters, step=3, **save)
    assert verify_checkpoint(step)["created_at"] == manifest["created_at"]
    assert sorted(f.name for f in (tmp_path / "run-1").iterdir()) == ["latest", "step-3"]

    second = save_checkpoint(attached.parameters, step=4, **{**save, "parent": manifest["name"]})
    assert second["parent"] == manifest["name"] and second["weights_sha256"] != manifest["weights_sha256"]
    assert (tmp_path / "run-1" / "latest").resolve() == Path(second["path"])


def test_a_changed_byte_or_a_missing_manifest_is_corrupt(attached, stories_hf_dir, tmp_path):
    manifest = save_checkpoint(
        attached.parameters, source_dir=stories_hf_dir, root=tmp_path, run_id="r", step=0, parent=None, base_model="m"
    )
    step = Path(manifest["path"])
    weights = step / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="sha256"):
        verify_checkpoint(step)
    (step / "manifest.json").unlink()
    with pytest.raises(CheckpointCorrupt, match="no manifest"):
        verify_checkpoint(step)


def test_which_loads_a_trainer_may_attach_to(stories_hf_dir, stories_gguf_path):
    assert attach_refusal(load_model(stories_gguf_path, max_concurrent=1), attachable_load=False) == "gguf"
    assert attach_refusal(load_model(stories_hf_dir, max_concurrent=1, quantize=True), attachable_load=False) == (
        "quantized"
    )
    plain = load_model(stories_hf_dir, max_concurrent=1)
    assert plain.parameters is None
    assert attach_refusal(plain, attachable_load=False) == "allocator"
    attachable = load_model(stories_hf_dir, max_concurrent=1, attachable=True)
    assert attach_refusal(attachable, attachable_load=True) is None
    bf16 = load_model(stories_hf_dir, max_concurrent=1, dtype="bfloat16", attachable=True)
    assert attach_refusal(bf16, attachable_load=True) == "dtype"
    with pytest.raises(ValueError, match="quantized"):
        load_model(stories_hf_dir, max_concurrent=1, quantize=True, attachable=True)
    with pytest.raises(ValueError, match="attachable load"):
        ParameterViews(plain.runner.model, plain.config)  # repacked linear weights have no [out, in] rows
