"""`load_model`: a path on disk to a ready `ModelRunner` with its tokenizer and stop tokens.

A directory is a Hugging Face checkpoint; a `.gguf` file is a GGUF checkpoint. Both loaders hand over the same thing
(a `ModelConfig` and float32 weights in Hugging Face naming), so everything after reading is one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from inference.engine.contract.checkpoint import NotACheckpoint
from inference.engine.contract.checkpoint import checkpoint_format as contract_checkpoint_format
from inference.engine.errors import LoadError
from inference.engine.loaders.gguf import read_gguf
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.model.config import ModelConfig
from inference.engine.model.runner import ModelRunner
from inference.engine.model.transformer import Transformer
from inference.engine.text.tokenizer import Tokenizer

# A config's max_position_embeddings can be 128k; a KV cache that long for every slot would not fit in memory.
DEFAULT_MAX_CONTEXT = 4096
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class LoadedModel:
    path: Path
    format: str  # "hf" | "gguf"
    config: ModelConfig
    tokenizer: Tokenizer
    runner: ModelRunner
    eos_token_ids: list[int]  # config + generation_config + tokenizer EOS, deduplicated, in that order
    dtype: torch.dtype
    device: torch.device
    weight_bytes: int  # bytes of the weights held on the device, int8 layers at their int8 size


def load_model(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    quantize: bool = False,
    max_concurrent: int = 8,
    context_window: int | None = None,
) -> LoadedModel:
    """Loads a checkpoint. dtype defaults to float32 on CPU and bfloat16 on CUDA; context_window defaults to the
    model's own limit capped at DEFAULT_MAX_CONTEXT, and may not exceed the model's limit."""
    path = Path(path)
    device = torch.device(device)
    dtype = _resolve_dtype(dtype, device)
    fmt = checkpoint_format(path)
    if fmt == "hf":
        checkpoint = read_hf_dir(path)
        config, tensors, extra_eos = checkpoint.config, checkpoint.tensors, checkpoint.generation_eos_ids
        tokenizer = Tokenizer.from_hf_dir(path)
    else:
        checkpoint = read_gguf(path)
        config, tensors, extra_eos = checkpoint.config, checkpoint.tensors, []
        tokenizer = Tokenizer.from_gguf(checkpoint.reader, path)

    context = context_window or min(config.context_limit, DEFAULT_MAX_CONTEXT)
    if context > config.context_limit:
        raise LoadError(path, f"context_window {context} exceeds the model's {config.context_limit}")
    model = Transformer.from_hf_weights(
        config, tensors, context_window=context, device=device, dtype=dtype, quantize=quantize
    )
    del tensors, checkpoint
    eos = [*config.eos_token_ids, *extra_eos]
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    return LoadedModel(
        path=path,
        format=fmt,
        config=config,
        tokenizer=tokenizer,
        runner=ModelRunner(model, max_concurrent=max_concurrent, context_window=context),
        eos_token_ids=list(dict.fromkeys(eos)),
        dtype=dtype,
        device=device,
        weight_bytes=weight_bytes(model),
    )


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
