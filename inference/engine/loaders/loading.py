"""`load_model`: a path on disk to a ready `ModelRunner` with its tokenizer and stop tokens.

A directory is a Hugging Face checkpoint; a `.gguf` file is a GGUF checkpoint. Both loaders hand over the same thing
(a `ModelConfig` and weights in Hugging Face naming: a directory's in the load's dtype, a GGUF file's in float32), so
everything after reading is one path.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.engine.contract.checkpoint import NotACheckpoint
from inference.engine.contract.checkpoint import checkpoint_format as contract_checkpoint_format
from inference.engine.errors import LoadError
from inference.engine.execution.runner import DEFAULT_ATTENTION, DEFAULT_BLOCK_SIZE, ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.gguf import read_gguf, stored_tensor_types
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.loaders.progress import ReadProgress
from inference.engine.model.config import ModelConfig
from inference.engine.model.transformer import FloatLinear, PackedLinear, TransposedLinear
from inference.engine.parallel.shard import (
    Shard,
    ShardTensors,
    SplitRefused,
    check_split,
    make_row_parallel,
    shard_config,
)
from inference.engine.quant.block_quant import BlockParts
from inference.engine.quant.int4 import Int4Linear
from inference.engine.quant.quantize import DynamicInt8Linear, WeightOnlyInt8Linear
from inference.engine.quant.stored_quant import LAYERS, QUANTIZED_TYPES, KeepQuantized
from inference.engine.text.tokenizer import Tokenizer
from inference.engine.weights.parameter_views import ParameterViews

# A config's max_position_embeddings can be 128k; a KV cache that long for every slot would not fit in memory.
DEFAULT_MAX_CONTEXT = 4096
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARD_FORMS = (
    "a tensor-parallel load takes float weights only: no quantize, no attachable layout, and a GGUF file's quantized "
    "layers expanded (dtype float32)"
)


def load_model(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    quantize: bool = False,
    max_concurrent: int = 8,
    context_window: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    cache_tokens: int = 0,
    host_cache_bytes: int = 0,
    kv_dtype: str | torch.dtype | None = None,
    attachable: bool = False,
    progress: ReadProgress | None = None,
    shard: Shard | None = None,
    attention: str = DEFAULT_ATTENTION,
) -> LoadedModel:
    """Loads a checkpoint. dtype defaults to float32 on CPU and bfloat16 on CUDA; context_window defaults to the
    model's own limit capped at DEFAULT_MAX_CONTEXT, and may not exceed the model's limit. The KV pool holds
    `max_concurrent` full windows and `cache_tokens` positions more for the prefix cache (see ModelRunner), in blocks
    of `block_size`, in `kv_dtype` (default: the weights' dtype), read by the `attention` backend (runner.py),
    and a host tier of `host_cache_bytes` behind it.
    `attachable` lays the weights out for a trainer to attach to (loaders/build.py) and exposes them as
    `parameters`; it cannot be combined with `quantize`. `progress` counts the tensors and bytes read. With dtype
    left automatic, a GGUF file's quantized tensors (QUANTIZED_TYPES) stay quantized on CPU (quant/stored_quant.py);
    dtype float32 expands them."""
    path = Path(path)
    device = torch.device(device)
    automatic_dtype = dtype is None
    dtype = _resolve_dtype(dtype, device)
    kv_dtype = None if kv_dtype is None else _resolve_dtype(kv_dtype, device)
    fmt = checkpoint_format(path)
    read = _read(path, fmt, dtype, keep_quantized=automatic_dtype, progress=progress)
    config, tokenizer = read.config, read.tokenizer
    context = _context_window(path, config, context_window)
    plain = read.keep is None and not quantize and not attachable
    built, tensors = _rank_part(path, config, read.tensors, shard, plain=plain)
    model = build_model(
        built, tensors, context_window=context, device=device, dtype=dtype, quantize=quantize,
        attachable=attachable, keep=read.keep,
    )  # fmt: skip
    del tensors
    if shard is not None:
        make_row_parallel(model, shard.group)
    eos = read.eos_token_ids()
    del read  # the file's bytes that Q4_K layers were made from go too
    return_freed_memory()
    runner = ModelRunner(
        model, max_concurrent=max_concurrent, context_window=context, block_size=block_size, cache_tokens=cache_tokens,
        kv_dtype=kv_dtype, host_cache_bytes=host_cache_bytes, attention=attention,
    )  # fmt: skip
    if shard is not None:
        runner.plan = None  # its kernel calls would skip the all-reduce (the decode plan is the forward's, lowered)
    return LoadedModel(
        path=path,
        format=fmt,
        config=config,
        tokenizer=tokenizer,
        runner=runner,
        eos_token_ids=eos,
        dtype=dtype,
        device=device,
        quantized=quantize,
        parameters=ParameterViews(model, config) if attachable else None,
        weight_bytes=weight_bytes(model),
        weights_version=weights_version(path, dtype, quantize),
        linear_formats=linear_formats(model),
        torch_matmuls=torch_matmuls(model),
    )


def _rank_part(path: Path, config, tensors, shard: Shard | None, *, plain: bool):
    """The configuration and tensors this rank builds: the whole model's, or its part of a split one (only a plain
    float load splits: SplitRefused otherwise, and for heads or feed-forward rows the ranks do not divide)."""
    if shard is None:
        return config, tensors
    if not plain:
        raise SplitRefused(path, SHARD_FORMS)
    check_split(path, config, shard.ranks)
    return shard_config(config, shard.ranks), ShardTensors(config, tensors, shard.rank, shard.ranks)


@dataclass(slots=True)
class _Read:
    config: ModelConfig
    tensors: Mapping[str, torch.Tensor]  # Hugging Face names
    generation_eos_ids: list[int]
    tokenizer: Tokenizer
    keep: KeepQuantized | None

    def eos_token_ids(self) -> list[int]:
        """config + generation_config + tokenizer EOS, deduplicated, in that order."""
        eos = [*self.config.eos_token_ids, *self.generation_eos_ids]
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        return list(dict.fromkeys(eos))


def _context_window(path: Path, config: ModelConfig, requested: int | None) -> int:
    context = requested or min(config.context_limit, DEFAULT_MAX_CONTEXT)
    if context > config.context_limit:
        raise LoadError(path, f"context_window {context} exceeds the model's {config.context_limit}")
    return context


def _read(path: Path, fmt: str, dtype: torch.dtype, *, keep_quantized: bool, progress: ReadProgress | None) -> _Read:
    """A checkpoint's config, tensors and tokenizer; with `keep_quantized`, a GGUF file's quantized tensors are
    named to stay so (on CPU: build_model decides)."""
    if fmt == "hf":
        checkpoint = read_hf_dir(path, progress, dtype)
        tokenizer = Tokenizer.from_hf_dir(path)
        return _Read(checkpoint.config, checkpoint.tensors, checkpoint.generation_eos_ids, tokenizer, None)
    checkpoint = read_gguf(path, progress)
    tokenizer = Tokenizer.from_gguf(checkpoint.reader, path)
    stored = {n: t for n, t in checkpoint.tensor_types.items() if t in QUANTIZED_TYPES}
    keep = KeepQuantized(stored, checkpoint.file_bytes) if keep_quantized and stored else None
    return _Read(checkpoint.config, checkpoint.tensors, [], tokenizer, keep)


def weights_version(path: Path, dtype: torch.dtype, quantize: bool) -> int:
    """A signed 64-bit number that changes whenever the weights a load serves change: it digests each checkpoint
    file's name, size and modification time, and the dtype and quantization the load applied. The same files
    loaded the same way get the same number after a restart, so an exported session can be restored; rewritten
    files, other files or other numerics get another. (Hashing the files' bytes would take seconds per gigabyte.)"""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    digest = hashlib.blake2b(digest_size=8)
    for file in files:
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    digest.update(f"{dtype}\0{quantize}".encode())
    return int.from_bytes(digest.digest(), "little", signed=True)


def checkpoint_format(path: Path) -> str:
    """ "hf" or "gguf", as the contract decides it for the control plane too; LoadError for anything else."""
    try:
        return contract_checkpoint_format(path)
    except NotACheckpoint as exc:
        raise LoadError(exc.path, exc.problem) from exc


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights, each shared tensor counted once, int8 layers at their int8 size."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values()) + sum(getattr(m, "weight_nbytes", 0) for m in model.modules())


def automatic_kv_dtype(path: str | Path, dtype: str | None, device: str) -> str | None:
    """The KV pool's dtype when the load option `kv_dtype` is left empty: "float16" for a GGUF file whose quantized
    layers stay quantized (dtype automatic, on the CPU), else None (the weights' dtype).

    Such a model has no float weights whose dtype the KV should follow, and a float32 pool would be its largest
    part, often ten times its weights at a few dozen sequences, and decode attention reads it all every step.
    float16, as llama.cpp keeps its KV by default, halves both (docs/kv-cache.md: how exact)."""
    if dtype or torch.device(device).type != "cpu" or checkpoint_format(Path(path)) != "gguf":
        return None
    return "float16" if stored_tensor_types(path) & QUANTIZED_TYPES else None


def linear_formats(model: torch.nn.Module) -> dict[str, int]:
    """How many linear layers keep their weights in each in-memory format: a block form ("q4_0", "q8_0", "q4_k",
    "q5_k", "q6_k", "q5_0", "q4_1", "q5_1", "q3_k"; quant/block_quant.py; a layer fused from several, its parts'
    joined: "q4_k+q6_k"), "int4" (quant/int4.py), "int8" (quant/quantize.py), else the weights' dtype ("float32",
    "bfloat16", "float16")."""
    parts = {id(part) for m in model.modules() if isinstance(m, BlockParts) for part in m.parts}
    counts: dict[str, int] = {}
    for module in model.modules():
        kind = None if id(module) in parts else _linear_format(module)
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def _linear_format(module: torch.nn.Module) -> str | None:
    if isinstance(module, BlockParts):
        return "+".join(dict.fromkeys(_linear_format(part) for part in module.parts))
    for form, layer_class in LAYERS.items():  # the quantized forms of stored_quant.py
        if type(module) is layer_class:
            return form
    if isinstance(module, WeightOnlyInt8Linear):
        return "int8"
    if isinstance(module, PackedLinear | FloatLinear):  # float32 weights only
        return "float32"
    if isinstance(module, TransposedLinear):
        return str(module.weight_t.dtype).removeprefix("torch.")
    if isinstance(module, torch.nn.Linear):
        return str(module.weight.dtype).removeprefix("torch.")
    return None


def torch_matmuls(model: torch.nn.Module) -> bool:
    """Whether a linear layer of the model multiplies a large weight with torch's ops (and its threads) rather than
    the C kernel's (kernels/matmul.py); TransposedLinear holds only weights too small to share out."""
    return any(
        isinstance(m, torch.nn.Linear | PackedLinear | Int4Linear | DynamicInt8Linear | WeightOnlyInt8Linear)
        for m in model.modules()
    )


def return_freed_memory() -> None:
    """Hands freed heap memory back to the operating system: the float32 copies a load made, an unloaded model.
    glibc keeps freed small and medium blocks for reuse, so without this a 4-bit model's worker stays as large in
    memory as its float32 expansion was, and a worker as large as the largest model it ever held. A no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if dtype not in DTYPES.values():
        raise ValueError(f"unsupported dtype {dtype}")
    return dtype
