"""The worker: a long-lived process per device that hosts models and runs their schedulers.

The control plane sends requests over one ZMQ DEALER socket (see contract/messages.py); the loop below polls them,
steps every model's scheduler once, and sends what the steps produced (their results made messages by step_wire.py)
as one STEP_OUTPUTS message. It blocks on the socket only when no model has work. Two kinds of slow work run on
threads of their own, so that neither stalls the other models' steps or the heartbeats that tell the supervisor this
worker lives: loading a model, and preparing a large request (templating and tokenizing a long prompt or long
embeddings inputs, once a cheap bound has refused what cannot fit the context window; checking and copying a large
session blob to restore). What a hosted model does with a request is in hosted_model.py; loading and unloading
one, in worker_models.py.

The process around the loop (its socket, signals and threads) is worker_process.py.
"""

from __future__ import annotations

import gc
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil
import torch
import zmq

from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason
from inference.engine.contract.weights import WeightsCode
from inference.engine.execution.step_threads import StepThreads, apply_step_threads, choose_step_threads
from inference.engine.hosted_model import HostedModel, RequestRefused, refusal
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.sequence_log import SequenceLog
from inference.engine.session_calls import read_restore
from inference.engine.step_wire import wire_messages
from inference.engine.worker_models import ModelLoading, PendingLoad

HEARTBEAT_INTERVAL = 0.5  # default seconds between HEARTBEATs
# A SUBMIT or EMBED whose frame is smaller than this is templated and tokenized on the loop itself: it takes less
# time than handing it to the preparation thread and noticing the result. The frame's size bounds all the text the
# request brings (a prompt, every message and tool, embeddings inputs, a grammar), whatever holds it.
INLINE_PREPARE_BYTES = 16 * 1024
BUSY_POLL_MS = 5  # how long the loop blocks on input while a load or a preparation may finish any moment


Preparable = p.Submit | p.Embed | p.SessionRestore  # what the preparation thread prepares


@dataclass(slots=True)
class PendingPrepare:
    """A SUBMIT whose prompt, or an EMBED whose inputs, are being templated and tokenized on the preparation
    thread; or a SESSION_RESTORE whose blob is being read there."""

    hosted: HostedModel
    request: Preparable
    future: Future


