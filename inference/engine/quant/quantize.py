"""8-bit linear weights (`quantize=True` at load): a quarter of float32's weight bytes per decoded token.

On a CPU where the block kernel is built, a layer whose rows it takes (`block_codecs.fits_blocks`: whole blocks of 32
values, padded to super-blocks of 256 where that adds at most a third) becomes Q8_0 blocks, as a GGUF Q8_0 file holds
them (quant/block_quant.py: 8-bit codes and a float16 scale per 32 input values): scaled
per 32 values rather than per output row, it is closer to the float weights than int8 per channel, and it decodes
on the block kernel and through the decode plan (docs/quantized-weights.md). The rest is int8 as below.

On CPU this is dynamic quantization: weights int8 per output channel, prepacked for fbgemm, and each call quantizes
its activations to uint8 on the fly (`quantized::linear_dynamic`). It beats float32 at decode sizes, while a
weight-only int8 matmul (`torch._weight_int8pack_mm`, float activations) is slower than float32: it is not vectorized
for float32 on CPU (docs/performance-log.md). The price is accuracy: the activations are quantized per tensor, so
logits move about twice as much as with weight-only int8 (docs/quantized-weights.md). Activations use the full
8 bits where the CPU has VNNI (int32 accumulation); elsewhere 7 bits (`reduce_range`, torch's own default), so
fbgemm's int16 pair sums cannot saturate.

Elsewhere (CUDA) the weights stay int8 in memory and are widened to the activation dtype inside the call.

Embeddings and norms stay in the model's dtype; the output head is quantized like any other linear layer (with tied
embeddings it gets its own int8 copy and the embedding table stays as it was).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from inference.engine import kernels
from inference.engine.quant.block_codecs import fits_blocks
from inference.engine.quant.block_quant import Q8_0Linear

# Without VNNI, fbgemm multiplies u8 x s8 pairs into saturating int16: full-range activations could overflow.
REDUCE_RANGE = not getattr(torch.cpu, "_is_vnni_supported", lambda: False)()


def _per_channel_scale(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric per-output-channel int8 scale: weight ~= round(weight / scale[:, None]) * scale[:, None]."""
    # weight: [out, in] float32 -> [out]
    return weight.abs().amax(dim=1).clamp(min=1e-12) / 127


class DynamicInt8Linear(nn.Module):
    """CPU: fbgemm int8 weights, activations quantized per call."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.float()
        scale = _per_channel_scale(weight)
        bias = None if linear.bias is None else linear.bias.float()
        with warnings.catch_warnings():  # quantized tensor creation is deprecated in favour of torchao; fbgemm stays
            warnings.simplefilter("ignore")
            zero = torch.zeros(weight.shape[0], dtype=torch.long)
            qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.weight_nbytes = weight.numel() + scale.numel() * 4 + (0 if bias is None else bias.numel() * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return torch.ops.quantized.linear_dynamic(x.float(), self.packed, REDUCE_RANGE).to(x.dtype)


class WeightOnlyInt8Linear(nn.Module):
    """Other devices: int8 weights in memory, widened to the activation dtype inside each call."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.float()
        scale = _per_channel_scale(weight)
        q = torch.round(weight / scale[:, None]).to(torch.int8)
        dtype = linear.weight.dtype
        self.register_buffer("weight", q)
        self.register_buffer("scale", scale.to(dtype))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        self.weight_nbytes = sum(t.numel() * t.element_size() for t in (q, self.scale, self.bias) if t is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        out = F.linear(x, self.weight.to(x.dtype)) * self.scale
        return out if self.bias is None else out + self.bias


def quantize_linears(model: nn.Module) -> nn.Module:
    """Replaces every nn.Linear of the model in place with its 8-bit counterpart for the model's device: Q8_0 blocks
    where the block kernel takes the layer, else int8."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                on_cpu = child.weight.device.type == "cpu"
                if on_cpu and kernels.block_kernel_runs() and fits_blocks(child):
                    setattr(parent, name, Q8_0Linear(child))
                else:
                    setattr(parent, name, (DynamicInt8Linear if on_cpu else WeightOnlyInt8Linear)(child))
    return model
