"""The worker: a long-lived process per device that hosts models and runs their schedulers.

The control plane sends requests over one ZMQ DEALER socket (see protocol.py); the loop below polls them, steps
every model's scheduler once, and sends what the steps produced. It blocks on the socket only when no model has
work. Loading runs in a background thread, so a model that loads for a minute does not stall the others, and
heartbeats keep flowing. Chat templating and tokenization happen here, next to the tokenizer; the control plane
learns the prompt's token count from STARTED and receives text pieces in TOKENS.

Run as `python -m inference.engine.worker --endpoint ENDPOINT --device cpu|cuda:N --identity ID`; the supervisor does.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import zmq

from . import protocol as p
from .chat_template import ChatTemplate, TemplateError
from .detokenizer import IncrementalDetokenizer
from .errors import LoadError
from .loading import LoadedModel, load_model
from .sampler import SamplingParams, SequenceSampling
from .scheduler import Scheduler
from .sequence import Sequence

HEARTBEAT_INTERVAL = 0.5  # seconds between HEARTBEATs
BUSY_RETRY_AFTER = 5.0  # seconds a client refused by a full queue is told to wait


class RequestRefused(Exception):
    """A request the worker answers with one ERROR; carries that message."""

    def __init__(self, error: p.Error):
        self.error = error
        super().__init__(error.message)


def chat_prompt_ids(
    model: LoadedModel,
    messages: list[dict[str, Any]],
    *,
    template: ChatTemplate | None = None,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
) -> list[int]:
    """The prompt token ids a chat request becomes: the model's chat template (ChatML when it has none), then the
    tokenizer, adding BOS only when the tokenizer adds one and the template did not already write it."""
    tok = model.tokenizer
    template = template or ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
    text = template.render(messages, tools=tools, enable_thinking=enable_thinking)
    wrote_bos = bool(tok.bos_token) and text.startswith(tok.bos_token)
    return tok.encode(text, add_special_tokens=not wrote_bos)


@dataclass(slots=True)
class HostedModel:
    """A loaded model and its scheduler; `unload` is (call id, deadline) while it drains before unloading."""

    name: str
    model: LoadedModel
    scheduler: Scheduler
    template: ChatTemplate
    unload: tuple[str, float] | None = None
    kv_bytes: int = 0


@dataclass(slots=True)
class PendingLoad:
    request: p.Load
    future: Future
    started: float = field(default_factory=time.monotonic)


class Worker:
    """The loop and its state. Owns the socket it is given; `stop()` may be called from a signal handler."""

    def __init__(self, socket: zmq.Socket, device: str, *, parent_pid: int | None = None):
        self.socket = socket
        self.device = device
        self.parent_pid = parent_pid  # exit when this process is no longer our parent (the control plane died)
        self.models: dict[str, HostedModel] = {}
        self.requests: dict[str, str] = {}  # request id -> model name, for every admitted generation
        self.loads: list[PendingLoad] = []
        self.pauses: list[tuple[str, list[str]]] = []  # PAUSE call id -> models that must drain before PAUSED
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load")
        self.stopping = False
        self.next_heartbeat = 0.0

    def stop(self) -> None:
        self.stopping = True

    def run(self) -> None:
        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.send(p.Ready(self.device, os.getpid(), cuda_devices))
        while not self.stopping:
            # 1) poll input; block only when no model has work to step
            busy = any(h.scheduler.has_work for h in self.models.values())
            self.poll_input(0 if busy else self.idle_timeout())
            # 2) step each model's scheduler
            outputs: list[p.Message] = []
            for hosted in list(self.models.values()):
                if hosted.scheduler.has_work:
                    outputs += self.step(hosted)
            # 3) send outputs
            for message in outputs:
                self.forget_finished(message)
                self.send(message)
            # 4) housekeeping: finished loads, drains, pauses, queue timeouts, heartbeats
            self.housekeeping()
        self.shut_down()

    def idle_timeout(self) -> int:
        """Milliseconds to block waiting for input when idle: until the next heartbeat, shorter while loading or
        draining so their completion is noticed promptly."""
        if self.loads or any(h.unload for h in self.models.values()):
            return 20
        return max(0, int((self.next_heartbeat - time.monotonic()) * 1000))

    def poll_input(self, timeout_ms: int) -> None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return
        while not self.stopping:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.handle(p.decode(frames))
            except p.ProtocolError as exc:
                self.send(p.Error(None, "invalid_request_error", str(exc), status=400))

    def handle(self, message: p.Message) -> None:
        match message:
            case p.Submit():
                try:
                    self.submit(message)
                except RequestRefused as refused:
                    self.send(refused.error)
            case p.Abort(request_id=request_id):
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
                if hosts := self.select(request_id, model):
                    for hosted in hosts:
                        hosted.scheduler.pause()
                    self.pauses.append((request_id, [h.name for h in hosts]))
            case p.Resume(request_id=request_id, model=model):
                if hosts := self.select(request_id, model):
                    for hosted in hosts:
                        hosted.scheduler.resume()
                    self.send(p.Resumed(request_id))
            case p.Shutdown():
                self.stop()
            case _:
                self.send(p.Error(None, "invalid_request_error", f"a worker does not accept {type(message).__name__}"))

    def select(self, request_id: str, model: str | None) -> list[HostedModel] | None:
        """The models a PAUSE/RESUME names (None: all); answers ERROR model_not_found and returns None if unknown."""
        if model is None:
            return list(self.models.values())
        if model not in self.models:
            self.send(p.Error(request_id, "model_not_found", f"model {model!r} is not loaded on this worker", 404))
            return None
        return [self.models[model]]

    # -- generations ---------------------------------------------------------------------------------------------

    def submit(self, req: p.Submit) -> None:
        hosted = self.models.get(req.model)
        if hosted is None or hosted.unload:
            state = "is unloading" if hosted else "is not loaded on this worker"
            raise RequestRefused(p.Error(req.request_id, "model_not_found", f"model {req.model!r} {state}", 404))
        if req.request_id in self.requests:
            raise _invalid(req, f"request id {req.request_id!r} is already in use")
        seq = self.build_sequence(hosted, req)
        if hosted.scheduler.is_full():
            raise RequestRefused(
                p.Error(req.request_id, "server_busy", f"model {req.model!r} is busy; retry shortly", 429,
                        retry_after=BUSY_RETRY_AFTER)
            )  # fmt: skip
        hosted.scheduler.add(seq)
        self.requests[req.request_id] = req.model

    def build_sequence(self, hosted: HostedModel, req: p.Submit) -> Sequence:
        model, window = hosted.model, hosted.scheduler.window
        if req.prompt_token_ids is not None:
            prompt = list(req.prompt_token_ids)
        else:
            try:
                prompt = chat_prompt_ids(
                    model, req.messages or [], template=hosted.template, tools=req.tools,
                    enable_thinking=req.enable_thinking,
                )  # fmt: skip
            except TemplateError as exc:
                raise _invalid(req, str(exc)) from exc
        vocab = model.runner.vocab_size
        if not prompt or any(not 0 <= t < vocab for t in prompt):
            raise _invalid(req, f"the prompt must be a non-empty list of token ids below {vocab}")
        if len(prompt) + 1 > window:
            raise RequestRefused(
                p.Error(req.request_id, "context_over_budget",
                        f"the prompt has {len(prompt)} tokens; the context window is {window} (kv_used "
                        f"{len(prompt)}, kv_cap {window})", 422, kv_used=len(prompt), kv_cap=window)
            )  # fmt: skip
        try:
            params = SamplingParams(**req.sampling)
        except TypeError as exc:
            raise _invalid(req, f"bad sampling parameters: {exc}") from exc
        stop_ids = set(req.stop_token_ids) | (set() if req.ignore_eos else set(model.eos_token_ids))
        return Sequence(
            req.request_id,
            prompt,
            sampling=SequenceSampling(params, vocab),
            detokenizer=IncrementalDetokenizer(model.tokenizer),
            stop_token_ids=stop_ids,
            stop=req.stop,
            max_tokens=max(1, req.max_tokens),
            max_length=window,
        )

    def step(self, hosted: HostedModel) -> list[p.Message]:
        """One scheduler step; a failure in it ends that model's generations with server_error, not the worker."""
        try:
            return hosted.scheduler.step()
        except Exception as exc:  # a CUDA OOM or a bug must not take every other model down with it
            failed = hosted.scheduler.abort_all()
            message = f"generation failed: {type(exc).__name__}: {exc}"
            return [p.Error(s.request_id, "server_error", message, 500) for s in failed]

    def forget_finished(self, message: p.Message) -> None:
        if isinstance(message, p.Finished | p.Error) and message.request_id is not None:
            self.requests.pop(message.request_id, None)

    # -- models --------------------------------------------------------------------------------------------------

    def load(self, req: p.Load) -> None:
        if req.name in self.models or any(pl.request.name == req.name for pl in self.loads):
            self.send(p.Error(req.request_id, "load_failed", f"model {req.name!r} is already loaded", 409))
            return
        self.loads.append(PendingLoad(req, self.loader.submit(self.build_model, req)))

    def build_model(self, req: p.Load) -> HostedModel:
        """Runs in the loader thread: read the checkpoint, build the runner and the scheduler."""
        model = load_model(
            req.path,
            device=self.device,
            dtype=req.dtype,
            quantize=req.quantize,
            max_slots=max(1, req.max_concurrent),
            max_context=req.max_context or None,
        )
        scheduler = Scheduler(
            model.runner,
            model.tokenizer,
            max_concurrent=max(1, req.max_concurrent),
            queue_depth=req.queue_depth,
            queue_timeout=req.queue_timeout,
            prefill_chunk=req.prefill_chunk,
        )
        tok = model.tokenizer
        cache = model.runner.cache
        kv_bytes = sum(t.numel() * t.element_size() for t in [*cache.keys, *cache.values])
        template = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
        return HostedModel(req.name, model, scheduler, template, kv_bytes=kv_bytes)

    def finish_loads(self) -> None:
        for pending in [pl for pl in self.loads if pl.future.done()]:
            self.loads.remove(pending)
            req = pending.request
            try:
                hosted = pending.future.result()
            except Exception as exc:
                self.send(p.Error(req.request_id, "load_failed", _load_problem(exc), _load_status(req, exc)))
                continue
            self.models[req.name] = hosted
            model = hosted.model
            self.send(
                p.Loaded(
                    req.request_id, req.name, str(model.path), model.format, model.config.architecture,
                    str(model.device), str(model.dtype).removeprefix("torch."), model.weight_bytes, hosted.kv_bytes,
                    hosted.scheduler.window, hosted.scheduler.max_concurrent, time.monotonic() - pending.started,
                )
            )  # fmt: skip

    def unload(self, req: p.Unload) -> None:
        hosted = self.models.get(req.name)
        if hosted is None:
            self.send(p.Error(req.request_id, "unload_failed", f"model {req.name!r} is not loaded", 404))
        elif hosted.unload:
            self.send(p.Error(req.request_id, "unload_failed", f"model {req.name!r} is already unloading", 409))
        else:
            hosted.unload = (req.request_id, time.monotonic() + max(0.0, req.drain_timeout))

    def finish_unloads(self) -> None:
        for hosted in [h for h in self.models.values() if h.unload]:
            call_id, deadline = hosted.unload
            scheduler = hosted.scheduler
            if (scheduler.running or scheduler.waiting) and time.monotonic() < deadline:
                continue
            aborted = scheduler.abort_all()
            for seq in aborted:
                self.requests.pop(seq.request_id, None)
                self.send(p.Error(seq.request_id, "model_unloaded", f"model {hosted.name!r} was unloaded", 503))
            del self.models[hosted.name]
            self.free_memory()
            self.send(p.Unloaded(call_id, hosted.name, len(aborted)))

    def free_memory(self) -> None:
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    # -- status and housekeeping ---------------------------------------------------------------------------------

    def status(self, request_id: str) -> p.Status:
        if self.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info(torch.device(self.device))
            used = total - free
        else:
            memory = psutil.virtual_memory()
            total, used = memory.total, memory.total - memory.available
        models = []
        for hosted in self.models.values():
            s = hosted.scheduler
            state = "draining" if hosted.unload else "paused" if s.paused else "ready"
            slots_total = s.runner.max_slots
            models.append(
                p.ModelStatus(
                    hosted.name, str(hosted.model.path), state, hosted.model.weight_bytes, hosted.kv_bytes,
                    len(s.running), slots_total, len(s.running), len(s.waiting), s.max_concurrent, s.window,
                )
            )  # fmt: skip
        return p.Status(request_id, self.device, os.getpid(), total, used, models)

    def housekeeping(self) -> None:
        if self.loads:
            self.finish_loads()
        for hosted in self.models.values():
            for error in hosted.scheduler.expire_waiting():
                self.forget_finished(error)
                self.send(error)
        self.finish_unloads()
        self.finish_pauses()
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + HEARTBEAT_INTERVAL
            self.send(p.Heartbeat(os.getpid()))
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                self.stop()

    def finish_pauses(self) -> None:
        """Answers each PAUSE whose models have no running sequence left (a step boundary: steps are atomic)."""
        for call_id, names in list(self.pauses):
            if not any(self.models[n].scheduler.running for n in names if n in self.models):
                self.pauses.remove((call_id, names))
                self.send(p.Paused(call_id))

    def shut_down(self) -> None:
        for hosted in self.models.values():
            for seq in hosted.scheduler.abort_all():
                self.send(p.Error(seq.request_id, "server_shutting_down", "the worker is shutting down", 503, 1.0))
        self.models.clear()
        self.loader.shutdown(wait=False, cancel_futures=True)

    def send(self, message: p.Message) -> None:
        self.socket.send_multipart(p.encode(message))


