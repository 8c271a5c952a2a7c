"""Rotary position embedding (RoPE) in the Hugging Face layout, the one place its variant (plain, or Llama-3's
frequency scaling) and theta are read: the model keeps the tables `rope_tables` makes, and every execution of its
forward (eager, compiled, the decode plan and the paged kernel) rotates with those rows."""

from __future__ import annotations

import math

import torch

from inference.engine.model.config import ModelConfig


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE in the Hugging Face layout: dimension i is paired with i + head_dim/2, i.e.
    x * cos + cat(-x2, x1) * sin, written as x * cos + roll(x) * cat(-sin1, sin2): three kernels instead of six."""
    # x: [..., H, hd]; cos, sin_signed: [..., 1, hd]
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), sin_signed)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the head_dim/2 rotation pairs, with Llama-3 scaling when the config asks for it."""
    # returns: [hd/2] float32
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # Llama 3: wavelengths longer than the original context / low_freq_factor are slowed down by `factor`, shorter
    # than original context / high_freq_factor are kept, and those in between are blended linearly.
    wavelen = 2 * math.pi / inv_freq
    original = scaling.original_max_position_embeddings
    slowed = torch.where(wavelen > original / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * slowed / scaling.factor + smooth * slowed
    medium = (wavelen >= original / scaling.high_freq_factor) & (wavelen <= original / scaling.low_freq_factor)
    return torch.where(medium, blended, slowed)


def rope_tables(config: ModelConfig, context_window: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-flipped sin (first half negated, see rotate_half) of every position's angles, in float32."""
    # returns: cos, sin_signed: [context_window, hd]
    angles = torch.outer(torch.arange(context_window, dtype=torch.float32), rope_inv_freq(config))
    sin = angles.sin()
    return torch.cat((angles, angles), dim=-1).cos().to(device), torch.cat((-sin, sin), dim=-1).to(device)
