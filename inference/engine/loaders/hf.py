"""Reads a Hugging Face checkpoint directory: config.json, safetensors (one file or sharded), generation_config.json.

Every tensor the model needs is checked for presence and shape here, against the config, so a bad checkpoint fails at
load with the file and the tensor named instead of deep inside a matmul.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from inference.engine.errors import LoadError
from inference.engine.loaders.progress import ReadProgress
from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import expected_hf_shapes

# Bytes per element of safetensors' dtype names (for the totals a load's progress is counted against).
_ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(slots=True)
class HFCheckpoint:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # Hugging Face names, in the read's dtype on CPU
    generation_eos_ids: list[int]  # generation_config.json's eos_token_id(s); [] without that file


def read_hf_config(path: str | Path) -> ModelConfig:
    """The checkpoint directory's config.json as a ModelConfig, without reading any weights."""
    file = Path(path) / "config.json"
    return ModelConfig.from_hf_dict(_read_json(file), file)


def read_hf_dir(
    path: str | Path, progress: ReadProgress | None = None, dtype: torch.dtype = torch.float32
) -> HFCheckpoint:
    """The config and the expected tensors of a checkpoint directory, in `dtype`; `progress` counts what is read.

    Each tensor goes from the file's dtype straight to `dtype`, one at a time: a bfloat16 checkpoint read as
    bfloat16 is never widened, so the read holds the checkpoint's size, not twice it."""
    root = Path(path)
    config = read_hf_config(root)
    expected = expected_hf_shapes(config)
    files = _tensor_files(root, expected)
    progress = progress or ReadProgress()
    progress.expect(len(expected), sum(_stored_bytes(file, names) for file, names in files.items()))
    tensors: dict[str, torch.Tensor] = {}
    for file, names in files.items():
        tensors |= _read_safetensors(file, names, progress, dtype)
        for name in names:
            if tuple(tensors[name].shape) != expected[name]:
                got, want = list(tensors[name].shape), list(expected[name])
                raise LoadError(file, f"tensor {name} has shape {got}, expected {want}")
    return HFCheckpoint(config=config, tensors=tensors, generation_eos_ids=_generation_eos_ids(root))


def _missing(names: list[str]) -> str:
    more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
    return f"missing tensor {names[0]}{more}"


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise LoadError(file, "file not found")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoadError(file, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise LoadError(file, "expected a JSON object")
    return data


def _tensor_files(root: Path, expected: dict[str, tuple[int, ...]]) -> dict[Path, list[str]]:
    """Which file holds each expected tensor: from the shard index when there is one, else the single file."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise LoadError(index, "no weight_map")
        missing = [name for name in expected if name not in weight_map]
        if missing:
            raise LoadError(index, _missing(missing))
        files: dict[Path, list[str]] = {}
        for name in expected:
            files.setdefault(root / weight_map[name], []).append(name)
        return files
    single = root / "model.safetensors"
    if not single.is_file():
        candidates = sorted(root.glob("*.safetensors"))
        if len(candidates) != 1:
            raise LoadError(root, "no model.safetensors (or model.safetensors.index.json) in the directory")
        single = candidates[0]
    return {single: list(expected)}


def _open_safetensors(file: Path, names: list[str]):
    if not file.is_file():
        raise LoadError(file, "safetensors file not found")
    handle = safe_open(file, framework="pt")
    present = set(handle.keys())
    missing = [name for name in names if name not in present]
    if missing:
        raise LoadError(file, _missing(missing))
    return handle


def _stored_bytes(file: Path, names: list[str]) -> int:
    """Bytes the file stores for these tensors, from its header alone."""
    try:
        with _open_safetensors(file, names) as handle:
            total = 0
            for name in names:
                tensor = handle.get_slice(name)
                total += math.prod(tensor.get_shape()) * _ELEMENT_BYTES.get(tensor.get_dtype(), 4)
            return total
    except LoadError:
        raise
    except Exception as exc:  # safetensors raises its own error types (and OSError) for damaged files
        raise LoadError(file, f"cannot read safetensors: {exc}") from exc


def _read_safetensors(
    file: Path, names: list[str], progress: ReadProgress, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    try:
        with _open_safetensors(file, names) as handle:
            tensors = {}
            for name in names:
                stored = handle.get_tensor(name)
                progress.read(stored.nbytes)
                tensors[name] = stored.to(dtype)
            return tensors
    except LoadError:
        raise
    except Exception as exc:  # safetensors raises its own error types (and OSError) for damaged files
        raise LoadError(file, f"cannot read safetensors: {exc}") from exc


def _generation_eos_ids(root: Path) -> list[int]:
    file = root / "generation_config.json"
    if not file.is_file():
        return []
    eos = _read_json(file).get("eos_token_id")
    if eos is None:
        return []
    try:
        return [int(i) for i in eos] if isinstance(eos, list) else [int(eos)]
    except (TypeError, ValueError) as exc:
        raise LoadError(file, f"bad eos_token_id {eos!r}") from exc
