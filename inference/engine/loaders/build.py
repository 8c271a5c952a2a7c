"""`build_model`: Hugging Face-named weights (from either loader) to a ready `Transformer` in the load's form.

The model is built on the meta device and receives its weights with `load_state_dict(assign=True)`, so no memory is
spent on a random init; the checkpoint's tensors are fused into the model's as model/layout.py lays them out.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import expected_hf_shapes, fuse_hf_weights, linear_sources
from inference.engine.model.rope import rope_tables
from inference.engine.model.transformer import Transformer, cpu_linears
from inference.engine.quant.quantize import quantize_linears
from inference.engine.quant.stored_quant import KeepQuantized, keep_quantized, made_from_file
from inference.engine.weights.shared_storage import place_in_arena


def build_model(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    *,
    context_window: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    quantize: bool = False,
    attachable: bool = False,
    keep: KeepQuantized | None = None,
) -> Transformer:
    """Builds the model from Hugging Face-named weights (already checked by the loader), with RoPE up to
    context_window. The linear layers become int8 with `quantize`; on CPU, large float32 ones get oneDNN-packed
    weights and the others are kept transposed.

    `attachable` keeps every weight where another process can map it and in a layout where each Hugging Face
    tensor is a view of what the model computes with (inference/engine/weights): on CPU all of them in one
    shared-memory arena (`model.arena`), with the linear layers left as nn.Linear (slower than the repacked
    ones, which are copies); on CUDA the allocator's own storage is what CUDA IPC shares, so nothing changes.

    `keep` names the Hugging Face weights the checkpoint stores quantized: on CPU in float32, the linear layers
    made of them stay quantized in the form quant/stored_quant.py chooses, and a large quantized embedding table
    stays as the file's rows (quant/stored_embedding.py); what is made from the file's bytes is never asked of
    `tensors` (a GGUF checkpoint decodes each tensor when asked: loaders/gguf.py)."""
    if quantize and attachable:
        raise ValueError("a quantized model cannot be attachable: a trainer writes the float weights")
    with torch.device("meta"):
        model = Transformer(config)
    on_cpu = torch.device(device).type == "cpu"
    sources = linear_sources(config)
    keeps = keep is not None and on_cpu and not attachable and not quantize and dtype == torch.float32
    made = made_from_file(model, sources, keep) if keeps else set()
    from_file = {f"{name}.weight" for name in made}
    keeps_embedding = keeps and keep.keeps_embedding(config.hidden_size)
    if keeps_embedding:
        from_file.add("embed.weight")
    fused = fuse_hf_weights(config, tensors, skip=from_file)
    if attachable and on_cpu:
        model.arena, weights = place_in_arena(fused, dtype)
    else:
        weights = _converted(fused, torch.device(device), dtype)
    del fused
    weights |= {name: model.get_parameter(name) for name in from_file}  # left on the meta device
    model.load_state_dict(weights, assign=True)
    del weights  # so each replaced linear layer below frees its weight
    model.rope_cos, model.rope_sin_signed = rope_tables(config, context_window, torch.device(device))
    model.requires_grad_(False).eval()
    if quantize:
        quantize_linears(model)
        return model
    if keeps:
        rows = {name: shape[0] for name, shape in expected_hf_shapes(config).items()}
        keep_quantized(model, sources, keep, rows)
    if keeps_embedding:
        model.embed = keep.stored_embedding(model, made)
    if on_cpu and not attachable:
        cpu_linears(model, float32=dtype == torch.float32)
    return model


def _converted(fused: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors on the device in the dtype, each source tensor converted once, so tied weights stay one tensor."""
    converted: dict[int, torch.Tensor] = {}
    weights = {}
    for name, tensor in fused.items():
        if id(tensor) not in converted:
            converted[id(tensor)] = tensor.to(device=device, dtype=dtype)
        weights[name] = converted[id(tensor)]
    return weights
