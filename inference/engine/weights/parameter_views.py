"""The served weights under their Hugging Face names, each a view of the storage the engine computes with.

A trainer thinks in Hugging Face parameters; the engine fuses them (q/k/v into one matrix, gate/up into another,
qwen3's q_norm/k_norm repeated per head). In an attachable load every fused tensor is laid out so that each Hugging
Face parameter is a slice of it: a write through a view is a write to the served weights, with no copy to make
afterwards. The one exception is the per-head norm rows: a view can only be one row, so after a write the others
must be brought level with it (`repack`).
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import EMBEDDING, LM_HEAD, ModelTensor, expected_hf_shapes, model_tensors
from inference.engine.model.transformer import Transformer
from inference.engine.weights.shared_storage import SharedArena


class ParameterMismatch(ValueError):
    """Tensors given for the served weights do not fit them: an unknown name or another shape."""


def _weight(model: Transformer, tensor: ModelTensor) -> torch.Tensor:
    """The model's tensor itself (detached); a linear layer's only while it is an nn.Linear's [out, in] weight."""
    if tensor.linear and not isinstance(module := model.get_submodule(tensor.module), nn.Linear):
        name = tensor.parts[0].hf
        raise ValueError(f"{name} is a {type(module).__name__}: only an attachable load keeps [out, in] weights")
    return model.get_parameter(tensor.name).detach()


class ParameterViews:
    """`views`: every Hugging Face parameter of the model by name, each sharing memory with the model's weights.

    `repacked` names the views that stand for several rows of a fused tensor (q_norm, k_norm): write them, then
    call `repack` (copy_in does). `arena` is the shared-memory file of a CPU load (None on CUDA), kept alive here
    as long as the views are.
    """

    def __init__(self, model: Transformer, config: ModelConfig):
        self.config = config
        self.arena: SharedArena | None = model.arena
        self._repeated: list[tuple[torch.Tensor, int, int]] = []  # (fused tensor, first row, rows) of per-head norms
        self.repacked: list[str] = []
        views: dict[str, torch.Tensor] = {}
        for tensor in model_tensors(config):
            if all(part.hf in views for part in tensor.parts):  # a tied lm_head: the embedding's view already
                continue
            fused = _weight(model, tensor)
            if len(tensor.parts) == 1 and not tensor.parts[0].copies:
                views[tensor.parts[0].hf] = fused
                continue
            row = 0
            for part in tensor.parts:
                if part.copies:  # the part's first row stands for all its copies
                    views[part.hf] = fused[row]
                    self._repeated.append((fused, row, part.copies))
                    self.repacked.append(part.hf)
                else:
                    views[part.hf] = fused[row : row + part.rows]
                row += part.rows
        expected = expected_hf_shapes(config)
        self.views = {name: views[name] for name in expected}  # in the order a checkpoint lists them
        wrong = [name for name, view in self.views.items() if tuple(view.shape) != expected[name]]
        if wrong:
            raise ValueError(f"the model's {wrong[0]} does not have the shape its config gives")

    @property
    def layout(self) -> str:
        """ "views" when every parameter is its own region of storage, "views+repack" when some need `repack`."""
        return "views+repack" if self.repacked else "views"

    @torch.no_grad()
    def repack(self) -> None:
        """Copies each per-head norm's written row (the first of its heads) to the other rows of its heads."""
        for fused, row, copies in self._repeated:
            fused[row + 1 : row + copies].copy_(fused[row].expand(copies - 1, -1))

    @torch.no_grad()
    def copy_in(self, tensors: dict[str, torch.Tensor]) -> None:
        """Writes Hugging Face-named tensors into the served weights (converted to their dtype and device), then
        repacks. Every tensor is checked before any is written, so a mismatch (ParameterMismatch) changes nothing.
        With tied embeddings an lm_head.weight may come along (a full state dict) if it equals the embedding."""
        given = dict(tensors)
        if LM_HEAD in given and LM_HEAD not in self.views:
            head = given.pop(LM_HEAD)
            embed = given.get(EMBEDDING, self.views[EMBEDDING])
            if head.shape != embed.shape or not torch.equal(head.to(embed.device, embed.dtype), embed):
                raise ParameterMismatch(f"{LM_HEAD} differs from {EMBEDDING}, but this model ties them")
        for name, tensor in given.items():
            view = self.views.get(name)
            if view is None:
                raise ParameterMismatch(f"{name} is not a parameter of this model")
            if tensor.shape != view.shape:
                raise ParameterMismatch(f"{name} has shape {list(tensor.shape)}, the model's is {list(view.shape)}")
        for name, tensor in given.items():
            self.views[name].copy_(tensor)
        self.repack()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Contiguous CPU copies under Hugging Face names, as a checkpoint stores them (no lm_head when tied)."""
        return {name: view.to("cpu", copy=True).contiguous() for name, view in self.views.items()}
