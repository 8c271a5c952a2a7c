"""Which in-memory form a linear layer takes when its checkpoint stores it quantized (GGUF Q4_0, Q4_K, Q5_K, Q6_K,
Q8_0), on CPU with dtype left automatic: the file's own Q4_0, Q8_0 or Q4_K blocks (model/block_quant.py), Q8_0
blocks re-encoded from the float expansion, 4-bit codes for torch's int4 kernel (model/int4.py), int8 per output
channel (model/quantize.py's fbgemm layer), or float32 as the file expands to.

The choice (docs/quantized-weights.md has the figures):
- A layer small enough to sit in cache stays float32: it costs no memory bandwidth worth saving, and the fixed cost
  of a quantized call (quantizing its activations) is several times a small float GEMM's.
- Where the block kernel is built, a layer made only of Q4_0, only of Q8_0, only of Q4_K or only of Q6_K tensors
  keeps the file's blocks: the file's exact weights (for the 4-bit types in fewer bytes than int8), faster than int8
  for one to eight rows on AVX-512 VNNI (slower for a few dozen rows and for prompt chunks;
  docs/quantized-weights.md). Any other quantized layer (Q5_K, or a fusion of types, as Q4_K_M files mix Q4_K and
  Q6_K in a layer's q, k and v) becomes Q8_0 blocks of its float expansion: 8-bit codes per 32 values, within a
  fraction of the file's own step, and the block kernel's speed rather than fbgemm's or torch's int4 one's.
- Without the block kernel, where the CPU has AMX tiles, a layer made only of 4-bit tensors keeps 4-bit codes for
  torch's int4 kernel, which runs on them there and reads half the bytes of int8.
- Every other quantized layer becomes int8 per output channel with activations quantized per call (fbgemm): on AVX2
  and on AVX-512 without AMX (Zen 4) it is faster than the int4 kernel at every batch size, and than float32,
  bfloat16 or fp16 weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from inference.engine.model import block_quant
from inference.engine.model.block_quant import Q4_0Linear, Q4_KLinear, Q6_KLinear, Q8_0Linear, fits_blocks
from inference.engine.model.int4 import Int4Linear, fits_int4
from inference.engine.model.quantize import DynamicInt8Linear

QUANTIZED_TYPES = frozenset({"Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0"})
FOUR_BIT_TYPES = frozenset({"Q4_0", "Q4_K"})
BLOCK_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")  # the types whose blocks the block kernel multiplies as they are
FILE_BYTES_TYPES = frozenset({"Q4_K", "Q6_K"})  # the types whose layers are made from the file's bytes
# Below this many weights a float32 layer is faster than the int8 one (the break-even measured at one to eight rows).
MIN_QUANTIZED_ELEMENTS = 1 << 18


def int4_kernel_is_fast() -> bool:
    """Whether torch's 4-bit kernel beats fbgemm's int8 one here for the batches a server runs: on a CPU with AMX tiles
    (Sapphire Rapids: 4.5 against 11-13 ms for the 85M step at one row) but not on AVX-512 BF16 alone (Zen 4: faster
    at one row, 7.3 against 9.8 ms, slower from a few rows on, 17.4 against 13.3 ms at eight;
    docs/quantized-weights.md)."""
    return torch.cpu._is_amx_tile_supported()


@dataclass(frozen=True)
class KeepQuantized:
    """What a load keeps quantized: `stored_types` maps the Hugging Face names of the checkpoint's quantized tensors
    to their GGUF type, `file_bytes` those of FILE_BYTES_TYPES to their bytes in the file; `block_kernel`,
    `int4_kernel` and `min_elements` default to this build's and this CPU's choice."""

    stored_types: Mapping[str, str]
    file_bytes: Mapping[str, torch.Tensor] = field(default_factory=dict)
    block_kernel: bool = block_quant.KERNEL is not None
    int4_kernel: bool = field(default_factory=int4_kernel_is_fast)
    min_elements: int = MIN_QUANTIZED_ELEMENTS

    def form(self, linear: nn.Linear, sources: list[str]) -> str | None:
        """ "q4_0", "q8_0", "q4_k", "q6_k", "int4", "int8", or None (stays float) for a linear layer fused from the
        tensors `sources`."""
        types = [self.stored_types.get(name) for name in sources]
        if not all(t in QUANTIZED_TYPES for t in types) or linear.weight.numel() < self.min_elements:
            return None
        if self.block_kernel and fits_blocks(linear):
            for block_type in BLOCK_TYPES:
                if all(t == block_type for t in types):
                    if block_type in FILE_BYTES_TYPES and not all(name in self.file_bytes for name in sources):
                        break
                    return block_type.lower()
            return "q8_0"
        if self.int4_kernel and all(t in FOUR_BIT_TYPES for t in types) and fits_int4(linear):
            return "int4"
        return "int8"


LAYERS = {
    "q4_0": Q4_0Linear,
    "q8_0": Q8_0Linear,
    "q4_k": Q4_KLinear,
    "q6_k": Q6_KLinear,
    "int4": Int4Linear,
    "int8": DynamicInt8Linear,
}


def keep_quantized(model: nn.Module, sources: dict[str, list[str]], keep: KeepQuantized) -> None:
    """Replaces, in place, each of the model's float32 linear layers (by module name in `sources`, with the tensors
    each is fused from) that `keep` says stays quantized."""
    for qualified, module in list(model.named_modules()):
        if qualified not in sources or not isinstance(module, nn.Linear):
            continue
        form = keep.form(module, sources[qualified])
        if form is not None:
            parent_name, _, child = qualified.rpartition(".")
            if form.upper() in FILE_BYTES_TYPES:  # a fused layer's rows are its sources' rows, one after another
                layer = LAYERS[form](module, torch.cat([keep.file_bytes[name] for name in sources[qualified]]))
            else:
                layer = LAYERS[form](module)
            setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