def _invalid(req: p.Submit, message: str) -> RequestRefused:
    return RequestRefused(p.Error(req.request_id, "invalid_request_error", message, 400))


def _load_problem(exc: Exception) -> str:
    return str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"


def _load_status(req: p.Load, exc: Exception) -> int:
    if not Path(req.path).exists():
        return 404
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return 507
    if isinstance(exc, ValueError) and not isinstance(exc, LoadError):
        return 400
    return 500


def serve(endpoint: str, device: str, identity: str, *, context: zmq.Context | None = None,
          parent_pid: int | None = None) -> None:  # fmt: skip
    """Connects to the control plane and runs the worker loop until SHUTDOWN (or SIGTERM, in a process)."""
    context = context or zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, identity.encode())
    socket.setsockopt(zmq.SNDHWM, 0)  # never block the loop on a slow control plane: queue instead
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(endpoint)
    worker = Worker(socket, device, parent_pid=parent_pid)
    if parent_pid is not None:
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the control plane's to handle
    try:
        worker.run()
    finally:
        socket.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A Pantheon worker process (started by the supervisor).")
    parser.add_argument("--endpoint", required=True, help="the control plane's ZMQ ROUTER endpoint")
    parser.add_argument("--device", required=True, help="cpu or cuda:N")
    parser.add_argument("--identity", required=True, help="this worker's ZMQ identity")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(args.device))
    serve(args.endpoint, args.device, args.identity, parent_pid=os.getppid())


if __name__ == "__main__":
    main()
