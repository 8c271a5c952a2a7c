"""Builds a `ModelConfig` from a GGUF file's metadata (the `{arch}.*` and `tokenizer.ggml.*` keys).

GGUF has no config.json: hyper-parameters are key/value pairs named after the architecture, and a few facts are
only visible in the tensor list (tied embeddings when `output.weight` is absent, qwen2-style q/k/v bias, Llama-3
RoPE scaling stored as a `rope_freqs` tensor of per-frequency divisors). Whatever the engine cannot honour
(rope scaling other than Llama-3's, partial rotary, mixture of experts) is refused with a `LoadError`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from inference.engine.errors import LoadError
from inference.engine.model.config import ModelConfig, RopeScaling

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
ROPE_FREQS_TENSOR = "rope_freqs.weight"

# Llama 3's pre-training context; only the ratios original/low and original/high change the frequencies, so any
# value gives the same RoPE when a file does not record it.
_DEFAULT_ORIGINAL_CONTEXT = 8192


def config_from_gguf(reader: gguf.GGUFReader, path: str | Path, rope_freqs: np.ndarray | None) -> ModelConfig:
    """Reads the hyper-parameters; `rope_freqs` is the file's decoded `rope_freqs.weight`, if it has one."""
    meta = _Metadata(reader, path)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise LoadError(path, f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}  # ggml order: ne0 (input dim) first
    if "token_embd.weight" not in shapes:
        raise LoadError(path, "missing tensor token_embd.weight")
    if meta.get(f"{arch}.expert_count", 0, int):
        raise LoadError(path, "mixture-of-experts models are not supported")

    hidden = meta.get(f"{arch}.embedding_length", cast=_count)
    heads = meta.get(f"{arch}.attention.head_count", cast=_count)
    head_dim = meta.get(f"{arch}.attention.key_length", hidden // heads, _count)
    if meta.get(f"{arch}.attention.value_length", head_dim, int) != head_dim:
        raise LoadError(path, "attention value_length differs from key_length; not supported")
    rotary_dims = meta.get(f"{arch}.rope.dimension_count", head_dim, int)
    if rotary_dims != head_dim:
        raise LoadError(path, f"rope.dimension_count {rotary_dims} is not the head dim {head_dim}; not supported")
    rope_theta = meta.get(f"{arch}.rope.freq_base", 10000.0, _decimal)
    eos = [meta.get(f"tokenizer.ggml.{key}", None, int) for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    config = ModelConfig(
        architecture=arch,
        vocab_size=meta.get(f"{arch}.vocab_size", shapes["token_embd.weight"][-1], _count),
        hidden_size=hidden,
        intermediate_size=meta.get(f"{arch}.feed_forward_length", cast=_count),
        num_layers=meta.get(f"{arch}.block_count", cast=_count),
        num_heads=heads,
        num_kv_heads=meta.get(f"{arch}.attention.head_count_kv", heads, _count),
        head_dim=head_dim,
        rms_norm_eps=meta.get(f"{arch}.attention.layer_norm_rms_epsilon", cast=_decimal),
        rope_theta=rope_theta,
        max_position_embeddings=meta.get(f"{arch}.context_length", cast=_count),
        tie_word_embeddings="output.weight" not in shapes,
        attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in shapes,
        qk_norm=arch == "qwen3",
        rope_scaling=_rope_scaling(meta, arch, path, rope_freqs, head_dim, rope_theta),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id", None, int),
        eos_token_ids=list(dict.fromkeys(i for i in eos if i is not None)),
    )
    if config.num_layers > len(shapes):  # guards the per-layer tensor table against a corrupt block_count
        raise LoadError(path, f"block_count {config.num_layers} but the file holds only {len(shapes)} tensors")
    if config.num_heads % config.num_kv_heads:
        raise LoadError(path, "attention.head_count must be a multiple of attention.head_count_kv")
    return config


class _Metadata:
    """Typed access to the file's key/value pairs; a missing required key or a malformed value is a LoadError."""

    _REQUIRED = object()

    def __init__(self, reader: gguf.GGUFReader, path: str | Path):
        self.reader, self.path = reader, path

    def get(self, key: str, default: Any = _REQUIRED, cast: Any = str) -> Any:
        field = self.reader.get_field(key)
        if field is None:
            if default is self._REQUIRED:
                raise LoadError(self.path, f"metadata key {key} is missing")
            return default
        try:
            value = field.contents()
            return cast(value)
        except (TypeError, ValueError, IndexError, UnicodeDecodeError) as exc:
            raise LoadError(self.path, f"metadata key {key} has a bad value ({exc})") from exc


def _count(value: Any) -> int:
    """A size or count: a positive integer (a zero would only fail later, inside a division or a matmul)."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return int(value)


def _decimal(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-5, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _rope_scaling(
    meta: _Metadata, arch: str, path: str | Path, rope_freqs: np.ndarray | None, head_dim: int, theta: float
) -> RopeScaling | None:
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if meta.get(f"{arch}.rope.scale_linear", 1.0, float) != 1.0:
        scaling_type = "linear"
    if scaling_type != "none":
        raise LoadError(path, f"unsupported rope scaling {scaling_type!r}; only Llama-3 scaling (rope_freqs) is")
    if rope_freqs is None:
        return None
    original = meta.get(f"{arch}.rope.scaling.original_context_length", _DEFAULT_ORIGINAL_CONTEXT, _count)
    divisors = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
    if divisors.size != head_dim // 2:
        raise LoadError(path, f"{ROPE_FREQS_TENSOR} has {divisors.size} values, expected {head_dim // 2}")
    if np.all(divisors == 1.0):
        return None
    scaling = _fit_llama3(divisors, head_dim, theta, original)
    if scaling is None:
        raise LoadError(path, f"{ROPE_FREQS_TENSOR} does not describe Llama-3 rope scaling; no other kind is supported")
    return scaling


def _fit_llama3(divisors: np.ndarray, head_dim: int, theta: float, original: int) -> RopeScaling | None:
    """Recovers Llama-3 scaling parameters from the per-frequency divisors llama.cpp stores, or None if they fit none.

    Llama 3 keeps high frequencies, divides low ones by `factor`, and in between divides by 1 / ((1 - s) / factor + s)
    with s linear in original / wavelength: s = (original / wavelength - low) / (high - low). So `factor` is the
    largest divisor and a line through the in-between points gives low and high. The fit is accepted only if it
    reproduces every divisor.
    """
    factor = float(divisors.max())
    inv_freq = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = original * inv_freq / (2 * math.pi)  # original / wavelength
    between = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    if factor <= 1 or between.sum() < 2:
        return None
    smooth = (1 / divisors[between] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(x[between], smooth, 1)
    if slope <= 0:
        return None
    low, high = -intercept / slope, (1 - intercept) / slope
    scaling = RopeScaling(  # the values are exact up to float32 noise; drop the noise
        factor=float(f"{factor:.6g}"),
        low_freq_factor=float(f"{low:.6g}"),
        high_freq_factor=float(f"{high:.6g}"),
        original_max_position_embeddings=original,
    )
    s = np.clip((x - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor), 0.0, 1.0)
    rebuilt = 1 / ((1 - s) / scaling.factor + s)
    return scaling if np.allclose(rebuilt, divisors, rtol=1e-4, atol=0) else None
