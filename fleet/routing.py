"""Which live instance a /v1 request goes to.

The router calls `choose` for every request it forwards, `begin` and `end` around forwarding it (this router's own
count of what it has in flight at each instance), `served` once the instance answered, `exported` with each session
file that passed through it, and `instance_gone` when an instance stops being live. Three rules, in order
(docs/fleet.md, "Routing"):

1. A request with a session key goes where its session's KV lives (fleet/session_store.py, shared by every router).
   A session whose instance is gone, or restarted (a new epoch), re-homes to the instance rule 2 picks, with its last
   export to restore there first when a router kept one; a new session is placed by rule 2 and claimed.
2. Cache-aware (PANTHEON_ROUTER_POLICY=cache_aware): unless load is imbalanced (the busiest is more than
   PANTHEON_ROUTER_BALANCE_ABS requests over the idlest and more than PANTHEON_ROUTER_BALANCE_RATIO times it), the
   instance holding the longest prefix of the prompt (fleet/prefix_index.py), when that prefix is more than
   PANTHEON_ROUTER_PREFIX_THRESHOLD of the prompt; the least-busy among those that hold as long a prefix.
3. Otherwise the least busy: reported in flight plus what this router sent since, ties to the lower instance id.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.contract import Choice, InstanceRecord, RouteRequest
from fleet.prefix_hashes import CHUNK_CHARS, chunk_hashes
from fleet.prefix_index import PrefixIndex
from fleet.session_store import Holder, SessionStore

POLICIES = ("cache_aware", "least_busy")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """The policy's settings (PANTHEON_ROUTER_*; docs/fleet.md)."""

    policy: str = "cache_aware"
    prefix_threshold: float = 0.3
    balance_abs: int = 64
    balance_ratio: float = 1.5
    prefix_capacity: int = 65536  # chunk hashes kept per instance
    session_ttl_s: float = 12 * 3600.0
    export_max_bytes: int = 256 * 1024**2
    redis_url: str = ""

    @classmethod
    def from_settings(cls) -> RoutingConfig:
        from django.conf import settings

        return cls(
            policy=settings.PANTHEON_ROUTER_POLICY,
            prefix_threshold=settings.PANTHEON_ROUTER_PREFIX_THRESHOLD,
            balance_abs=settings.PANTHEON_ROUTER_BALANCE_ABS,
            balance_ratio=settings.PANTHEON_ROUTER_BALANCE_RATIO,
            prefix_capacity=settings.PANTHEON_ROUTER_PREFIX_CAPACITY,
            session_ttl_s=settings.PANTHEON_ROUTER_SESSION_TTL_S,
            export_max_bytes=settings.PANTHEON_ROUTER_EXPORT_MAX_BYTES,
            redis_url=getattr(settings, "PANTHEON_FLEET_REDIS_URL", settings.REDIS_URL),
        )


class RoutingPolicy:
    """Chooses an instance among the live ones for a request; told what was sent, served and exported so later
    choices can use it. One per router process; its session map is shared with the other routers through Redis."""

    def __init__(self, config: RoutingConfig | None = None, store: SessionStore | None = None) -> None:
        self.config = config or RoutingConfig.from_settings()
        self.store = store or SessionStore.from_url(
            self.config.redis_url, ttl_s=self.config.session_ttl_s, export_max_bytes=self.config.export_max_bytes
        )
        self.prefixes = PrefixIndex(self.config.prefix_capacity)
        self.sent: dict[str, int] = {}  # instance id -> requests this router has in flight there

    def load(self, record: InstanceRecord) -> int:
        """An instance's load as this router sees it: what it reported in flight plus what this router sent since."""
        return record.report.in_flight + self.sent.get(record.report.instance_id, 0)

    async def choose(self, request: RouteRequest, live: list[InstanceRecord]) -> Choice:
        """The instance for `request` among `live` (never empty: the caller answers 503 when no instance serves the
        model); see the module docstring for the rules."""
        hashes = chunk_hashes(request.prefix_text) if self.config.policy == "cache_aware" else []
        if request.session_key:
            choice = await self._session_choice(request, live, hashes)
        else:
            choice = self._balanced(request, live, hashes)
        if hashes:
            self.prefixes.routed(choice.instance, hashes)
        return choice

    async def _session_choice(self, request: RouteRequest, live: list[InstanceRecord], hashes: list[str]) -> Choice:
        """Rule 1: the session's instance; a new session placed and claimed; a homeless one re-homed."""
        by_id = {record.report.instance_id: record for record in live}
        model, key = request.model_id, request.session_key
        held = await self.store.holder(model, key)
        if held is not None and _holds(by_id.get(held.instance_id), held):
            return Choice(instance=by_id[held.instance_id], why="session")
        placed = self._balanced(request, live, hashes)
        mine = _holder_of(placed.instance)
        if held is None:
            winner = await self.store.claim(model, key, mine)
            if winner == mine:
                return placed
        else:
            winner = await self.store.move(model, key, held, mine)
            if winner == mine:
                return Choice(instance=placed.instance, why="rehome", restore_file=await self.store.export(model, key))
        if _holds(by_id.get(winner.instance_id), winner):
            return Choice(instance=by_id[winner.instance_id], why="session")  # another router placed it first
        return placed  # it placed it where this router no longer sees a live instance: the next turn re-homes it

    def _balanced(self, request: RouteRequest, live: list[InstanceRecord], hashes: list[str]) -> Choice:
        """Rules 2 and 3: the longest cached prefix unless load is imbalanced or the prefix is short, else the
        least busy."""
        loads = {record.report.instance_id: self.load(record) for record in live}
        least = min(live, key=lambda record: (loads[record.report.instance_id], record.report.instance_id))
        if not hashes or self._imbalanced(loads):
            return Choice(instance=least, why="least_busy")
        matches = {record.report.instance_id: self.prefixes.match(record, hashes) for record in live}
        best = min(
            live, key=lambda r: (-matches[r.report.instance_id], loads[r.report.instance_id], r.report.instance_id)
        )
        shared = matches[best.report.instance_id] * CHUNK_CHARS / max(1, len(request.prefix_text))
        if shared > self.config.prefix_threshold:
            return Choice(instance=best, why="prefix")
        return Choice(instance=least, why="least_busy")

    def _imbalanced(self, loads: dict[str, int]) -> bool:
        busiest, idlest = max(loads.values()), min(loads.values())
        return busiest - idlest > self.config.balance_abs and busiest > self.config.balance_ratio * idlest

    async def home(self, model_id: str, session_key: str, live: list[InstanceRecord]) -> InstanceRecord | None:
        """The live instance that holds the session (same epoch as when it took it), else None; changes nothing."""
        held = await self.store.holder(model_id, session_key)
        by_id = {record.report.instance_id: record for record in live}
        if held is not None and _holds(by_id.get(held.instance_id), held):
            return by_id[held.instance_id]
        return None

    def begin(self, choice: Choice) -> None:
        """The router is forwarding a request to `choice.instance` (counted until `end`)."""
        instance_id = choice.instance.report.instance_id
        self.sent[instance_id] = self.sent.get(instance_id, 0) + 1

    def end(self, choice: Choice) -> None:
        """The forward `begin` counted is over (answered, failed or abandoned by its client)."""
        instance_id = choice.instance.report.instance_id
        left = self.sent.get(instance_id, 0) - 1
        if left > 0:
            self.sent[instance_id] = left
        else:
            self.sent.pop(instance_id, None)

    async def served(self, request: RouteRequest, choice: Choice, *, cached_tokens: int | None) -> None:
        """The instance answered `request` (its usage's cached_tokens when the answer carried them): a session's
        entry and export last another TTL from now, as the instance keeps it that long after this turn."""
        if request.session_key:
            await self.store.touch(request.model_id, request.session_key)

    async def exported(self, model_id: str, session_key: str, session_file: bytes) -> bool:
        """A session file (`POST /admin/session/export` answered with `Accept: application/octet-stream`) passed
        through this router: kept as the session's restore point, unless over PANTHEON_ROUTER_EXPORT_MAX_BYTES."""
        return await self.store.keep_export(model_id, session_key, session_file)

    async def instance_gone(self, instance_id: str) -> None:
        """The instance is no longer live (missed heartbeats, or the router could not reach it): its picture goes;
        its sessions re-home on their next turn."""
        self.sent.pop(instance_id, None)
        self.prefixes.forget(instance_id)

    async def close(self) -> None:
        await self.store.close()


def _holder_of(record: InstanceRecord) -> Holder:
    return Holder(record.report.instance_id, record.report.epoch)


def _holds(record: InstanceRecord | None, held: Holder) -> bool:
    """Whether the live `record` (None: not live) still holds what `held` says: same instance, same epoch."""
    return record is not None and record.report.epoch == held.epoch
