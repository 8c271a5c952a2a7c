"""The decode plan (execution/decode_plan.py): decode steps through it give the model forward's logits bit for bit, on
stories260K (small transposed layers, grouped-query attention), and on a wider random llama with its layers in the
file's Q4_0 blocks, its Q4_K and Q6_K ones (some fused from both; the embedding too, as the file's rows), Q5_0 and
Q8_0 ones in padded rows, or in float32 on the C kernel; batches of rows of different lengths, one step after
another; and a model it cannot serve has no plan."""

from __future__ import annotations

from pathlib import Path

import torch
from gguf import GGMLQuantizationType as Q

from inference.engine.execution.decode_plan import DecodePlan
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.model.transformer import FloatLinear, Transformer
from inference.engine.quant.stored_embedding import StoredEmbedding
from tests.engine.kernel_marks import needs_every_kernel, needs_float_kernel
from tests.engine.test_quantized_weights import Q4_K_M, _keep, _model, write_narrow_rows_gguf, write_wide_gguf

pytestmark = needs_every_kernel

PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]


def decode_steps(model: Transformer, *, plan: bool) -> list[torch.Tensor]:
    """Logits of six decode steps of three rows holding 3, 13 and 20 tokens, through the plan or the forward."""
    runner = ModelRunner(model, max_concurrent=4, context_window=64)
    assert runner.plan is not None
    if not plan:
        runner.plan = None
    slots = []
    for length in (3, 13, 20):
        slots.append(runner.allocate_slot())
        runner.prefill(slots[-1], (PROMPT * 2)[:length])
    tokens, steps = [11, 12, 13], []
    for step in range(6):
        rows = slots[:1] if step % 2 == 0 else slots  # one row, then three (buffers grow), then one again (a view)
        logits = runner.decode(rows, tokens[: len(rows)])
        steps.append(logits)
        tokens = logits.argmax(-1).tolist() + tokens[len(rows) :]
    return steps


def assert_same_steps(model: Transformer) -> None:
    planned, forward = decode_steps(model, plan=True), decode_steps(model, plan=False)
    for step, (ours, reference) in enumerate(zip(planned, forward, strict=True)):
        assert torch.equal(ours, reference), f"step {step}"


def test_stories_decodes_the_forwards_logits(stories_hf_dir):
    checkpoint = read_hf_dir(stories_hf_dir)
    assert_same_steps(build_model(checkpoint.config, checkpoint.tensors, context_window=64))


def test_q4_0_blocks_decode_the_forwards_logits(tmp_path: Path):
    path = write_wide_gguf(tmp_path, Q.Q4_0)
    assert_same_steps(_model(path, _keep(path, "q4_0")))


def test_k_quant_blocks_and_parts_decode_the_forwards_logits(tmp_path: Path):
    """Q4_K and Q6_K layers, and q, k and v fused from both (a Q4_K_M file's mix)."""
    path = write_wide_gguf(tmp_path, Q.Q4_K, types=Q4_K_M)
    assert_same_steps(_model(path, _keep(path, "q4_k")))


def test_an_embedding_kept_as_the_files_rows_decodes_the_forwards_logits(tmp_path: Path):
    path = write_wide_gguf(tmp_path, Q.Q4_K, types=Q4_K_M)
    model = _model(path, _keep(path, "q4_k", min_embedding_elements=0))
    assert isinstance(model.embed, StoredEmbedding)
    assert_same_steps(model)


def test_blocks_in_padded_rows_decode_the_forwards_logits(tmp_path: Path):
    """Q5_0 and Q8_0 layers whose rows (640 values) the kernel pads to whole super-blocks, next to a Q4_K one."""
    path = write_narrow_rows_gguf(tmp_path)
    assert_same_steps(_model(path, _keep(path, "q5_0")))


@needs_float_kernel
def test_float32_on_the_kernel_decodes_the_forwards_logits(tmp_path: Path):
    model = _model(write_wide_gguf(tmp_path, Q.F32))
    assert isinstance(model.layers[0].feed_forward.w13, FloatLinear)
    assert_same_steps(model)


def test_a_model_the_plan_cannot_serve_has_none(stories_hf_dir):
    """Weights kept as nn.Linear (an attachable load, which a trainer writes) leave the forward to serve."""
    checkpoint = read_hf_dir(stories_hf_dir)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64, attachable=True)
    assert DecodePlan.build(model) is None
