"""Reads a GGUF file (llama.cpp's single-file format) into the engine's Hugging Face-named float32 weights.

Three things differ from a Hugging Face checkpoint and are undone here:
- names: `blk.N.attn_q.weight` and friends become `model.layers.N.self_attn.q_proj.weight` and friends;
- layout: quantized blocks are dequantized, each tensor when a load first asks for it (`LazyTensors`: a layer that
  keeps the file's blocks is made from its bytes, which are kept for every quantized tensor, and its float32
  expansion is never made), and ggml shapes (ne0, the input dim, first) become torch [out, in];
- RoPE order: llama.cpp's `llama` architecture rotates adjacent pairs, so its converter stores q/k rows in Meta's
  interleaved order; the model rotates halves (HF `rotate_half`), so llama q/k rows are permuted back. qwen2 and
  qwen3 GGUFs already use the half-split (NEOX) order and are taken as stored.

Every tensor is checked against what the model needs (model/layout.py) before any data is decoded, and a file
that is not a GGUF, is cut short, or holds the wrong tensors raises `LoadError` naming the file and the problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gguf
import numpy as np
import torch

from inference.engine.contract.checkpoint import GGUF_MAGIC
from inference.engine.errors import LoadError
from inference.engine.loaders.gguf_config import ROPE_FREQS_TENSOR, config_from_gguf
from inference.engine.loaders.progress import ReadProgress
from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import EMBEDDING, LAYER, TOP, model_tensors
from inference.engine.quant.gguf_dequant import SUPPORTED_TYPES, dequantize
from inference.engine.quant.stored_quant import FILE_BYTES_TYPES, QUANTIZED_TYPES

# GGUF names to Hugging Face names, at the top and within a layer (blk.N. / model.layers.N.), from the model's layout.
_TOP_LEVEL_NAMES = {part.gguf: part.hf for tensor in TOP for part in tensor.parts}
_LAYER_NAMES = {part.gguf: part.hf for tensor in LAYER for part in tensor.parts}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")


class LazyTensors(Mapping[str, torch.Tensor]):
    """A GGUF file's tensors by Hugging Face name, each decoded to float32 when first asked for (and kept): a load
    asks only for those it computes with in float, so the weights of layers that keep the file's blocks are never
    expanded (peak memory near the file's size rather than the float32 model's). `decoded` names those asked for."""

    def __init__(self, decoders: dict[str, Callable[[], torch.Tensor]]):
        self._decoders = decoders
        self._tensors: dict[str, torch.Tensor] = {}

    @property
    def decoded(self) -> frozenset[str]:
        return frozenset(self._tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._tensors:
            self._tensors[name] = self._decoders[name]()
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoders)

    def __len__(self) -> int:
        return len(self._decoders)


@dataclass(slots=True)
class GGUFCheckpoint:
    config: ModelConfig
    tensors: LazyTensors  # Hugging Face names, float32 on CPU, q/k in rotate_half layout
    reader: gguf.GGUFReader  # kept for the tokenizer and chat template in the file's metadata
    tensor_types: dict[str, str]  # each tensor's ggml type name in the file ("F32", "Q8_0", "Q4_K", ...), by HF name
    # The file's bytes [rows, bytes per row] of each tensor of a type in FILE_BYTES_TYPES, rows in the floats' order:
    # layers that keep such a type in memory are made from them (quant/block_quant.py); and of a quantized token
    # embedding, which may stay as its rows (quant/stored_embedding.py).
    file_bytes: dict[str, torch.Tensor]


def read_gguf(path: str | Path, progress: ReadProgress | None = None) -> GGUFCheckpoint:
    """The config and the tensors (float32, Hugging Face names) of a GGUF file; `progress` counts what is decoded."""
    path = Path(path)
    reader = _open(path)
    by_name = {t.name: t for t in reader.tensors}
    freqs = by_name.pop(ROPE_FREQS_TENSOR, None)
    rope_freqs = None
    if freqs is not None:
        rope_freqs = _decode(path, freqs, tuple(int(n) for n in reversed(freqs.shape)), None).numpy()
    config = config_from_gguf(reader, path, rope_freqs)
    hf_to_gguf = {}
    for name in by_name:
        hf_name = hf_name_of(name)
        if hf_name is None:
            raise LoadError(path, f"unexpected tensor {name}: not part of a {config.architecture} model")
        hf_to_gguf[hf_name] = name
    parts = {part.hf: part for tensor in model_tensors(config) for part in tensor.parts}
    expected = {hf_name: part.shape for hf_name, part in parts.items()}
    for part in parts.values():
        _check_tensor(path, by_name.get(part.gguf), part.gguf, part.shape)
    for hf_name, name in hf_to_gguf.items():
        if hf_name not in expected:
            raise LoadError(path, f"unexpected tensor {name}: the metadata describes a model without it")
    progress = progress or ReadProgress()
    progress.expect(len(hf_to_gguf), sum(int(by_name[name].n_bytes) for name in hf_to_gguf.values()))
    heads = _qk_heads(config) if config.architecture == "llama" else {}  # rows to take back to rotate_half order
    decoders, file_bytes = {}, {}
    for hf_name, name in hf_to_gguf.items():
        tensor = by_name[name]
        _check_type(path, tensor)
        decoders[hf_name] = partial(_decode, path, tensor, expected[hf_name], heads.get(hf_name))
        kept = tensor.tensor_type.name in FILE_BYTES_TYPES  # and a quantized embedding's, which it may keep as is
        if kept or (hf_name == EMBEDDING and tensor.tensor_type.name in QUANTIZED_TYPES):
            rows = _file_rows(path, tensor, expected[hf_name])
            file_bytes[hf_name] = rows if hf_name not in heads else _interleaved_to_half_split(rows, heads[hf_name])
        progress.read(int(tensor.n_bytes))
    types = {hf_name: by_name[name].tensor_type.name for hf_name, name in hf_to_gguf.items()}
    return GGUFCheckpoint(
        config=config, tensors=LazyTensors(decoders), reader=reader, tensor_types=types, file_bytes=file_bytes
    )


def read_gguf_config(path: str | Path) -> ModelConfig:
    """The file's metadata as a ModelConfig, without decoding any tensor (rope_freqs only refine RoPE tables)."""
    path = Path(path)
    return config_from_gguf(_open(path), path, None)