class Worker(ModelLoading):
    """The loop and its state. Owns the socket it is given; `stop()` may be called from a signal handler."""

    def __init__(
        self,
        socket: zmq.Socket,
        device: str,
        *,
        parent_pid: int | None = None,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        threads: int | None = None,
        freeze_heap: bool = False,
    ):
        self.socket = socket
        # A worker that owns its process moves the objects alive at start and after each load (the imports, the
        # models) out of the cyclic collector's reach: they live as long as the worker or their model, and a full
        # collection walking them paused the stepping loop, and so every stream, for longer than a step
        # (docs/performance-log.md). What a step allocates is still collected; free_memory unfreezes an unloaded
        # model's objects before it collects. Off for a worker in a thread of another process (tests).
        self.freeze_heap = freeze_heap
        self.device = device
        self.heartbeat_interval = heartbeat_interval
        self.parent_pid = parent_pid  # exit when this process is no longer our parent (the control plane died)
        self.models: dict[str, HostedModel] = {}
        self.requests: dict[str, str] = {}  # request id -> model name, for every admitted generation
        self.sequences = SequenceLog()  # the log lines about each generation, with its HTTP request's id
        self.loads: list[PendingLoad] = []
        self.pauses: list[tuple[str, list[str]]] = []  # PAUSE call id -> models that must drain before PAUSED
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load")
        self.preparing: dict[str, PendingPrepare] = {}  # request id -> its preparation, in arrival order
        self.preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare")
        self.stopping = False
        self.next_heartbeat = 0.0
        self.threads = threads  # intra-op threads for large CPU models; None: leave torch's setting alone

    def stop(self) -> None:
        self.stopping = True

    def step_models(self) -> list[p.Message]:
        """One step of every model with work. A method of its own, so that no model stays referenced from the
        loop's frame once it is unloaded (its memory would never be freed)."""
        outputs: list[p.Message] = []
        for hosted in list(self.models.values()):
            if hosted.scheduler.has_work:
                outputs += self.step(hosted)
        return outputs

    def run(self) -> None:
        self.freeze()
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.send(p.Ready(device=self.device, pid=os.getpid(), cuda_devices=cuda_devices))
        while not self.stopping:
            # 1) poll input; block only when no model has work to step
            busy = any(h.scheduler.has_work for h in self.models.values())
            self.poll_input(0 if busy else self.idle_timeout())
            # 2) step each model's scheduler, and set the gauges before the step's outputs tell anyone of it
            outputs = self.step_models()
            self.record_occupancy()
            # 3) send the step's outputs, all in one message
            if outputs:
                for message in outputs:
                    self.forget_finished(message)
                self.send(p.StepOutputs(outputs))
            # 4) housekeeping: prepared prompts, loads, drains, pauses, queue timeouts, idle sessions, heartbeats;
            # the gauges again for what it changed (a set happens only when a figure moved)
            self.housekeeping()
            self.record_occupancy()
        self.shut_down()

    def record_occupancy(self) -> None:
        for hosted in self.models.values():
            hosted.record_occupancy()

    def idle_timeout(self) -> int:
        """Milliseconds to block waiting for input when idle: until the next heartbeat, shorter while loading,
        preparing or draining so their completion is noticed promptly."""
        if self.loads or self.preparing or any(h.unload for h in self.models.values()):
            return BUSY_POLL_MS
        deadlines = [self.next_heartbeat]
        deadlines += [d for h in self.models.values() if (d := h.barrier.next_deadline()) is not None]
        return max(0, int((min(deadlines) - time.monotonic()) * 1000))

    def poll_input(self, timeout_ms: int) -> None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return
        while not self.stopping:
            try:
                frame = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = p.decode_to_worker(frame)
            except p.ProtocolError as exc:  # a malformed or mistyped field fails the request it came with
                self.send(p.Error(request_id=exc.request_id, reason=Reason.BAD_REQUEST, message=str(exc)))
                continue
            try:
                self.handle(message, len(frame))
            except Exception as exc:  # answer the one request; a bug in handling it must not end the worker
                failure = f"{type(message).__name__} failed: {type(exc).__name__}: {exc}"
                request_id = getattr(message, "request_id", None)
                self.send(p.Error(request_id=request_id, reason=Reason.INTERNAL, message=failure))

    def handle(self, message: p.Message, size: int = 0) -> None:
        """Answers or starts one message; `size` is its frame's bytes (what a SUBMIT or EMBED may cost to prepare)."""
        match message:
            case p.Submit() | p.Embed():
                self.sequences.submitted(message)
                try:
                    self.submit(message, size)
                except RequestRefused as refused:
                    self.send(refused.error)
            case p.Abort(request_id=request_id):
                self.sequences.aborted(request_id)
                self.preparing.pop(request_id, None)  # its prepared sequence is dropped when it is ready
                name = self.requests.pop(request_id, None)
                if name in self.models:
                    self.models[name].scheduler.abort(request_id)
            case p.Load():
                self.load(message)
            case p.Unload():
                self.unload(message)
            case p.StatusQuery(request_id=request_id):
                self.send(self.status(request_id))
            case p.Pause(request_id=request_id, model=model):
                if (hosts := self.select(request_id, model)) is not None:
                    for hosted in hosts:
                        hosted.scheduler.pause()
                    self.pauses.append((request_id, [h.name for h in hosts]))
            case p.Resume(request_id=request_id, model=model):
                if (hosts := self.select(request_id, model)) is not None:
                    for hosted in hosts:
                        hosted.scheduler.resume()
                    self.send(p.Resumed(request_id=request_id))
            case p.WeightsRequest(request_id=request_id, model=model, call=call):
                hosted = self.models.get(model)
                if hosted is None:
                    message = f"model {model!r} is not loaded on this worker"
                    self.send(
                        p.WeightsRefused(request_id=request_id, code=WeightsCode.MODEL_NOT_LOADED, message=message)
                    )
                else:
                    self.send_all(hosted.barrier.handle(request_id, call))
            case p.SessionExport() | p.SessionRestore() | p.SessionRelease() | p.SessionWatch() | p.SessionList():
                hosted = self.models.get(message.model)
                if hosted is None:
                    problem = f"model {message.model!r} is not loaded on this worker"
                    self.send(p.Error(request_id=message.request_id, reason=Reason.MODEL_NOT_LOADED, message=problem))
                elif isinstance(message, p.SessionRestore) and size >= INLINE_PREPARE_BYTES:
                    self.restore(hosted, message)
                else:
                    self.send(hosted.answer_session_call(message))
            case p.Shutdown():
                self.stop()
            case _:
                message = f"a worker does not accept {type(message).__name__}"
                self.send(p.Error(request_id=None, reason=Reason.BAD_REQUEST, message=message))

    def select(self, request_id: str, model: str | None) -> list[HostedModel] | None:
        """The models a PAUSE/RESUME names (None: all); answers ERROR model_not_loaded and returns None if unknown."""
        if model is None:
            return list(self.models.values())
        if model not in self.models:
            message = f"model {model!r} is not loaded on this worker"
            self.send(p.Error(request_id=request_id, reason=Reason.MODEL_NOT_LOADED, message=message))
            return None
        return [self.models[model]]

    # -- generations ---------------------------------------------------------------------------------------------

    def submit(self, req: p.Submit | p.Embed, size: int) -> None:
        """Checks a SUBMIT or an EMBED cheaply here (an input that cannot fit the window is refused untokenized),
        then prepares it: here when its frame is small, else on the preparation thread (finish_preparations goes
        on with it). Raises RequestRefused."""
        hosted = self.models.get(req.model)
        if hosted is None or hosted.unload:
            state = "is unloading" if hosted else "is not loaded on this worker"
            raise refusal(req.request_id, Reason.MODEL_NOT_LOADED, f"model {req.model!r} {state}")
        if req.request_id in self.requests or req.request_id in self.preparing:
            raise refusal(req.request_id, Reason.BAD_REQUEST, f"request id {req.request_id!r} is already in use")
        if isinstance(req, p.Embed):
            hosted.check_embed_bound(req)
            prepare = hosted.embed_inputs
        else:
            if hosted.barrier.weights_state == "torn":
                message = f"the weights of {req.model!r} are torn; they are restored with POST /api/weights/load"
                raise refusal(req.request_id, Reason.WEIGHTS_TORN, message)
            hosted.check_bound(req)
            prepare = hosted.prepare
        if size < INLINE_PREPARE_BYTES:
            self.prepared(hosted, req, prepare(req))
        else:
            self.preparing[req.request_id] = PendingPrepare(hosted, req, self.preparer.submit(prepare, req))

    def restore(self, hosted: HostedModel, req: p.SessionRestore) -> None:
        """A restore of a large blob: the blob is checked and copied (its checksum, its tensors) on the preparation
        thread, then installed on the loop (finish_preparations). A model without sessions refuses it at once."""
        if hosted.scheduler.sessions is None:
            self.send(hosted.answer_session_call(req))
        else:
            future = self.preparer.submit(read_restore, hosted.model, req)
            self.preparing[req.request_id] = PendingPrepare(hosted, req, future)

    def prepared(self, hosted: HostedModel, req: Preparable, prepared: Any) -> None:
        """Goes on with a prepared request: an EMBED's inputs are embedded (on the loop, between steps), a read
        SESSION_RESTORE is installed, a SUBMIT's sequence is admitted."""
        if isinstance(req, p.Embed):
            self.send(hosted.embed(req, prepared))
        elif isinstance(req, p.SessionRestore):
            self.send(hosted.answer_session_call(req, prepared))
        else:
            hosted.admit(prepared)
            self.requests[prepared.request_id] = hosted.name

    def finish_preparations(self) -> None:
        """Goes on with (or refuses) the requests whose preparation ended; aborted ones are gone from `preparing`."""
        for request_id, pending in list(self.preparing.items()):
            if not pending.future.done():
                continue
            del self.preparing[request_id]
            hosted = pending.hosted
            try:
                prepared = pending.future.result()
                if self.models.get(hosted.name) is not hosted or hosted.unload:
                    raise refusal(request_id, Reason.MODEL_NOT_LOADED, f"model {hosted.name!r} was unloaded")
                self.prepared(hosted, pending.request, prepared)
            except RequestRefused as refused:
                self.send(refused.error)
            except Exception as exc:  # a bug in templating or tokenizing fails this request alone
                message = f"preparing the prompt failed: {type(exc).__name__}: {exc}"
                self.send(p.Error(request_id=request_id, reason=Reason.INTERNAL, message=message))

    def step_threads(self, model: LoadedModel) -> StepThreads | None:
        """The threads a model steps with (step_threads.py; None: torch's setting, left alone)."""
        if self.threads is None or self.device != "cpu":
            return None
        return choose_step_threads(model.config, model.torch_matmuls, self.threads)

    def step(self, hosted: HostedModel) -> list[p.Message]:
        """One scheduler step; a failure in it ends that model's generations (generation_failed), not the worker."""
        if hosted.threads is None:  # chosen once: the choice walks the model's shape
            hosted.threads = self.step_threads(hosted.model)
        if hosted.threads is not None:
            apply_step_threads(hosted.threads)
        try:
            return wire_messages(hosted.scheduler.step())
        except Exception as exc:  # a CUDA OOM or a bug must not take every other model down with it
            failed = hosted.scheduler.abort_all()
            message = f"generation failed: {type(exc).__name__}: {exc}"
            return [p.Error(request_id=s.request_id, reason=Reason.GENERATION_FAILED, message=message) for s in failed]

    def forget_finished(self, message: p.Message) -> None:
        if isinstance(message, p.Finished | p.Error) and message.request_id is not None:
            self.requests.pop(message.request_id, None)

    def run_timers(self) -> None:
        """Queue waits that ran out, idle sessions, the weights barriers' timers. (A method of its own, like
        step_models: housekeeping's frame must hold no model when finish_unloads frees one.)"""
        for hosted in self.models.values():
            for error in wire_messages(hosted.scheduler.expire_waiting()):
                self.forget_finished(error)
                self.send(error)
            if hosted.scheduler.sessions is not None:
                hosted.scheduler.sessions.expire()
        for hosted in self.models.values():
            self.send_all(hosted.barrier.tick())

    def freeze(self) -> None:
        if self.freeze_heap:
            gc.freeze()

    # -- status and housekeeping ---------------------------------------------------------------------------------

    def status(self, request_id: str) -> p.Status:
        if self.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info(torch.device(self.device))
            used = total - free
        else:
            memory = psutil.virtual_memory()
            total, used = memory.total, memory.total - memory.available
        models = [hosted.status() for hosted in self.models.values()]
        return p.Status(
            request_id=request_id,
            device=self.device,
            pid=os.getpid(),
            memory_total=total,
            memory_used=used,
            models=models,
        )

    def housekeeping(self) -> None:
        if self.preparing:
            self.finish_preparations()
        if self.loads:
            self.report_load_progress()
            self.finish_loads()
        self.run_timers()
        self.finish_unloads()
        self.finish_pauses()
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.heartbeat_interval
            self.send(p.Heartbeat(pid=os.getpid()))
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                self.stop()

    def finish_pauses(self) -> None:
        """Answers each PAUSE whose models have no running sequence left (a step boundary: steps are atomic)."""
        for call_id, names in list(self.pauses):
            if not any(self.models[n].scheduler.running for n in names if n in self.models):
                self.pauses.remove((call_id, names))
                self.send(p.Paused(call_id))

    def shut_down(self) -> None:
        aborted = [*self.preparing, *(s.request_id for h in self.models.values() for s in h.scheduler.abort_all())]
        for request_id in aborted:
            message = "the worker is shutting down"
            self.send(p.Error(request_id=request_id, reason=Reason.SHUTTING_DOWN, message=message))
        self.preparing.clear()
        for hosted in self.models.values():
            hosted.close()
        self.models.clear()
        self.loader.shutdown(wait=False, cancel_futures=True)
        self.preparer.shutdown(wait=False, cancel_futures=True)

    def send(self, message: p.Message) -> None:
        self.sequences.sent(message)
        self.socket.send(p.encode(message))

    def send_all(self, messages: list[p.Message]) -> None:
        """Sends what a weights barrier answered or ended (an ERROR for each request it refused)."""
        for message in messages:
            self.forget_finished(message)
            self.send(message)
