"""The control plane's client for the workers: submit generations and stream them back, load, unload, status, and
the calls on one model's worker (sessions, embeddings, weights: worker_calls.py). What its callers hold of it (the
protocol, placements, worker links) is in client_protocol.py.

One asyncio ROUTER socket talks to every worker (each worker's DEALER connects with its own identity), and every
request is multiplexed by its request id. The hot path per generation is one SUBMIT out and one asyncio queue fed
by the receive task; nothing here touches the database or Django.

Tokenization and chat templating happen in the worker, which holds the tokenizer: `generate()` sends a SUBMIT the
caller built and returns once the worker admitted the request (STARTED: prompt token count, window), or raises the
refusal as an `EngineError` carrying the worker's reason (prompt_too_long, queue_full, ...), so a route can still
choose its HTTP status (inference/services/refusals.py); then the `Generation` yields TOKENS (token ids, text piece,
logprobs) and ends with FINISHED (finish_reason, usage).

A worker that dies ends every generation and call on it with `WorkerDied`, as soon as whoever runs the workers
reports it (`worker_lost`): the supervisor for processes (inference/runtime/supervisor.py), `InProcessEngineClient`
(in_process_client.py) for the worker threads it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time

import msgspec
import zmq
import zmq.asyncio

from inference.engine.contract import messages as p
from inference.engine.contract.io_threads import batch_io_threads
from inference.engine.contract.logs import request_id_var
from inference.engine.contract.params import LoadOptions, ServingLimits
from inference.engine.contract.reasons import Reason
from inference.engine.contract.weights import ServedCheckpoint
from inference.runtime.client_protocol import ModelPlacement, WorkerLink
from inference.runtime.generation import EngineError, Generation, WorkerDied
from inference.runtime.worker_calls import WorkerCalls, new_id

logger = logging.getLogger("pantheon.engine_client")


class ZmqEngineClient(WorkerCalls):
    """The engine client over ZMQ. Workers connect to `endpoint` (ipc in a private temporary folder by default)
    and announce themselves with READY; whoever starts them reports their death with `worker_lost`."""

    def __init__(self, endpoint: str | None = None, *, context: zmq.asyncio.Context | None = None):
        self._tmpdir = None if endpoint else tempfile.mkdtemp(prefix="pantheon-")
        self.endpoint = endpoint or f"ipc://{self._tmpdir}/workers.sock"
        self._context = context or batch_io_threads(zmq.asyncio.Context.instance())
        self._socket: zmq.asyncio.Socket | None = None
        self._receiver: asyncio.Task | None = None
        self._workers: dict[str, WorkerLink] = {}
        self._by_identity: dict[bytes, WorkerLink] = {}
        self._ready_waiters: dict[str, list[asyncio.Future]] = {}
        self._streams: dict[str, tuple[str, asyncio.Queue]] = {}  # request id -> (device, events)
        self._calls: dict[str, tuple[str, asyncio.Future]] = {}  # call id -> (device, reply)
        self._models: dict[str, ModelPlacement] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        socket = self._context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone worker fails instead of vanishing
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(self.endpoint)
        self._socket = socket
        self._receiver = asyncio.create_task(self._receive(), name="engine-client-receive")

    async def close(self) -> None:
        for device in list(self._workers):
            self.worker_lost(device, "the engine client closed")
        if self._receiver:
            self._receiver.cancel()
            await asyncio.gather(self._receiver, return_exceptions=True)
        if self._socket:
            self._socket.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # -- workers --------------------------------------------------------------------------------------------------

    def workers(self) -> dict[str, WorkerLink]:
        return dict(self._workers)

    async def wait_for_worker(self, device: str) -> WorkerLink:
        """Waits until a worker for `device` has sent READY (wrap in a timeout)."""
        if device in self._workers:
            return self._workers[device]
        future = asyncio.get_running_loop().create_future()
        self._ready_waiters.setdefault(device, []).append(future)
        return await future

    def worker_lost(self, device: str, reason: str) -> list[ModelPlacement]:
        """Ends everything in flight on that device's worker with WorkerDied; returns the models it held, now in
        state "reloading", for whoever restarts it to reload. Loads and unloads in progress are dropped."""
        link = self._workers.pop(device, None)
        if link:
            self._by_identity.pop(link.identity, None)
        message = f"the worker on {device} died: {reason}"
        for request_id, (dev, queue) in list(self._streams.items()):
            if dev == device:
                del self._streams[request_id]
                queue.put_nowait(WorkerDied(message))
        for dev, future in self._calls.values():
            if dev == device and not future.done():
                future.set_exception(WorkerDied(message))
        reload = []
        for name, placement in list(self._models.items()):
            if placement.device != device:
                continue
            if placement.state in ("ready", "reloading"):
                placement.state = "reloading"
                reload.append(placement)
            else:
                del self._models[name]
        return reload

    # -- models ---------------------------------------------------------------------------------------------------

    def models(self) -> dict[str, ModelPlacement]:
        """Every model the engine holds or is loading, by placement key (a replica's own name on its worker)."""
        return dict(self._models)

    async def load(
        self,
        name: str,
        path: str,
        *,
        options: LoadOptions = LoadOptions(),
        limits: ServingLimits = ServingLimits(),
        device: str | None = None,
        timeout: float | None = None,
        checkpoint: ServedCheckpoint | None = None,
        served_name: str = "",
    ) -> p.Loaded:
        """Loads a checkpoint on `device` (default: a GPU worker with the fewest models, else cpu) with the
        operator's `options`, served within `limits`; `checkpoint` when `path` is a trainer's saved checkpoint the
        weights answer as. `name` is the placement's key (its worker's name for it), `served_name` the name clients
        use (default: `name`; a replica's key differs from it). Raises EngineError (a load reason) or WorkerDied."""
        if name in self._models:
            state = self._models[name].state
            message = f"model {name!r} is already {'loaded' if state == 'ready' else state}"
            raise EngineError(message, Reason.ALREADY_LOADED)
        device = device or self._default_device()
        if device not in self._workers:
            raise EngineError(f"no worker runs on device {device!r}", Reason.NO_WORKER)
        load = p.Load(request_id=new_id(), name=name, path=str(path), options=options, limits=limits,
                      checkpoint=checkpoint, served_name=served_name)  # fmt: skip
        placement = ModelPlacement(name, device, "loading", load, served_name=served_name)
        self._models[name] = placement
        return await self._load(placement, timeout)

    def serve_weights_from(self, name: str, path: str, checkpoint: ServedCheckpoint | None) -> None:
        """The weights of `name` were written in place from `path` (POST /api/weights/load, or a save): a reload
        after a crash loads those, not the files it was first loaded from."""
        placement = self._models.get(name)
        if placement is not None:
            placement.load = msgspec.structs.replace(placement.load, path=path, checkpoint=checkpoint)

    async def reload(self, name: str, *, timeout: float | None = None) -> p.Loaded:
        """Loads a "reloading" model again, with the options it was first loaded with."""
        placement = self._models[name]
        placement.load = msgspec.structs.replace(placement.load, request_id=new_id())
        return await self._load(placement, timeout)

    async def _load(self, placement: ModelPlacement, timeout: float | None) -> p.Loaded:
        try:
            info = await self._call(placement.device, placement.load, timeout)
        except WorkerDied:
            raise
        except BaseException as exc:
            if self._models.get(placement.name) is placement:
                del self._models[placement.name]
            if isinstance(exc, EngineError):  # the worker refused: nothing was loaded
                raise
            # Timed out or cancelled: have the worker drop the model when its load ends, so the name stays free.
            with contextlib.suppress(WorkerDied):
                self._send(placement.device, p.Unload(request_id=new_id(), name=placement.name, drain_timeout=0.0))
            if isinstance(exc, TimeoutError):
                message = f"{placement.name!r} did not load within {timeout:g} s"
                raise EngineError(message, Reason.LOAD_TIMEOUT) from exc
            raise
        placement.info, placement.state, placement.weights = info, "ready", info.weights
        placement.load_progress = None
        if placement.loaded_at is None:
            placement.loaded_at = time.time()
        return info

    async def unload(self, name: str, *, drain_timeout: float = 30.0, force: bool = True) -> p.Unloaded:
        """Stops routing to the model, lets its generations finish for up to `drain_timeout` s, frees it. At the
        deadline the generations still running end with EngineError(model_unloaded) when `force`; otherwise the
        unload is called off with EngineError(drain_timeout) and the model stays. Raises EngineError (not_loaded,
        load_in_progress, already_unloading) for a model that is not loaded or not in a state to unload."""
        placement = self._models.get(name)
        if placement is None:
            raise EngineError(f"model {name!r} is not loaded", Reason.NOT_LOADED)
        if placement.state == "loading":
            raise EngineError(f"model {name!r} is loading", Reason.LOAD_IN_PROGRESS)
        if placement.state == "unloading":
            raise EngineError(f"model {name!r} is unloading", Reason.ALREADY_UNLOADING)
        if placement.state == "reloading":  # its worker is gone; just do not bring it back
            del self._models[name]
            return p.Unloaded(request_id="", name=name, aborted=0)
        placement.state = "unloading"
        call = p.Unload(request_id=new_id(), name=name, drain_timeout=drain_timeout, force=force)
        try:
            reply = await self._call(placement.device, call, drain_timeout + 60)
        except WorkerDied:
            reply = p.Unloaded(request_id=call.request_id, name=name, aborted=0)
        except BaseException:
            placement.state = "ready"
            raise
        self._models.pop(name, None)
        return reply

    # -- generations ----------------------------------------------------------------------------------------------

    async def generate(self, submit: p.Submit) -> Generation:
        """Submits a generation to the worker holding `submit.model` (its exact served name) and waits for its
        admission. Raises EngineError (model_not_loaded, prompt_too_long, queue_full, bad_request, weights_held for
        a batch-priority one while a trainer holds the weights, ...) or WorkerDied (worker_died, model_reloading);
        cancelling the awaiting task aborts the request."""
        model = submit.model
        placement = self._models.get(model)
        if placement is None or placement.state in ("loading", "unloading"):
            state = placement.state if placement else "not loaded"
            raise EngineError(f"model {model!r} is {state}", Reason.MODEL_NOT_LOADED)
        if placement.state == "reloading":
            message = f"the worker holding {model!r} crashed; the model is being reloaded"
            raise WorkerDied(message, Reason.MODEL_RELOADING)
        if submit.priority == "batch" and (held := placement.weights_held()) is not None:
            raise EngineError(f"the weights of {model!r} are held ({held}); batch work waits", Reason.WEIGHTS_HELD)
        return await self.submit(placement.device, submit)

    async def submit(self, device: str, submit: p.Submit) -> Generation:
        """Sends a SUBMIT to `device`'s worker and waits for its admission (what `generate` does once it has placed
        the request). Every refusal reaches this request, even one for a frame the worker could not read. A worker
        that dies before admitting the request produced nothing for it: that is model_reloading (retry), not the
        worker_died of a generation cut short. The SUBMIT carries the id of the HTTP request this task serves, if
        any (the worker's log lines about the sequence carry it)."""
        if submit.http_request_id is None and (http_request_id := request_id_var.get()) is not None:
            submit = msgspec.structs.replace(submit, http_request_id=http_request_id)
        request_id = submit.request_id
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (device, queue)
        try:
            self._send(device, submit)
            first = await queue.get()
        except BaseException as exc:
            self.abort(request_id)
            if isinstance(exc, WorkerDied):
                raise _not_started(exc) from exc
            raise
        if isinstance(first, WorkerDied):
            raise _not_started(first)
        if isinstance(first, BaseException):
            raise first
        return Generation(request_id, first, queue, self.abort)

    def abort(self, request_id: str) -> None:
        """Aborts a generation (its worker frees the KV slot at once); unknown or ended ids are ignored."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            try:
                self._send(stream[0], p.Abort(request_id=request_id))
            except WorkerDied:
                pass

    # -- status and pausing ---------------------------------------------------------------------------------------

    async def status(self, timeout: float = 10.0) -> list[p.Status]:
        """Each live worker's models, memory and queues."""
        replies = await asyncio.gather(
            *(self._call(device, p.StatusQuery(request_id=new_id()), timeout) for device in self._workers),
            return_exceptions=True,
        )
        return [r for r in replies if isinstance(r, p.Status)]

    async def pause(self, model: str, timeout: float | None = None) -> None:
        """Stops admitting to `model` and returns once none of its sequences runs (a step boundary)."""
        await self._call(self._device_of(model), p.Pause(request_id=new_id(), model=model), timeout)

    async def resume(self, model: str) -> None:
        await self._call(self._device_of(model), p.Resume(request_id=new_id(), model=model), 10.0)

    # -- transport ------------------------------------------------------------------------------------------------

    def _default_device(self) -> str:
        gpus = [d for d in self._workers if d.startswith("cuda")]
        if gpus:
            return min(gpus, key=lambda d: sum(pl.device == d for pl in self._models.values()))
        return "cpu"

    async def _call(self, device: str, message: p.Message, timeout: float | None) -> p.Message:
        future = asyncio.get_running_loop().create_future()
        self._calls[message.request_id] = (device, future)
        try:
            self._send(device, message)
            return await asyncio.wait_for(future, timeout)
        finally:
            self._calls.pop(message.request_id, None)

    def _send(self, device: str, message: p.Message) -> None:
        """Queues a message to a worker without awaiting (sends on this socket never block: no high-water mark)."""
        link = self._workers.get(device)
        if link is None or self._socket is None:
            raise WorkerDied(f"no live worker on {device}")
        sent = self._socket.send_multipart([link.identity, p.encode(message)])
        if sent.done() and sent.exception() is not None:
            raise WorkerDied(f"the worker on {device} cannot be reached: {sent.exception()}")

    async def _receive(self) -> None:
        while True:
            identity, frame = await self._socket.recv_multipart()
            try:
                message = p.decode_from_worker(frame)
            except Exception:  # one bad message must not stop every stream
                logger.exception("dropped a message from worker %r", identity)
                continue
            # A worker step's outputs come as one message: handle each as if it had come alone.
            for each in message.messages if isinstance(message, p.StepOutputs) else (message,):
                try:
                    self._dispatch(identity, each)
                except Exception:
                    logger.exception("dropped a message from worker %r", identity)

    def _dispatch(self, identity: bytes, message: p.Message) -> None:
        if isinstance(message, p.Ready):
            self._register(identity, message)
            return
        link = self._by_identity.get(identity)
        if link is None:  # a worker already declared dead; whatever it still says is moot
            return
        link.last_seen, link.last_seen_wall = time.monotonic(), time.time()
        match message:
            case p.Heartbeat():
                pass
            case p.WeightsChanged(snapshot=snapshot):
                self._note_weights(snapshot)
            case p.LoadProgress(name=name):
                placement = self._models.get(name)
                if placement is not None and placement.state in {"loading", "reloading"}:
                    placement.load_progress = message
            case p.Started() | p.Tokens() | p.Finished():
                stream = self._streams.get(message.request_id)
                if stream:
                    stream[1].put_nowait(message)
                    if isinstance(message, p.Finished):
                        del self._streams[message.request_id]
            case p.Error(request_id=request_id):
                error = EngineError.from_error(message)
                if request_id in self._streams:
                    self._streams.pop(request_id)[1].put_nowait(error)
                elif request_id in self._calls and not self._calls[request_id][1].done():
                    self._calls[request_id][1].set_exception(error)
                else:
                    logger.warning("worker %s: %s: %s", link.device, message.reason, message.message)
            case _:
                if isinstance(message, p.WeightsReply | p.WeightsRefused):
                    self._note_weights(message.snapshot)
                call = self._calls.get(message.request_id)
                if call and not call[1].done():
                    call[1].set_result(message)

    def _register(self, identity: bytes, ready: p.Ready) -> None:
        old = self._workers.get(ready.device)
        if old is not None and old.identity != identity:
            self.worker_lost(ready.device, "replaced by a new worker")
        now = time.monotonic(), time.time()
        link = WorkerLink(ready.device, identity, ready.pid, ready.cuda_devices, *now)
        self._workers[ready.device] = link
        self._by_identity[identity] = link
        for future in self._ready_waiters.pop(ready.device, []):
            if not future.done():
                future.set_result(link)


def _not_started(died: WorkerDied) -> WorkerDied:
    message = f"{died.message}; the request had not started and its model is being reloaded"
    return WorkerDied(message, Reason.MODEL_RELOADING)
