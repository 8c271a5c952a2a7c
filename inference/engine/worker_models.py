"""Loading and unloading models on the worker: a load runs on the loader thread while the loop goes on (its progress
reported as it reads, its answer sent once its decode buckets are captured); an unload drains the model's
generations, for up to the call's drain timeout, then frees the model between two loop turns.

`ModelLoading` is part of `Worker` (worker.py), kept apart so the loop's file stays about the loop; it uses the
worker's `models`, `requests`, `loads`, `loader`, `device`, `freeze_heap`, `send`, `send_all`, `freeze` and
`step_threads`.
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from inference.engine.contract import messages as p
from inference.engine.contract.checkpoint import NotACheckpoint
from inference.engine.contract.reasons import Reason
from inference.engine.errors import LoadError
from inference.engine.hosted_model import HostedModel
from inference.engine.loaders.loading import return_freed_memory
from inference.engine.loaders.progress import ReadProgress
from inference.engine.weights.barrier import WeightsBarrier
from inference.engine.weights.served_weights import ServedWeights

LOAD_PROGRESS_INTERVAL = 0.2  # at most this often, seconds, a running load's LOAD_PROGRESS is sent


@dataclass(slots=True)
class PendingLoad:
    request: p.Load
    future: Future
    progress: ReadProgress
    started: float = field(default_factory=time.monotonic)
    unload_call: str | None = None  # an UNLOAD that arrived meanwhile: drop the model when it is ready
    reported: tuple[int, int, int, int] = (0, 0, 0, 0)  # the counts the last LOAD_PROGRESS carried
    reported_at: float = 0.0


class ModelLoading:
    """The worker's loads and unloads (see the module's docstring)."""

    def load(self, req: p.Load) -> None:
        if req.name in self.models or any(pl.request.name == req.name and not pl.unload_call for pl in self.loads):
            message = f"model {req.name!r} is already loaded"
            self.send(p.Error(request_id=req.request_id, reason=Reason.ALREADY_LOADED, message=message))
            return
        progress = ReadProgress()
        future = self.loader.submit(HostedModel.load, req, self.device, progress, self.step_threads)
        self.loads.append(PendingLoad(req, future, progress))

    def report_load_progress(self) -> None:
        """LOAD_PROGRESS for each running load whose counts moved since the last one it sent."""
        now = time.monotonic()
        for pending in self.loads:
            counts = pending.progress.counts()
            if counts != pending.reported and now - pending.reported_at >= LOAD_PROGRESS_INTERVAL:
                pending.reported, pending.reported_at = counts, now
                tensors_read, tensors_total, bytes_read, bytes_total = counts
                self.send(p.LoadProgress(name=pending.request.name, tensors_read=tensors_read,
                                         tensors_total=tensors_total, bytes_read=bytes_read,
                                         bytes_total=bytes_total))  # fmt: skip

    def finish_loads(self) -> None:
        """Answers each load whose thread ended, once the loop has captured the decode step's buckets it left (one
        per loop turn, between the other models' steps)."""
        for pending in [pl for pl in self.loads if pl.future.done()]:
            loaded = pending.future.exception() is None and not pending.unload_call
            if loaded and pending.future.result().warm_up_next():
                continue
            self.loads.remove(pending)
            req = pending.request
            try:
                hosted = pending.future.result()
            except Exception as exc:
                self.send(p.Error(request_id=req.request_id, reason=_load_reason(exc), message=_load_problem(exc)))
                continue
            if pending.unload_call:  # dropped here; freed with the last reference to it
                hosted.close()
                message = f"model {req.name!r} was unloaded while loading"
                self.send(p.Error(request_id=req.request_id, reason=Reason.UNLOADED_WHILE_LOADING, message=message))
                self.send(p.Unloaded(request_id=pending.unload_call, name=req.name, aborted=0))
                continue
            hosted.barrier = WeightsBarrier(
                ServedWeights(hosted, attachable_load=req.limits.attachable),
                req.limits.weights_timers,
                self.loader,
                metrics=hosted.scheduler.metrics,
            )
            if req.checkpoint is not None:
                hosted.barrier.serve_checkpoint(req.checkpoint)
            self.models[req.name] = hosted
            hosted.record_occupancy()
            self.freeze()
            self.send(hosted.loaded(req, pending.started))

    def unload(self, req: p.Unload) -> None:
        hosted = self.models.get(req.name)
        loading = next((pl for pl in self.loads if pl.request.name == req.name and not pl.unload_call), None)
        if loading:
            loading.unload_call = req.request_id
        elif hosted is None:
            message = f"model {req.name!r} is not loaded"
            self.send(p.Error(request_id=req.request_id, reason=Reason.NOT_LOADED, message=message))
        elif hosted.unload:
            message = f"model {req.name!r} is already unloading"
            self.send(p.Error(request_id=req.request_id, reason=Reason.ALREADY_UNLOADING, message=message))
        else:
            hosted.unload, hosted.deadline = req, time.monotonic() + max(0.0, req.drain_timeout)

    def finish_unloads(self) -> None:
        ended = [self.end_unload(hosted) for hosted in [h for h in self.models.values() if h.unload]]
        if replies := [reply for reply in ended if reply is not None]:
            # Here, where no frame holds an unloaded model any more: a model is a reference cycle (its barrier
            # points back at it), so only a collection frees its weights and KV pool; then the UNLOADED replies.
            self.free_memory()
            self.send_all(replies)

    def end_unload(self, hosted: HostedModel) -> p.Unloaded | None:
        """Ends an unload whose drain is over (its UNLOADED reply, to send once the model is freed), refuses one
        that timed out without `force`, or waits (None for both)."""
        call, scheduler = hosted.unload, hosted.scheduler
        if (scheduler.running or scheduler.waiting) and time.monotonic() < hosted.deadline:
            return None
        if (scheduler.running or scheduler.waiting) and not call.force:
            hosted.unload = None
            message = f"model {hosted.name!r} still has generations running after {call.drain_timeout:g} s"
            self.send(p.Error(request_id=call.request_id, reason=Reason.DRAIN_TIMEOUT, message=message))
            return None
        aborted = scheduler.abort_all()
        message = f"model {hosted.name!r} was unloaded"
        for seq in aborted:
            self.requests.pop(seq.request_id, None)
            self.send(p.Error(request_id=seq.request_id, reason=Reason.MODEL_UNLOADED, message=message))
        del self.models[hosted.name]
        hosted.close()
        if scheduler.metrics is not None:
            scheduler.metrics.unloaded()
        return p.Unloaded(request_id=call.request_id, name=hosted.name, aborted=len(aborted))

    def free_memory(self) -> None:
        """After an unload: the model's memory goes back to the device, and on the host to the operating system."""
        if self.freeze_heap:
            gc.unfreeze()  # the unloaded model's objects were frozen with it: collectable again
        gc.collect()
        self.freeze()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        return_freed_memory()


def _load_problem(exc: Exception) -> str:
    return str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"


def _load_reason(exc: Exception) -> Reason:
    if isinstance(exc.__cause__, NotACheckpoint):  # what the contract's sniffer said of the path
        return Reason.CHECKPOINT_NOT_FOUND if exc.__cause__.reason == "not_found" else Reason.BAD_CHECKPOINT
    if isinstance(exc, FileNotFoundError):
        return Reason.CHECKPOINT_NOT_FOUND
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return Reason.OUT_OF_MEMORY
    if isinstance(exc, ValueError):  # options the checkpoint cannot honour
        return Reason.BAD_CHECKPOINT
    return Reason.LOAD_FAILED
