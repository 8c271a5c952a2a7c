"""The control plane's in-memory view of what it serves, and the routing of /v1 requests to a served name.

A served model is one record, the engine client's `ModelPlacement`: which worker holds it, how it was loaded, and
the platform's facts about it (its ModelInstance row, set here by `record_instance`, and when it loaded). The router
adds the set of catalogued names, so routing a request reads memory only: no database query and no thread on the
/v1 hot path.

Routing (spec: "Route model"): a name that is served is used; a name that is in the catalogue but not loaded is
loaded on demand, unless the request says `X-miLLM-Load-Policy: refuse`; otherwise one loaded model takes any name,
several need an exact match (404 model_not_found), and none is 503 no_models_loaded.

Every load goes through `run_load`, so one name is never loaded twice at once: an operator's second load of a name
that is still loading is refused (409), a /v1 request waits for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import SyncToAsync

from inference.runtime.client_protocol import EngineClient, ModelPlacement
from pantheon_site.errors import LoadFailed, ModelNotFound, NoModelsLoaded, ServerShuttingDown, WeightsUnsaved

T = TypeVar("T")

LOAD_POLICY_HEADER = "X-miLLM-Load-Policy"
SERVING_STATES = ("ready", "reloading")  # reloading: its worker crashed and is coming back; requests get 500 meanwhile


def load_allowed(headers) -> bool:
    """Whether a /v1 request may load the model it names on demand (not when `X-miLLM-Load-Policy: refuse`)."""
    return headers.get(LOAD_POLICY_HEADER, "").strip().lower() != "refuse"


class ModelRouter:
    """Routes requests to served names, read from the engine client's placements.

    `load_catalogued(name)` is the coroutine that loads a catalogued model on demand (the control plane supplies it:
    it writes the instance row and the audit event).
    """

    def __init__(self, client: EngineClient, *, load_catalogued: Callable[[str], Awaitable[Any]] | None = None):
        self.client = client
        self.load_catalogued = load_catalogued
        self.catalog_names: frozenset[str] = frozenset()
        self._loads: dict[str, asyncio.Future] = {}  # every load in progress, by name
        self._on_demand: dict[str, asyncio.Future] = {}  # loads /v1 requests started, which later requests share
        self.shutting_down = False  # set on SIGTERM: new completions are refused, running ones finish
        self.completions_in_flight = 0  # completion requests between begin_completion() and end_completion()

    # -- completions in flight (graceful shutdown waits for them) ------------------------------------------------

    def begin_completion(self) -> None:
        """Counts a completion request in; 503 server_shutting_down (Retry-After: 1) once shutdown began."""
        if self.shutting_down:
            raise ServerShuttingDown("the server is shutting down; retry in a moment", reason="shutting_down")
        self.completions_in_flight += 1

    def end_completion(self) -> None:
        self.completions_in_flight -= 1

    # -- what is served -------------------------------------------------------------------------------------------

    def placements(self) -> dict[str, ModelPlacement]:
        """Every model the engine holds, loads, reloads or unloads, by served name."""
        return self.client.models()

    def serving_names(self) -> list[str]:
        """Names that take requests now (a model whose worker is being restarted still counts: it comes back)."""
        return [name for name, pl in self.client.models().items() if pl.state in SERVING_STATES]

    def by_instance_id(self, instance_id: int) -> ModelPlacement | None:
        return next((pl for pl in self.client.models().values() if pl.instance_id == instance_id), None)

    def record_instance(self, name: str, instance_id: int) -> ModelPlacement | None:
        """Notes the ModelInstance row written for the loaded model `name`; returns its placement (None if the
        model is no longer held: its worker crashed and the reload failed meanwhile)."""
        placement = self.client.models().get(name)
        if placement is not None:
            placement.instance_id = instance_id
        return placement

    def is_loading(self, name: str) -> bool:
        return name in self._loads

    def loads_in_progress(self) -> bool:
        """Whether any load (an operator's or one a /v1 request started) is running."""
        return bool(self._loads or self._on_demand)

    # -- routing --------------------------------------------------------------------------------------------------

    async def route(self, requested: str, *, allow_load: bool = True) -> str:
        """The served name a /v1 request with `model: requested` goes to (see the module docstring)."""
        placements = self.client.models()
        placement = placements.get(requested) if requested else None
        if placement is None and requested:  # the name a save or a checkpoint load gave the served weights
            placement = next((pl for pl in placements.values() if pl.weights and pl.weights.served_name == requested),
                             None)  # fmt: skip
            requested = placement.name if placement is not None else requested
        if placement is not None and placement.state in SERVING_STATES:
            return requested
        if placement is not None and placement.state == "unloading":
            raise ModelNotFound(f"model {requested!r} is being unloaded", reason="unloading")
        if requested and (requested in self._loads or requested in self._on_demand or requested in self.catalog_names):
            if not allow_load:
                raise ModelNotFound(
                    f"model {requested!r} is not loaded and {LOAD_POLICY_HEADER}: refuse forbids loading it",
                    reason="load_refused_by_policy",
                )
            self._refuse_unsaved(requested)
            await self._load_on_demand(requested)
            return requested
        names = [name for name, pl in placements.items() if pl.state in SERVING_STATES]
        if len(names) == 1:
            return names[0]
        if not names:
            raise NoModelsLoaded(reason="no_models_loaded")
        raise ModelNotFound(
            f"model {requested!r} is not loaded; loaded models: {', '.join(sorted(names))}", reason="model_not_found"
        )

    def _refuse_unsaved(self, requested: str) -> None:
        """An auto-load while a served model carries commits no checkpoint records is refused (409 weights_unsaved):
        the operator decides whether to save them or to load over them (spec: "Unsaved commits")."""
        for placement in self.client.models().values():
            weights = placement.weights
            if weights is not None and weights.unsaved_commits > 0:
                raise WeightsUnsaved(
                    f"loading {requested!r} is refused: {weights.served_name!r} carries {weights.unsaved_commits} "
                    "unsaved commit(s); save them with POST /api/weights/save, or discard them with an explicit "
                    "POST /api/weights/load or POST /admin/models/load",
                    reason="weights_unsaved",
                )

    async def _load_on_demand(self, name: str) -> None:
        """Waits for the model's load: one in progress, else a new one that later requests share. Shielded: a
        client that disconnects meanwhile does not cancel a load other requests may be waiting for; and run outside
        the first request's context, whose thread for sync work (its database writes) ends with that request."""
        pending = self._loads.get(name) or self._on_demand.get(name)
        if pending is None:
            if self.load_catalogued is None:
                raise NoModelsLoaded(f"model {name!r} is not loaded", reason="no_loader")
            pending = asyncio.get_running_loop().create_task(self.load_catalogued(name), context=_outside_requests())
            self._on_demand[name] = pending
            pending.add_done_callback(functools.partial(self._forget_on_demand, name))
        await asyncio.shield(pending)

    def _forget_on_demand(self, name: str, future: asyncio.Future) -> None:
        self._on_demand.pop(name, None)
        if not future.cancelled():
            future.exception()  # marks a failure as seen: the requests that waited for it raised it already

    # -- loads ----------------------------------------------------------------------------------------------------

    async def run_load(self, name: str, load: Callable[[], Awaitable[T]]) -> T:
        """Runs `load()` as the one load of `name` in progress; LoadFailed (409) if another one is."""
        if name in self._loads:
            raise LoadFailed(f"model {name!r} is already loading", status=409, reason="already_loading")
        future = asyncio.get_running_loop().create_future()
        # Marks a failure as seen: the loader's caller raises it, and waiters (if any) raise it again themselves.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._loads[name] = future
        try:
            result = await load()
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
            else:
                future.cancel()
            raise
        finally:
            del self._loads[name]
        future.set_result(None)
        return result


_installed: ModelRouter | None = None


def install_router(router: ModelRouter | None) -> None:
    """Makes `router` the one the routes use (the serve command installs it with the supervisor's client)."""
    global _installed
    _installed = router


def installed_router() -> ModelRouter | None:
    """The process's router, or None when the engine does not run in this process."""
    return _installed


def get_router() -> ModelRouter:
    """The process's router; 503 no_models_loaded when the engine is not running in this process."""
    if _installed is None:
        raise NoModelsLoaded("the inference engine is not running in this process", reason="engine_not_running")
    return _installed


def _outside_requests() -> contextvars.Context:
    """The current context without its request's thread-sensitive context: its sync calls then run on the loop's
    thread for sync work, as the control plane's own tasks' do (a task created in a request inherits the request's,
    and asgiref refuses calls through a caller-owned one after its request ended: pantheon_site/asgi_handler.py)."""
    context = contextvars.copy_context()
    context.run(SyncToAsync.thread_sensitive_context.set, None)
    return context
