"""What the weights barrier does to a hosted model: pause its scheduler, drop its caches, export its parameters,
save and load them (the `BarrierHost` of barrier.py, over a HostedModel).

Everything here runs on the worker's loop except `save`, `read_checkpoint` and `write_weights`, which the barrier
runs on the worker's load thread (file I/O and copies of every parameter).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from inference.engine.contract import messages as p
from inference.engine.contract.checkpoint import CheckpointCorrupt
from inference.engine.contract.reasons import Reason
from inference.engine.contract.weights import LoadTarget, SaveRequest, WeightsCode
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.weights.barrier_state import Refusal, ShapeMismatch
from inference.engine.weights.checkpoint_files import (
    CheckpointExists,
    DiskFull,
    read_weights,
    save_checkpoint,
    verify_checkpoint,
)
from inference.engine.weights.handles import export_handles

if TYPE_CHECKING:
    from inference.engine.hosted_model import HostedModel


# The dtypes a trainer may attach to, on the CPU and on CUDA.
CPU_DTYPES = (torch.float32,)
CUDA_DTYPES = (torch.float16, torch.bfloat16)


def attach_refusal(model: LoadedModel, *, attachable_load: bool) -> str | None:
    """Why a trainer may not attach to `model`, as the spec's NOT_ATTACHABLE reason, or None when it may.

    `attachable_load` is whether the load was asked to be attachable. A model split across ranks is refused
    ("tensor_parallel"): a trainer attaches to one process's tensors, and each rank holds only a part of them.
    Only the reasons the weights themselves decide are answered here; whether serving can be paused is the
    barrier's to say.
    """
    if model.split is not None:
        return "tensor_parallel"
    if model.format == "gguf":
        return "gguf"
    if model.quantized:
        return "quantized"
    if model.dtype not in (CPU_DTYPES if model.device.type == "cpu" else CUDA_DTYPES):
        return "dtype"
    if not attachable_load or model.parameters is None:
        return "allocator"
    return None


class ServedWeights:
    """The barrier's view of one hosted model."""

    def __init__(self, hosted: HostedModel, *, attachable_load: bool):
        self.hosted = hosted
        self.name = hosted.name
        self.served_name = hosted.served_name
        self.attachable_load = attachable_load

    @property
    def _scheduler(self):
        return self.hosted.scheduler

    def pause(self) -> None:
        self._scheduler.pause()

    def resume(self) -> None:
        self._scheduler.resume()

    def running(self) -> int:
        return len(self._scheduler.running)

    def waiting(self) -> int:
        return self._scheduler.num_waiting()

    def queue_full(self) -> bool:
        return self._scheduler.is_full()

    def forward_steps(self) -> int:
        return self._scheduler.forward_steps

    def drop_caches(self) -> None:
        """Forgets every KV computed on the weights as they were: the sessions' conversations and cached prefixes."""
        sessions = self._scheduler.sessions
        if sessions is not None:
            for session_id in list(sessions.sessions):
                sessions.release(session_id)
        self.hosted.model.runner.cache.forget_prefixes()

    def weights_written(self) -> None:
        """The parameters changed in place: rebuild what the engine derives from them, drop the caches computed on
        the old values, and give the weights a new version (an exported session no longer restores)."""
        model = self.hosted.model
        if model.parameters is not None:
            model.parameters.repack()
        digest = hashlib.blake2b(f"{model.weights_version}\0written".encode(), digest_size=8).digest()
        model.weights_version = int.from_bytes(digest, "little", signed=True)
        self.drop_caches()

    def refuse_waiting(self, message: str) -> list[p.Message]:
        """Ends every request waiting for the barrier with weights_torn."""
        scheduler = self._scheduler
        waiting = list(scheduler.waiting)
        for seq in waiting:
            scheduler.abort(seq.request_id)
        return [p.Error(request_id=s.request_id, reason=Reason.WEIGHTS_TORN, message=message) for s in waiting]

    def attach_refusal(self) -> str | None:
        return attach_refusal(self.hosted.model, attachable_load=self.attachable_load)

    def layout(self) -> str | None:
        views = self.hosted.model.parameters
        return None if views is None else views.layout

    def export(self) -> dict[str, Any]:
        exported = export_handles(self._views())
        return {**exported, "config": self._config()}

    def _views(self):
        views = self.hosted.model.parameters
        if views is None:
            raise Refusal(WeightsCode.NOT_ATTACHABLE, f"model {self.name!r} was not loaded attachable", "allocator")
        return views

    def _config(self) -> dict[str, Any] | None:
        """The architecture config exactly as loaded: the checkpoint's config.json (None for a GGUF file)."""
        file = Path(self.hosted.model.path) / "config.json"
        return json.loads(file.read_text()) if file.is_file() else None

    def save(self, request: SaveRequest, parent: str | None, base_name: str) -> dict[str, Any]:
        model = self.hosted.model
        source = Path(model.path)
        try:
            return save_checkpoint(
                self._views(),
                source_dir=source if source.is_dir() else source.parent,
                root=Path(request.root),
                run_id=request.run_id,
                step=int(request.step),
                parent=parent,
                base_model=base_name,
            )
        except CheckpointExists as exc:
            raise Refusal(
                WeightsCode.CHECKPOINT_EXISTS,
                f"step {request.step} of run {request.run_id!r} is saved already; give another step",
            ) from exc
        except DiskFull as exc:
            raise Refusal(WeightsCode.SAVE_FAILED, exc.strerror, "disk_full") from exc

    def read_checkpoint(self, target: LoadTarget) -> dict[str, torch.Tensor]:
        """The tensors to write, checked before anything is touched: the manifest's sha256 (a checkpoint), then
        every name and shape against the resident parameters."""
        views = self._views()
        path = Path(target.path)
        if target.verify:
            try:
                verify_checkpoint(path)
            except CheckpointCorrupt as exc:
                raise Refusal(WeightsCode.CHECKPOINT_CORRUPT, str(exc)) from exc
        tensors = read_weights(path)
        for name, tensor in tensors.items():
            view = views.views.get(name)
            if view is None or tuple(view.shape) != tuple(tensor.shape):
                raise ShapeMismatch(f"{path}: {name} does not fit the resident parameters of {self.name!r}")
        return tensors

    def write_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        self._views().copy_in(tensors)
