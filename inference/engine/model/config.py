"""The engine's description of a decoder-only transformer, independent of the file format it came from.

Both loaders (Hugging Face directory, GGUF) produce a `ModelConfig`; the model is built from it alone.
Anything a checkpoint asks for that the engine does not implement is refused here, at load, with a
`LoadError` — never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.engine.errors import LoadError

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "llama3")


@dataclass(slots=True)
class RopeScaling:
    """Llama-3 style frequency scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # qwen2: bias on q/k/v projections
    qk_norm: bool = False  # qwen3: per-head RMSNorm on q and k before RoPE
    rope_scaling: RopeScaling | None = None
    # Mistral's sliding window: the engine caps its context at this many tokens, so attention never needs it.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def context_limit(self) -> int:
        """The longest sequence the engine will run for this model."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], path: str | Path = "config.json") -> ModelConfig:
        """Reads a Hugging Face `config.json` dict; raises `LoadError` for what the engine cannot honour."""
        arch = raw.get("model_type")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise LoadError(path, f"unsupported model_type {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise LoadError(path, f"unsupported hidden_act {act!r}; only silu (SwiGLU) is implemented")
        if raw.get("mlp_bias"):
            raise LoadError(path, "mlp_bias is not supported")
        if arch != "qwen2" and raw.get("attention_bias"):
            # qwen2 always has q/k/v bias and no o bias; elsewhere attention_bias also adds o_proj.bias.
            raise LoadError(path, f"attention_bias is not supported for {arch}")
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            head_dim = int(raw.get("head_dim") or hidden // heads)
            rope_params = raw.get("rope_parameters") or {}
            rope_theta = float(raw.get("rope_theta", rope_params.get("rope_theta", 10000.0)))
            config = cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                attention_bias=arch == "qwen2",
                qk_norm=arch == "qwen3",
                rope_scaling=_rope_scaling(raw, path),
                sliding_window=_sliding_window(raw),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=_as_id_list(raw.get("eos_token_id")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(path, f"config is missing or has a bad value for {exc}") from exc
        if config.num_heads % config.num_kv_heads:
            raise LoadError(path, "num_attention_heads must be a multiple of num_key_value_heads")
        return config


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _sliding_window(raw: dict[str, Any]) -> int | None:
    if raw.get("model_type") == "mistral" or raw.get("use_sliding_window"):
        window = raw.get("sliding_window")
        return int(window) if window else None
    return None


def _rope_scaling(raw: dict[str, Any], path: str | Path) -> RopeScaling | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise LoadError(path, f"unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return None
    return RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
    )
