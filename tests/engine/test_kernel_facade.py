"""The kernels' facade (inference/engine/kernels): a tensor of the wrong dtype, device, layout or shape is a Python
error before its address reaches C, so a slip ends one request, not the worker and every stream on it; and which
kernels run is one list, empty when they are off."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from inference.engine import kernels
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.model.transformer import FloatLinear
from inference.engine.quant import block_quant
from inference.engine.quant.block_quant import Q4_0Linear
from inference.engine.worker_process import log_start
from tests.engine.kernel_marks import (
    needs_block_kernel,
    needs_every_kernel,
    needs_float_kernel,
    needs_paged_kernel,
    needs_pointwise_kernel,
    needs_transposed_kernel,
)

BLOCK_LAYERS = [c for c in vars(block_quant).values() if isinstance(c, type) and issubclass(c, block_quant.BlockLinear)]
BLOCK_LAYERS.remove(block_quant.BlockLinear)


def floats(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


@needs_float_kernel
@pytest.mark.parametrize(
    ("x", "weight", "out", "error"),
    [
        (floats(64, 3).t(), floats(16, 64), floats(3, 16), ValueError),  # a transposed input: not contiguous
        (floats(3, 64).double(), floats(16, 64), floats(3, 16), TypeError),
        (floats(3, 64), floats(16, 64).half(), floats(3, 16), TypeError),
        (floats(3, 64), floats(16, 64), floats(3, 15), ValueError),  # out one column short
        (floats(3, 64), floats(16, 48), floats(3, 16), ValueError),  # the weight's rows are shorter than x's
        (floats(3, 64), floats(16, 64), floats(2, 16), ValueError),  # out one row short
        (floats(3, 64), floats(16, 64).to("meta"), floats(3, 16), ValueError),  # not CPU memory
        (floats(3, 1, 64), floats(16, 64), floats(3, 16), ValueError),  # 3 dimensions
    ],
    ids=["transposed", "float64", "float16-weight", "short-out", "short-weight", "few-rows", "meta", "3d"],
)
def test_a_float_product_of_tensors_that_do_not_fit_is_a_python_error(x, weight, out, error):
    before = out.clone()
    with pytest.raises(error):
        kernels.float_matmul(out, x, weight)
    assert torch.equal(out, before)  # nothing reached C


@needs_float_kernel
def test_a_float_layer_whose_weight_became_a_transposed_view_raises_instead_of_crashing():
    """The layer the worker runs most (FloatLinear, every float32 decode step): a weight swapped for a view with other
    strides (an in-place update gone wrong) is refused by the facade, and the layer works again once it is mended."""
    layer = FloatLinear(nn.Linear(256, 128, bias=False))
    x = torch.randn(2, 256)
    want = layer(x)
    weight = layer.weight.data
    layer.weight.data = weight.t().contiguous().t()  # the same values, column-major
    with pytest.raises(ValueError, match="not contiguous"):
        layer(x)
    layer.weight.data = weight
    assert torch.equal(layer(x), want)


@needs_transposed_kernel
def test_a_transposed_product_of_tensors_that_do_not_fit_is_a_python_error():
    x, weight_t = floats(2, 32), floats(32, 8)
    with pytest.raises(ValueError):
        kernels.transposed_matmul(floats(2, 8), x, weight_t.t().contiguous().t())
    with pytest.raises(ValueError):
        kernels.transposed_matmul(floats(2, 8), floats(2, 31), weight_t)
    with pytest.raises(TypeError):
        kernels.transposed_matmul(floats(2, 8).half(), x, weight_t)


@needs_block_kernel
def test_a_block_product_of_tensors_that_do_not_fit_is_a_python_error():
    layer = Q4_0Linear(nn.Linear(256, 8, bias=False))
    codes, scales, x, out = layer.codes, layer.scales, floats(2, 256), floats(2, 8)
    with pytest.raises(ValueError, match="do not hold"):  # a row of codes missing
        kernels.block_matmul(out, x, codes[:-1].contiguous(), scales, "q4_0", 256)
    with pytest.raises(ValueError, match="do not hold"):  # scales of a wider layer
        kernels.block_matmul(out, x, codes, torch.cat([scales, scales], 1), "q4_0", 256)
    with pytest.raises(ValueError, match="do not fit"):  # the columns past out's end
        kernels.block_matmul(out, x, codes, scales, "q4_0", 256, column=1)
    with pytest.raises(ValueError, match="do not fit"):  # x narrower than the layer
        kernels.block_matmul(out, floats(2, 224), codes, scales, "q4_0", 256)
    with pytest.raises(ValueError, match="no block format"):
        kernels.block_matmul(out, x, codes, scales, "q9_9", 256)
    with pytest.raises(ValueError, match="not contiguous"):
        kernels.block_matmul(out, floats(256, 2).t(), codes, scales, "q4_0", 256)
    with pytest.raises(ValueError, match="do not hold"):  # Q4_0's tensors read as Q4_K's
        kernels.block_matmul(out, x, codes, scales, "q4_k", 256)
    # the formats' codes come from C: every block layer's format is one the kernel knows by that name
    assert {layer.FORMAT for layer in BLOCK_LAYERS} <= set(kernels.FORMATS)


@needs_pointwise_kernel
def test_a_norm_or_swiglu_of_tensors_that_do_not_fit_is_a_python_error():
    x, weight = floats(3, 64), floats(64)
    with pytest.raises(ValueError):
        kernels.rms_norm_into(floats(3, 64), x, floats(32), 1e-5)
    with pytest.raises(ValueError):
        kernels.rms_norm_into(floats(2, 64), x, weight, 1e-5)
    with pytest.raises(ValueError):
        kernels.rms_norm_into(floats(3, 64), x, weight, 1e-5, residual=floats(64, 3).t())
    with pytest.raises(ValueError):
        kernels.swiglu_into(floats(3, 32), floats(3, 128))
    with pytest.raises(TypeError):
        kernels.swiglu_into(floats(3, 32), floats(3, 64).double())


@needs_paged_kernel
def test_attention_over_tensors_that_do_not_fit_is_a_python_error():
    rows, kv_heads, group, dim, blocks, block_size = 2, 2, 2, 8, 4, 4
    qkv = floats(rows, kv_heads * (group + 2), dim)
    cos, sin = floats(rows, dim), floats(rows, dim)
    keys, values = floats(kv_heads, blocks, block_size, dim), floats(kv_heads, blocks, block_size, dim)
    write_rows = torch.tensor([0, blocks * block_size, 1, 1 + blocks * block_size])
    table, lengths = torch.tensor([[0], [1]]), torch.tensor([1, 1])
    out = floats(rows, kv_heads * group * dim)
    good = dict(qkv=qkv, cos_=cos, sin_=sin, keys=keys, values=values, rows=write_rows, table=table, lengths=lengths)

    def attend(**changed):
        t = {**good, **changed}
        args = (t["qkv"], t["cos_"], t["sin_"], t["keys"], t["values"], t["rows"], t["table"], t["lengths"])
        kernels.attend_into(out, *args)

    attend()  # they fit: no error
    with pytest.raises(TypeError):
        attend(values=values.half())  # keys and values of two dtypes
    with pytest.raises(TypeError):
        attend(table=table.int())
    with pytest.raises(TypeError):
        attend(keys=keys.double(), values=values.double())
    with pytest.raises(ValueError):
        attend(keys=keys.transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError):
        attend(cos_=floats(rows, dim - 1))
    with pytest.raises(ValueError):
        attend(rows=write_rows[:3])
    with pytest.raises(ValueError):
        attend(table=table[:1])
    with pytest.raises(ValueError):
        attend(qkv=floats(rows, kv_heads * (group + 2) + 1, dim))


def _active_in_a_process(env: dict[str, str]) -> list[str]:
    code = "from inference.engine import kernels; print(','.join(kernels.active_kernels()))"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [name for name in done.stdout.strip().split(",") if name]


def test_kernels_off_leaves_none_active_and_a_typo_is_refused():
    assert _active_in_a_process({"PANTHEON_KERNELS": "off"}) == []
    done = subprocess.run(
        [sys.executable, "-c", "import inference.engine.kernels"],
        env={**os.environ, "PANTHEON_KERNELS": "of"},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "PANTHEON_KERNELS must be 'on' or 'off'" in done.stderr


@needs_block_kernel
def test_the_built_kernels_are_active_by_default():
    active = _active_in_a_process({"PANTHEON_KERNELS": "on"})
    assert {"block_matmul", "paged_attention", "pointwise"} <= set(active)
    assert active == kernels.active_kernels()


@needs_every_kernel
def test_a_decode_step_over_a_kv_pool_with_other_strides_raises_and_the_next_one_runs(stories_hf_dir):
    """Through the worker's decode path (the plan's kernel calls): a layer's KV pool swapped for a view with other
    strides is refused as a ValueError before the attention kernel reads it; with the pool restored, decoding goes
    on as before."""
    checkpoint = read_hf_dir(stories_hf_dir)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64)
    runner = ModelRunner(model, max_concurrent=1, context_window=64)
    assert runner.plan is not None
    slot = runner.allocate_slot()
    token = int(runner.prefill(slot, [1, 403, 407, 261]).argmax())
    keys = runner.cache.keys[1]
    runner.cache.keys[1] = keys.transpose(2, 3).contiguous().transpose(2, 3)  # the same values, another layout
    with pytest.raises(ValueError, match="not contiguous"):
        runner.decode([slot], [token])
    runner.cache.keys[1] = keys
    assert runner.decode([slot], [token]).shape == (1, checkpoint.config.vocab_size)


def test_the_workers_start_line_names_the_active_kernels(caplog):
    caplog.set_level(logging.INFO, logger="pantheon.worker")
    log_start("cpu")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "pantheon.worker"]
    active = kernels.active_kernels()
    assert line.startswith("worker cpu: ") and all(name in line for name in active)
    assert ("torch's ops everywhere" in line) == (not active)


@needs_every_kernel
def test_a_bound_call_is_checked_when_bound_and_then_runs_as_the_checked_one():
    """The decode plan binds its calls once (kernels.bind, BoundAttention): a tensor that does not fit is refused
    then, as a Python error, and the bound call computes what the checked call does."""
    x, weight = floats(3, 64), floats(64)
    with pytest.raises(ValueError):
        kernels.bind(kernels.rms_norm_call, floats(3, 48), x, weight, 1e-5)  # out narrower than x
    with pytest.raises(ValueError):
        kernels.bind(kernels.swiglu_call, floats(3, 64), floats(64, 3).t())  # a transposed gate/up
    with pytest.raises(ValueError):  # qkv one head short of 4 query heads over 2 KV heads of 16
        kernels.BoundAttention(floats(2, 32), floats(2, 112), floats(2, 16), floats(2, 16), kv_heads=2)
    bound_out, checked_out = torch.empty(3, 64), torch.empty(3, 64)
    kernels.bind(kernels.rms_norm_call, bound_out, x, weight, 1e-5)()
    kernels.rms_norm_into(checked_out, x, weight, 1e-5)
    assert torch.equal(bound_out, checked_out)
