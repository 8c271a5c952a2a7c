"""What a caller of the engine holds: the `EngineClient` protocol the routes and services use, the rows it answers
with (`ModelPlacement`, `WorkerLink`), and the process's installed client. Implemented by `ZmqEngineClient`
(engine_client.py) for worker processes and `InProcessEngineClient` (in_process_client.py) for tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inference.engine.contract import messages as p
from inference.engine.contract.params import LoadOptions, Priority, ServingLimits
from inference.engine.contract.weights import ServedCheckpoint, WeightsCall, WeightsSnapshot
from inference.runtime.generation import Generation


@dataclass(slots=True)
class ModelPlacement:
    """A served model: which worker holds it, how it was loaded, and the platform's two facts about it. state:
    loading, ready, unloading, or reloading (after its worker crashed). `instance_id` is the ModelInstance row the
    platform wrote once the load succeeded (None until then, and for a load that is not recorded); this client
    only keeps it, as a plain int. `name` is the placement's key (the worker's name for it); `served_name` is the
    name clients use, shared by a model's replicas (equal to `name` when not given)."""

    name: str
    device: str
    state: str
    load: p.Load  # how it was loaded (path, options, limits), replayed after a crash
    info: p.Loaded | None = None
    instance_id: int | None = None
    loaded_at: float | None = None  # time.time() when the first LOAD succeeded (a reload after a crash keeps it)
    weights: WeightsSnapshot | None = None  # its weights barrier, as the worker last reported it
    load_progress: p.LoadProgress | None = None  # how far its load has read, while it loads
    served_name: str = ""

    def __post_init__(self) -> None:
        if not self.served_name:
            self.served_name = self.name

    def weights_held(self) -> str | None:
        """Why batch work must wait for this model's weights, or None: a trainer holds them (the barrier quiesced,
        a commit writing, a weights load pausing serving; a save serves on), as the last snapshot says. Interactive
        requests queue behind the hold instead; a batch line is refused at once (weights_held) and its runner
        retries."""
        weights = self.weights
        if weights is None:
            return None
        if weights.weights_state == "writing":
            return "a trainer is writing them"
        if weights.transition == "load":
            return "a weights load holds them"
        if weights.barrier == "quiesced":
            return "a trainer quiesced them"
        return None


@dataclass(slots=True)
class WorkerLink:
    device: str
    identity: bytes
    pid: int
    cuda_devices: int
    last_seen: float  # time.monotonic() of the last message from it
    last_seen_wall: float  # time.time() of the same


class EngineClient(Protocol):
    """What the routes use. Implemented by `ZmqEngineClient` (worker processes, run by the WorkerSupervisor) and
    `InProcessEngineClient` (the same worker loop in threads, for tests); see ZmqEngineClient for each method."""

    def models(self) -> dict[str, ModelPlacement]: ...

    def workers(self) -> dict[str, WorkerLink]: ...

    async def generate(self, submit: p.Submit) -> Generation: ...

    def abort(self, request_id: str) -> None: ...

    async def load(
        self,
        name: str,
        path: str,
        *,
        options: LoadOptions = ...,
        limits: ServingLimits = ...,
        device: str | None = None,
        timeout: float | None = None,
        checkpoint: ServedCheckpoint | None = None,
        served_name: str = "",
    ) -> p.Loaded: ...

    def serve_weights_from(self, name: str, path: str, checkpoint: ServedCheckpoint | None) -> None: ...

    async def unload(self, name: str, *, drain_timeout: float = 30.0, force: bool = True) -> p.Unloaded: ...

    async def status(self, timeout: float = 10.0) -> list[p.Status]: ...

    async def pause(self, model: str, timeout: float | None = None) -> None: ...

    async def resume(self, model: str) -> None: ...

    async def export_session(self, model: str, session_id: str, *, timeout: float = ...) -> p.SessionBlob: ...

    async def restore_session(
        self, model: str, session_id: str, blob: bytes, tokens: list[int], *, timeout: float = ...
    ) -> p.SessionRestored: ...

    async def release_session(self, model: str, session_id: str, *, timeout: float = ...) -> p.SessionReleased: ...

    async def watch_session(
        self, model: str, session_id: str, watching: bool, *, timeout: float = ...
    ) -> p.SessionWatched: ...

    async def sessions(self, model: str, *, timeout: float = ...) -> p.Sessions: ...

    async def weights_call(
        self, model: str, call: WeightsCall, *, timeout: float | None = None
    ) -> p.WeightsReply | p.WeightsRefused: ...

    async def embed(
        self, model: str, inputs: list[str] | list[list[int]], *, priority: Priority = ..., timeout: float = ...
    ) -> p.Embeddings: ...


_installed: EngineClient | None = None


def install_client(client: EngineClient | None) -> None:
    """Makes `client` the one `installed_client()` returns (the serve command installs the supervisor's client)."""
    global _installed
    _installed = client


def installed_client() -> EngineClient | None:
    """The process's engine client; None when the engine does not run in this process (a management shell)."""
    return _installed
