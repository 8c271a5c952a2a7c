"""GGUF tensors stored 4-bit (Q4_0, Q4_K) stay 4-bit in memory on CPU: logits within a stated tolerance of the
same file expanded to float32, a fraction of the weight bytes, and every other type computed as before."""

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from inference.engine.loaders.gguf import read_gguf
from inference.engine.loaders.loading import FOUR_BIT_TYPES, linear_formats, weight_bytes
from inference.engine.model.int4 import GROUP_SIZE, Int4Linear, group_quantize
from inference.engine.model.runner import ModelRunner
from inference.engine.model.transformer import Transformer
from tests.engine.gguf_builders import write_gguf
from tests.engine.test_gguf_quant import CONFIG, MATRICES, NORMS, encode

PROMPTS = [[1, 5, 9, 3, 7, 2, 11, 4], [1, 15, 14, 13, 12, 6, 8, 10, 0, 3]]
# max |logit difference| / max |reference logit|: the bfloat16 rounding of activations, scales and zeros, and the
# refit of groups that are no 4-bit grid (model/int4.py); measured 0.7% (Q4_0) and 0.2% (Q4_K) on these models.
TOLERANCE = 0.02


def _model(path: Path, four_bit: bool) -> Transformer:
    checkpoint = read_gguf(path)
    names = {n for n, t in checkpoint.tensor_types.items() if t in FOUR_BIT_TYPES} if four_bit else set()
    return Transformer.from_hf_weights(
        checkpoint.config, checkpoint.tensors, context_window=64, four_bit=frozenset(names)
    )


def _logits(model: Transformer) -> list[torch.Tensor]:
    runner = ModelRunner(model, max_concurrent=1, context_window=64)
    out = []
    for ids in PROMPTS:
        slot = runner.allocate_slot()
        out.append(runner.prefill(slot, ids, all_logits=True))
        runner.free_slot(slot)
    return out


def _write(tmp_path: Path, qtype: Q) -> Path:
    rng = np.random.default_rng(7 + int(qtype))
    tensors = {name: encode(rng, qtype, shape) for name, shape in MATRICES.items()}
    tensors |= {name: (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32) for name, shape in NORMS.items()}
    return write_gguf(tmp_path / f"model-{qtype.name}.gguf", CONFIG, tensors)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_K], ids=lambda t: t.name)
def test_four_bit_tensors_stay_four_bit_within_tolerance(tmp_path: Path, qtype: Q):
    path = _write(tmp_path, qtype)
    reference, four_bit = _model(path, four_bit=False), _model(path, four_bit=True)
    int4 = [m for m in four_bit.modules() if isinstance(m, Int4Linear)]
    assert len(int4) == 5  # wqkv, wo, w13, w2 and the output head
    assert weight_bytes(four_bit) < 0.5 * weight_bytes(reference)
    for got, want in zip(_logits(four_bit), _logits(reference), strict=True):
        assert (got - want).abs().max().item() <= TOLERANCE * want.abs().max().item()


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q5_K, Q.Q6_K], ids=lambda t: t.name)
def test_other_types_compute_as_before(tmp_path: Path, qtype: Q):
    path = _write(tmp_path, qtype)
    model = _model(path, four_bit=True)
    assert not any(isinstance(m, Int4Linear) for m in model.modules())
    for got, want in zip(_logits(model), _logits(_model(path, four_bit=False)), strict=True):
        assert torch.equal(got, want)


def test_a_group_of_sixteen_even_levels_is_kept_exactly():
    levels = torch.arange(16, dtype=torch.float32) * 0.25 - 2.0  # 16 evenly spaced values, bfloat16-exact
    weight = levels.repeat(16, 2 * GROUP_SIZE // 16)[:, torch.randperm(2 * GROUP_SIZE)]
    codes, scales_zeros = group_quantize(weight)
    groups = codes.reshape(16, 2, GROUP_SIZE).float() - 8
    scale, zero = scales_zeros.float().transpose(0, 1)[..., :1], scales_zeros.float().transpose(0, 1)[..., 1:]
    assert torch.equal((groups * scale + zero).reshape(16, -1), weight)


def test_a_load_reports_its_linear_layers_formats(tmp_path: Path):
    path = _write(tmp_path, Q.Q4_0)
    assert linear_formats(_model(path, four_bit=True)) == {"int4": 5}
    assert linear_formats(_model(path, four_bit=False)) == {"float32": 5}
