"""4-bit linear weights on CPU, for GGUF tensors stored 4-bit (Q4_0, Q4_K) where quant/stored_quant.py picks this
form: torch's weight-only int4 kernels (`_convert_weight_to_int4pack_for_cpu`, `_weight_int4pack_mm_for_cpu`, as
gpt-fast and torchao use them).

Each group of 32 input values of an output row keeps 16 levels, `w = (q - 8) * scale + zero`, with `scale` and
`zero` in bfloat16. A Q4_0 block, and a Q4_K sub-block, are already at most 16 evenly spaced levels: the group's own
step and minimum are kept, so the levels are the file's up to the bfloat16 rounding of scale and zero. Any other
group (a float weight) gets 16 levels spread over its range. The kernel is fast
with bfloat16 activations only (float32 ones are not vectorized), so a call rounds its input to bfloat16 and its
output back: logits move by that rounding plus the refit (docs/quantized-weights.md has the measured tolerance).

The kernel needs the output features to be a multiple of 16 and the input features of the group size; a linear
layer that is not stays as it was.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP_SIZE = 32
INNER_K_TILES = 2  # the packing's tiling along the input features (what gpt-fast uses on CPU)


def fits_int4(linear: nn.Linear) -> bool:
    out_features, in_features = linear.weight.shape
    return out_features % 16 == 0 and in_features % GROUP_SIZE == 0


def group_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [out, in] int32 in 0..15, and scales and zeros [in / GROUP_SIZE, out, 2] bfloat16, of a float weight."""
    # weight: [out, in] -> groups: [out, in / G, G]
    out_features, in_features = weight.shape
    groups = weight.float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scale = torch.where(_on_a_grid(groups, low, high), _grid_step(groups), (high - low) / 15)
    scale = scale.clamp(min=torch.finfo(torch.float32).tiny)
    codes = torch.clamp(torch.round((groups - low) / scale), 0, 15).to(torch.int32).reshape(out_features, in_features)
    zero = low + 8 * scale
    scales_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return codes, scales_zeros


def _grid_step(groups: torch.Tensor) -> torch.Tensor:
    """Each group's smallest gap between two of its distinct values: the step of the grid its values lie on, when
    they come from a 4-bit file. [out, groups, G] -> [out, groups, 1]"""
    ordered = groups.sort(dim=-1).values
    gaps = ordered[..., 1:] - ordered[..., :-1]
    return torch.where(gaps > 0, gaps, torch.inf).amin(dim=-1, keepdim=True)


def _on_a_grid(groups: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Whether each group's values are 16 or fewer evenly spaced levels starting at its minimum (a Q4_0 block, a
    Q4_K sub-block): then the file's own step is kept, not refitted to the group's range. -> [out, groups, 1]"""
    step = _grid_step(groups)
    position = (groups - low) / step
    exact = (position - position.round()).abs().amax(dim=-1, keepdim=True) <= 1e-3
    return torch.isfinite(step) & exact & ((high - low) / step <= 15 + 1e-3)


class Int4Linear(nn.Module):
    """A linear layer whose weight is packed 4-bit codes with a bfloat16 scale and zero per group of 32."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        codes, scales_zeros = group_quantize(linear.weight.detach())
        self.out_features = linear.weight.shape[0]
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES))
        self.register_buffer("scales_zeros", scales_zeros)
        self.bias = linear.bias
        self.weight_nbytes = self.packed.numel() * self.packed.element_size() + scales_zeros.numel() * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP_SIZE, self.scales_zeros)
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias
