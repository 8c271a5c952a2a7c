"""The control plane's in-memory view of what it serves, and the routing of /v1 requests to a served name and then
to one of its replicas.

A placement is one record, the engine client's `ModelPlacement`: which worker holds it, how it was loaded, and the
platform's facts about it (its ModelInstance row, set here by `record_instance`, and when it loaded). Placements are
keyed by their own name; the replicas of one model share a `served_name`, the name clients use (docs/replicas.md).
The router adds the set of catalogued names, so routing a request reads memory only: no database query and no thread
on the /v1 hot path.

Acquisition (spec: "Multi-card load-balancing", and its "cross-replica session affinity", designed there and never
shipped): a request goes to the ready replica with the fewest requests in flight (queued or running: those the
router sent it, counted from `acquire` to `release`, as the spec's `refs`), ties to the lowest key; a request with a
session key goes to the replica that ran the session's last turn, which holds its KV. Counts and the session ->
placement map live here, in memory; the choice is made and counted in one step, so concurrent requests spread.

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
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from asgiref.sync import SyncToAsync

from inference.runtime.client_protocol import EngineClient, ModelPlacement
from pantheon_site.errors import LoadFailed, ModelNotFound, NoModelsLoaded, ServerShuttingDown, WeightsUnsaved

T = TypeVar("T")

LOAD_POLICY_HEADER = "X-miLLM-Load-Policy"
SERVING_STATES = ("ready", "reloading")  # reloading: its worker crashed and is coming back; requests get 500 meanwhile
# Sessions whose replica the router remembers; past this the least recently used is forgotten, and its next turn goes
# to the least busy replica (a full prefill there), as a session the worker released would.
REMEMBERED_SESSIONS = 65536


def key_order(placement: ModelPlacement) -> tuple[int, str]:
    """Replicas in key order: the first (keyed by the served name) before `name#2`, and `name#2` before `name#10`."""
    return len(placement.name), placement.name


def load_allowed(headers) -> bool:
    """Whether a /v1 request may load the model it names on demand (not when `X-miLLM-Load-Policy: refuse`)."""
    return headers.get(LOAD_POLICY_HEADER, "").strip().lower() != "refuse"


class ModelRouter:
    """Routes requests to served names, read from the engine client's placements.

    `load_catalogued(name)` is the coroutine that loads a catalogued model on demand (the control plane supplies it:
    it writes the instance row and the audit event).
    """

    def __init__(
        self,
        client: EngineClient,
        *,
        load_catalogued: Callable[[str], Awaitable[Any]] | None = None,
        server: str = "",
    ):
        self.client = client
        self.load_catalogued = load_catalogued
        self.server = server  # the serve's name in the rows it writes (its host:port; ControlPlane)
        self.catalog_names: frozenset[str] = frozenset()
        self._loads: dict[str, asyncio.Future] = {}  # every load in progress, by name
        self._on_demand: dict[str, asyncio.Future] = {}  # loads /v1 requests started, which later requests share
        self.shutting_down = False  # set on SIGTERM: new completions are refused, running ones finish
        self.completions_in_flight = 0  # completion requests between begin_completion() and end_completion()
        self._sessions: OrderedDict[tuple[str, str], str] = OrderedDict()  # (served name, session id) -> key
        self._in_flight: dict[str, int] = {}  # placement key -> requests acquired and not yet released

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
        """Every placement the engine holds, loads, reloads or unloads, by key."""
        return self.client.models()

    def replicas(self, served_name: str) -> list[ModelPlacement]:
        """Every placement of a served name, whatever its state, in key order."""
        return sorted((pl for pl in self.client.models().values() if pl.served_name == served_name), key=key_order)

    def serving_names(self) -> list[str]:
        """Served names that take requests now, each once (a model whose worker is being restarted still counts: it
        comes back)."""
        serving = (pl.served_name for pl in self.client.models().values() if pl.state in SERVING_STATES)
        return list(dict.fromkeys(serving))

    def first_serving(self, served_name: str) -> ModelPlacement | None:
        """The replica of `served_name` with the lowest key among those taking requests (what /v1/models shows)."""
        return next((pl for pl in self.replicas(served_name) if pl.state in SERVING_STATES), None)

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
        """The served name a /v1 request with `model: requested` goes to (see the module docstring); `acquire`
        then picks its replica."""
        placements = self.client.models()
        replicas = [pl for pl in placements.values() if pl.served_name == requested] if requested else []
        if not replicas and requested:  # the name a save or a checkpoint load gave the served weights
            named = next((pl for pl in placements.values() if pl.weights and pl.weights.served_name == requested),
                         None)  # fmt: skip
            replicas = self.replicas(named.served_name) if named is not None else []
            requested = named.served_name if named is not None else requested
        if any(pl.state in SERVING_STATES for pl in replicas):
            return requested
        if replicas and all(pl.state == "unloading" for pl in replicas):
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
        names = self.serving_names()
        if len(names) == 1:
            return names[0]
        if not names:
            raise NoModelsLoaded(reason="no_models_loaded")
        raise ModelNotFound(
            f"model {requested!r} is not loaded; loaded models: {', '.join(sorted(names))}", reason="model_not_found"
        )

    def acquire(self, served_name: str, session: str | None = None) -> ModelPlacement:
        """`choose`, counted in flight on the replica chosen until `release(placement)`."""
        placement = self.choose(served_name, session)
        self._in_flight[placement.name] = self._in_flight.get(placement.name, 0) + 1
        return placement

    def release(self, placement: ModelPlacement) -> None:
        """A request `acquire` counted on `placement` ended (however it ended)."""
        left = self._in_flight.get(placement.name, 0) - 1
        if left > 0:
            self._in_flight[placement.name] = left
        else:
            self._in_flight.pop(placement.name, None)

    def in_flight(self) -> dict[str, int]:
        """Requests acquired and not yet released, by placement key (a placement with none is absent)."""
        return dict(self._in_flight)

    def choose(self, served_name: str, session: str | None = None) -> ModelPlacement:
        """The replica of `served_name` a request goes to: the one that holds `session` when it still serves, else
        the least busy ready one (ties to the lowest key), which then holds the session. A model with no ready
        replica (its worker is being restarted) answers with the first one, whose submit says model_reloading."""
        replicas = [pl for pl in self.replicas(served_name) if pl.state in SERVING_STATES]
        if not replicas:
            raise ModelNotFound(f"model {served_name!r} is not loaded", reason="model_not_found")
        if session:
            key = self.session_placement(served_name, session)
            if key is not None:
                return self.client.models()[key]
        ready = [pl for pl in replicas if pl.state == "ready"] or replicas
        chosen = min(ready, key=lambda pl: (self._in_flight.get(pl.name, 0), *key_order(pl)))
        if session:
            self.remember_session(served_name, session, chosen.name)
        return chosen

    def session_placement(self, served_name: str, session: str) -> str | None:
        """The key of the ready replica that holds the session, as the router last placed it (None: not known, or
        that replica no longer serves)."""
        key = self._sessions.get((served_name, session))
        placement = self.client.models().get(key) if key is not None else None
        if placement is None or placement.state != "ready" or placement.served_name != served_name:
            return None
        self._sessions.move_to_end((served_name, session))
        return key

    def remember_session(self, served_name: str, session: str, key: str) -> None:
        """Notes that the replica `key` holds the session (a turn ran there, or it was restored there)."""
        self._sessions[(served_name, session)] = key
        self._sessions.move_to_end((served_name, session))
        while len(self._sessions) > REMEMBERED_SESSIONS:
            self._sessions.popitem(last=False)

    def forget_session(self, served_name: str, session: str) -> None:
        self._sessions.pop((served_name, session), None)

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