def stored_tensor_types(path: str | Path) -> frozenset[str]:
    """The ggml type names ("F32", "Q8_0", ...) of the file's tensors, without decoding any."""
    path = Path(path)
    return frozenset(tensor.tensor_type.name for tensor in _open(path).tensors)


def hf_name_of(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name, or None for a tensor the engine's model does not have."""
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        return None
    return f"model.layers.{int(match[1])}.{_LAYER_NAMES[match[2]]}"


def _open(path: Path) -> gguf.GGUFReader:
    """Opens the file with gguf's reader, turning its assorted exceptions into LoadError."""
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise LoadError(path, f"cannot read the file: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise LoadError(path, f"not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}")
    try:
        # "c" (copy-on-write) maps the file privately: arrays are writable, so torch can wrap them, but the file on
        # disk is never modified.
        return gguf.GGUFReader(path, "c")
    except Exception as exc:  # the reader signals a damaged file with whatever its parsing trips over
        raise LoadError(path, f"truncated or corrupt GGUF file ({type(exc).__name__}: {exc})") from exc


def _check_tensor(path: Path, tensor: gguf.ReaderTensor | None, name: str, torch_shape: tuple[int, ...]) -> None:
    if tensor is None:
        raise LoadError(path, f"missing tensor {name}")
    got, want = [int(n) for n in tensor.shape], list(reversed(torch_shape))
    if got != want:
        raise LoadError(path, f"tensor {name} has shape {got}, expected {want} (ggml order, input dim first)")
    _check_type(path, tensor)


def _check_type(path: Path, tensor: gguf.ReaderTensor) -> None:
    if tensor.tensor_type not in SUPPORTED_TYPES:
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise LoadError(path, f"tensor {tensor.name} has type {tensor.tensor_type.name}; supported types: {supported}")


def _decode(path: Path, tensor: gguf.ReaderTensor, torch_shape: tuple[int, ...], heads: int | None) -> torch.Tensor:
    """The tensor as float32, its rows taken from interleaved pairs to rotate_half's order where `heads` is given."""
    _check_type(path, tensor)
    try:
        decoded = dequantize(tensor.data, tensor.tensor_type, torch_shape)
    except ValueError as exc:
        raise LoadError(path, f"tensor {tensor.name}: {exc}") from exc
    return decoded if heads is None else _interleaved_to_half_split(decoded, heads)


def _file_rows(path: Path, tensor: gguf.ReaderTensor, torch_shape: tuple[int, ...]) -> torch.Tensor:
    """A quantized tensor's bytes as they are in the file, one row of blocks per output row: uint8 [rows, bytes]."""
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    data = torch.from_numpy(np.array(tensor.data)).view(torch.uint8).reshape(-1)
    rows, columns = torch_shape[0], int(np.prod(torch_shape[1:], dtype=np.int64))
    if columns % block_size or data.numel() != rows * columns // block_size * block_bytes:
        raise LoadError(path, f"tensor {tensor.name}: {data.numel()} bytes do not hold shape {list(torch_shape)}")
    return data.reshape(rows, -1)


def _qk_heads(config: ModelConfig) -> dict[str, int]:
    """llama's q/k weights and biases, whose rows go from interleaved pairs to HF's half-split layout, and the heads
    each holds."""
    return {part.hf: part.rope_heads for tensor in model_tensors(config) for part in tensor.parts if part.rope_heads}


def _interleaved_to_half_split(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    # w: [n_heads * head_dim, *rest] with each head's rows as pairs (0, 1), (2, 3), ...
    # returns the same shape with each head's rows as all even rows, then all odd rows
    head_dim = w.shape[0] // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
