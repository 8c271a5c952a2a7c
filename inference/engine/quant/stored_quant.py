"""Which in-memory form a linear layer takes when its checkpoint stores it quantized (any GGUF block type the reader
decodes, quant/gguf_dequant.py), on CPU with dtype left automatic: the file's own Q4_0, Q8_0 or K-quant blocks
(quant/block_quant.py), Q8_0 blocks re-encoded from the float expansion, 4-bit codes for torch's int4 kernel
(quant/int4.py), int8 per output channel (quant/quantize.py's fbgemm layer), or float32 as the file expands to.

The choice (docs/quantized-weights.md has the figures):
- A layer small enough to sit in cache stays float32: it costs no memory bandwidth worth saving, and the fixed cost
  of a quantized call (quantizing its activations) is several times a small float GEMM's.
- Where the block kernel is built, Q4_0, Q8_0, Q4_K, Q5_K and Q6_K tensors keep the file's blocks: the file's exact
  weights (for the 4- to 6-bit types in fewer bytes than int8), faster than int8 for one to eight rows on AVX-512
  VNNI (slower for a few dozen rows and for prompt chunks; docs/quantized-weights.md). A layer fused from tensors of
  several types (a Q4_K_M file's q and k are Q4_K, its v Q6_K in half the layers) is made of one block layer per run
  of rows of one type (block_quant.BlockParts). Q5_0 and Q5_1 (which llama.cpp's K-quant files hold where a row is
  not a multiple of 256 values) and Q4_1 keep their blocks too, in rows padded to whole super-blocks as Q4_0's and
  Q8_0's can be. Q3_K becomes Q6_K's layout, exactly its weights (its codes and scales are Q6_K's too). Every other
  type (Q2_K, the i-quants), and a K-quant whose bytes the checkpoint did not keep, becomes Q8_0 blocks of its
  expansion: the kernel has no form of its own for them.
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

from inference.engine import kernels
from inference.engine.model.layout import EMBEDDING
from inference.engine.quant.block_codecs import fits_blocks
from inference.engine.quant.block_quant import (
    BlockLinear,
    BlockParts,
    Q3_KLinear,
    Q4_0Linear,
    Q4_1Linear,
    Q4_KLinear,
    Q5_0Linear,
    Q5_1Linear,
    Q5_KLinear,
    Q6_KLinear,
    Q8_0Linear,
)
from inference.engine.quant.gguf_dequant import QUANTIZED_TYPES
from inference.engine.quant.int4 import Int4Linear, fits_int4
from inference.engine.quant.quantize import DynamicInt8Linear
from inference.engine.quant.stored_embedding import StoredEmbedding

FOUR_BIT_TYPES = frozenset({"Q4_0", "Q4_K"})
# The types that have a block layer of their own, made from the file's bytes, which a GGUF checkpoint therefore keeps
# (loaders/gguf.py).
FILE_BYTES_TYPES = frozenset({"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q4_1", "Q5_1", "Q3_K"})
BLOCK_FORMS = frozenset(t.lower() for t in FILE_BYTES_TYPES)
# Below this many weights a float32 layer is faster than the int8 one (the break-even measured at one to eight rows).
MIN_QUANTIZED_ELEMENTS = 1 << 18
# From this many values a quantized embedding table keeps the file's rows (stored_embedding.py).
MIN_STORED_EMBEDDING_ELEMENTS = 1 << 22


def int4_kernel_is_fast() -> bool:
    """Whether torch's 4-bit kernel beats fbgemm's int8 one here for the batches a server runs: on a CPU with AMX tiles
    (Sapphire Rapids) but not on AVX-512 BF16 alone (Zen 4: faster at one row, slower from a few rows on;
    docs/quantized-weights.md)."""
    return torch.cpu._is_amx_tile_supported()


@dataclass(frozen=True)
class KeepQuantized:
    """What a load keeps quantized: `stored_types` maps the Hugging Face names of the checkpoint's quantized tensors
    to their GGUF type, `file_bytes` those of FILE_BYTES_TYPES (and the embedding's, whatever its type) to their
    bytes in the file; `block_kernel`, `int4_kernel`, `min_elements` and `min_embedding_elements` default to this
    build's and this CPU's choice."""

    stored_types: Mapping[str, str]
    file_bytes: Mapping[str, torch.Tensor] = field(default_factory=dict)
    block_kernel: bool = kernels.block_kernel_runs()
    int4_kernel: bool = field(default_factory=int4_kernel_is_fast)
    min_elements: int = MIN_QUANTIZED_ELEMENTS
    min_embedding_elements: int = MIN_STORED_EMBEDDING_ELEMENTS

    def keeps_embedding(self, embedding_dim: int) -> bool:
        """Whether the token embedding stays quantized (quant/stored_embedding.py): the table is quantized, its bytes
        kept, and large enough to be worth it."""
        rows = self.file_bytes.get(EMBEDDING)
        return rows is not None and rows.shape[0] * embedding_dim >= self.min_embedding_elements

    def stored_embedding(self, model: nn.Module, made: set[str]) -> StoredEmbedding:
        """The kept embedding of `model` once its layers are in place (`made`: those made from the file's bytes): the
        tied output head's rows where the head holds the table's own blocks, else the file's rows."""
        if model.config.tie_word_embeddings and "lm_head" in made and isinstance(model.lm_head, BlockLinear):
            return StoredEmbedding.of_head(model.lm_head)
        dim = model.config.hidden_size
        return StoredEmbedding.from_file(self.file_bytes[EMBEDDING], self.stored_types[EMBEDDING], dim)

    def from_bytes(self, form: str, sources: list[str]) -> bool:
        """Whether a block layer of `form` is made from its sources' bytes: they were kept, and are that form's type
        (a type without a layer of its own becomes Q8_0 blocks of its expansion)."""
        return all(n in self.file_bytes and self.stored_types[n].lower() == form for n in sources)

    def form(self, linear: nn.Linear, sources: list[str]) -> str | None:
        """A block form ("q4_0", "q8_0", "q4_k", "q5_k", "q6_k", "q5_0", "q4_1", "q5_1", "q3_k"), "parts" (each
        source in its block form, `block_form`), "int4", "int8", or None (stays float) for a linear layer fused from
        the tensors `sources`."""
        types = [self.stored_types.get(name) for name in sources]
        if not all(t in QUANTIZED_TYPES for t in types) or linear.weight.numel() < self.min_elements:
            return None
        if self.block_kernel and fits_blocks(linear):
            forms = {self.block_form(name) for name in sources}
            return forms.pop() if len(forms) == 1 else "parts"
        if self.int4_kernel and all(t in FOUR_BIT_TYPES for t in types) and fits_int4(linear):
            return "int4"
        return "int8"

    def block_form(self, source: str) -> str:
        """The block layer a quantized tensor becomes: its own type's blocks, made from the file's bytes (Q4_0's and
        Q8_0's can be found again in the expansion too); a type without a layer of its own, or whose bytes were not
        kept, Q8_0 blocks of its expansion."""
        stored = self.stored_types[source]
        own = stored in FILE_BYTES_TYPES and (source in self.file_bytes or stored in ("Q4_0", "Q8_0"))
        return stored.lower() if own else "q8_0"


LAYERS = {
    "q4_0": Q4_0Linear,
    "q8_0": Q8_0Linear,
    "q4_k": Q4_KLinear,
    "q5_k": Q5_KLinear,
    "q6_k": Q6_KLinear,
    "q5_0": Q5_0Linear,
    "q4_1": Q4_1Linear,
    "q5_1": Q5_1Linear,
    "q3_k": Q3_KLinear,
    "int4": Int4Linear,
    "int8": DynamicInt8Linear,
}


def made_from_file(model: nn.Module, sources: dict[str, list[str]], keep: KeepQuantized) -> set[str]:
    """The names of the linear layers that `keep` makes from the file's bytes alone (`model` may be on the meta
    device: only the layers' shapes are read), whose float weights a load therefore never needs."""
    names = set()
    for qualified, module in model.named_modules():
        if qualified in sources and isinstance(module, nn.Linear):
            fused = sources[qualified]
            form = keep.form(module, fused)
            parts = form == "parts" and all(keep.from_bytes(keep.block_form(n), [n]) for n in fused)
            if parts or (form in BLOCK_FORMS and keep.from_bytes(form, fused)):
                names.add(qualified)
    return names


def keep_quantized(
    model: nn.Module, sources: dict[str, list[str]], keep: KeepQuantized, rows: Mapping[str, int]
) -> None:
    """Replaces, in place, each of the model's float32 linear layers (by module name in `sources`, with the tensors
    each is fused from, whose output rows `rows` gives) that `keep` says stays quantized. The layers `made_from_file`
    names may hold meta weights: they are made from the file's bytes."""
    for qualified, module in list(model.named_modules()):
        if qualified not in sources or not isinstance(module, nn.Linear):
            continue
        form = keep.form(module, sources[qualified])
        if form == "parts":
            layer: nn.Module = BlockParts(module, _block_parts(module, sources[qualified], keep, rows))
        elif form in BLOCK_FORMS:
            layer = _block_layer(form, module, sources[qualified], keep)
        elif form is not None:
            layer = LAYERS[form](module)
        else:
            continue
        parent_name, _, child = qualified.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)


def _block_parts(
    linear: nn.Linear, sources: list[str], keep: KeepQuantized, rows: Mapping[str, int]
) -> list[BlockLinear]:
    """The block layers of a fused layer's runs of sources of one block form, in order."""
    parts, first = [], 0
    runs: list[tuple[str, list[str]]] = []
    for name in sources:
        form = keep.block_form(name)
        if runs and runs[-1][0] == form:
            runs[-1][1].append(name)
        else:
            runs.append((form, [name]))
    for form, names in runs:
        count = sum(rows[name] for name in names)
        part = nn.Linear(linear.in_features, count, bias=False, device="meta")
        part.weight = nn.Parameter(linear.weight.detach()[first : first + count], requires_grad=False)
        first += count
        parts.append(_block_layer(form, part, names, keep))
    return parts


def _block_layer(form: str, linear: nn.Linear, sources: list[str], keep: KeepQuantized) -> BlockLinear:
    """A block layer of `form` for a layer fused from `sources`: from their bytes (its rows: theirs, one after
    another) where the checkpoint kept them, else from the float weight."""
    if keep.from_bytes(form, sources):
        return LAYERS[form](linear, torch.cat([keep.file_bytes[name] for name in sources]))
    return LAYERS[form](linear)
