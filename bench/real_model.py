"""Real model shapes with random weights made where the model runs: the engine's own Transformer, built by the
loaders' `build_model` (the fused q/k/v and gate/up layers serving uses) from Hugging Face-named tensors generated
on the device, so a lent GPU machine needs neither a download nor a 16 GB checkpoint written and read back.

SHAPES holds Llama-3.2-1B's and Qwen3-8B's configurations as the engine reads them from their config.json, and
scaled-down twins with the same switches (tied embeddings and Llama-3 RoPE scaling; untied, per-head q/k norm) for a
CPU. The weights are seeded noise at the scale of a trained model's (std 0.02, norms at 1): their text is noise;
what they measure is bytes and arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.loaders.build import build_model
from inference.engine.loaders.loading import weight_bytes
from inference.engine.model.config import ModelConfig, RopeScaling
from inference.engine.model.layout import expected_hf_shapes
from inference.engine.model.transformer import Transformer


def _llama(**shape) -> ModelConfig:
    """A Llama-3.2 configuration: tied embeddings, Llama-3 RoPE scaling."""
    scaling = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
    return ModelConfig(
        architecture="llama",
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_scaling=scaling,
        **shape,
    )


def _qwen3(**shape) -> ModelConfig:
    """A Qwen3 configuration: untied embeddings, per-head q/k RMSNorm."""
    return ModelConfig(
        architecture="qwen3",
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        qk_norm=True,
        **shape,
    )


SHAPES = {
    "llama-3.2-1b": _llama(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
        head_dim=64,
    ),
    "qwen3-8b": _qwen3(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
        head_dim=128,
    ),
    "tiny-llama": _llama(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
    ),
    "tiny-qwen3": _qwen3(
        vocab_size=640, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32
    ),
}  # fmt: skip


@dataclass(slots=True)
class RandomModel:
    """A built model and the byte counts its bounds are made of."""

    name: str
    model: Transformer
    config: ModelConfig
    dtype: torch.dtype
    weight_bytes: int  # every weight, each shared tensor once
    streamed_bytes: int  # what a decode step reads: all but the embedding table (it reads B rows of it), unless the
    # output head reads that very table (tied embeddings; on a CPU the head keeps a copy of its own)

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one position holds in every layer (the pool is in the model's dtype)."""
        config = self.config
        return config.num_layers * 2 * config.num_kv_heads * config.head_dim * self.dtype.itemsize

    def summary(self) -> dict:
        """What a reader needs to recompute the rows' bounds: the shape, the dtype and the bytes."""
        config = self.config
        return {
            "kind": "model",
            "model": self.name,
            "dtype": str(self.dtype).removeprefix("torch."),
            "layers": config.num_layers,
            "hidden": config.hidden_size,
            "heads": config.num_heads,
            "kv_heads": config.num_kv_heads,
            "head_dim": config.head_dim,
            "ffn": config.intermediate_size,
            "vocab": config.vocab_size,
            "weight_bytes": self.weight_bytes,
            "streamed_bytes": self.streamed_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token(),
        }


def random_tensors(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor the model needs, by Hugging Face name, generated on `device`: norms at 1, the rest N(0, 0.02)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in expected_hf_shapes(config).items():
        if len(shape) == 1:
            tensors[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            tensors[name] = torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(0.02)
    return tensors


def build_random(name: str, device: torch.device, dtype: torch.dtype, positions: int, seed: int = 0) -> RandomModel:
    """SHAPES[name] with random weights on `device`, RoPE tables for `positions` positions. The Hugging Face parts of
    the fused layers are freed once fused (no reference to them outlives build_model)."""
    config = SHAPES[name]
    model = build_model(
        config, random_tensors(config, device, dtype, seed), context_window=positions, device=device, dtype=dtype
    )
    total, embedding = weight_bytes(model), model.embed.weight
    others = {p.untyped_storage().data_ptr() for n, p in model.named_parameters() if n != "embed.weight"}
    head_reads_it = embedding.untyped_storage().data_ptr() in others  # tied, and the head kept the table (CUDA)
    streamed = total if head_reads_it else total - embedding.numel() * embedding.element_size()
    return RandomModel(name, model, config, dtype, total, streamed)
