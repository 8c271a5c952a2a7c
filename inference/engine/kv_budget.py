"""How long a context window fits in memory, and how large a prefix cache, decided before a model's KV cache is
allocated.

The KV pool is preallocated: room for `slots` sequences at the full window, keys and values of every layer, and on
top of it the prefix cache's budget, where finished prompts' blocks stay findable (kv/block_pool.py). A window
asked for (or the model's default) that would not fit next to the weights in the device's free memory is lowered to
the longest one that does, so a load succeeds with a shorter window rather than failing or swapping; the served
`context_window` (and every completion's `usage.kv_cap`) is that effective window. The prefix cache gets what the
operator asks for, or by default the smaller of PREFIX_CACHE_CAP and a PREFIX_CACHE_SHARE of what is left after the
weights, the windows and the reserve: the windows are always guaranteed first, and the default leaves most of the
free memory to the models loaded after this one (each takes its share of what is left then) and to the host. On a
CPU the cache costs memory only as it fills (kv_cache.py zeroes a block when it is first used), like llama.cpp's
host-memory prompt cache (`--cache-ram`).
"""

from __future__ import annotations

import math
from pathlib import Path

import psutil
import torch

from inference.engine.loaders.gguf import read_gguf_config
from inference.engine.loaders.hf import read_hf_config
from inference.engine.loaders.loading import DEFAULT_MAX_CONTEXT, DTYPES, checkpoint_format
from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import expected_hf_shapes

MIN_WINDOW = 16  # below this a model cannot hold a useful prompt: the load fails instead
PREFIX_CACHE_CAP = 4 * 2**30  # the automatic prefix cache's most bytes per model
PREFIX_CACHE_SHARE = 4  # the automatic prefix cache takes at most 1/this of the memory left after the windows


def read_config(path: str | Path) -> ModelConfig:
    """A checkpoint's config, without reading its weights."""
    path = Path(path)
    return read_hf_config(path) if checkpoint_format(path) == "hf" else read_gguf_config(path)


def free_memory(device: str) -> int:
    """Bytes of the device's memory available to a new allocation (host RAM for cpu)."""
    if device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return free
    return psutil.virtual_memory().available


def element_size(dtype: str | None, device: str) -> int:
    if dtype:
        return DTYPES[dtype].itemsize
    return 4 if device == "cpu" else 2  # load_model's defaults: float32 on CPU, bfloat16 on CUDA


def kv_bytes_per_token(config: ModelConfig, element_bytes: int) -> int:
    """Keys plus values of one position in every layer."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element_bytes


def parameter_count(config: ModelConfig) -> int:
    """The model's parameters, a tied output head counted twice: the engine keeps its own copy of it for the final
    matmul."""
    params = sum(math.prod(shape) for shape in expected_hf_shapes(config).values())
    if config.tie_word_embeddings:
        params += config.vocab_size * config.hidden_size
    return params


def weight_bytes_estimate(config: ModelConfig, element_bytes: int) -> int:
    """The weights at `element_bytes` per parameter (an int8 load takes less, so this errs on the safe side)."""
    return parameter_count(config) * element_bytes


def configured_window(config: ModelConfig, requested: int) -> int:
    """The window a load asks for: `requested`, or (0) the model's own limit capped at DEFAULT_MAX_CONTEXT."""
    return requested or min(config.context_limit, DEFAULT_MAX_CONTEXT)


def effective_window(configured: int, per_token: int, slots: int, budget: int) -> int:
    """The longest window up to `configured` whose KV for `slots` sequences fits in `budget` bytes."""
    return max(0, min(configured, budget // max(1, per_token * slots)))


def prefix_cache_bytes(requested: int | None, spare: int) -> int:
    """The prefix cache's bytes, never more than `spare` (free memory left after the weights, the windows and the
    reserve): `requested`, or (None, automatic) the smaller of PREFIX_CACHE_CAP and a PREFIX_CACHE_SHARE of it."""
    spare = max(0, spare)
    if requested is None:
        return min(PREFIX_CACHE_CAP, spare // PREFIX_CACHE_SHARE)
    return min(requested, spare)
