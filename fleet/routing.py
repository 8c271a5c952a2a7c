"""Which live instance a /v1 request goes to.

The router calls `choose` for every request it forwards and `served` once the instance answered; what it forwards
and how is fleet/forwarding.py's. This first form picks the least-busy instance (reported in-flight plus what this
router sent it since); session affinity and cache-aware choice build on the same two calls (docs/fleet.md).
"""

from __future__ import annotations

from fleet.contract import Choice, InstanceRecord, RouteRequest


class RoutingPolicy:
    """Chooses an instance among the live ones for a request; told what was served so later choices can use it."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}  # instance id -> requests this router has in flight there

    def load(self, record: InstanceRecord) -> int:
        """An instance's load as this router sees it: what it reported in flight plus what this router sent since."""
        return record.report.in_flight + self.sent.get(record.report.instance_id, 0)

    async def choose(self, request: RouteRequest, live: list[InstanceRecord]) -> Choice:
        """The least-busy of `live` (never empty: the caller answers 503 when no instance serves the model)."""
        best = min(live, key=lambda record: (self.load(record), record.report.instance_id))
        return Choice(instance=best, why="least_busy")

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
        """The instance answered `request` (its usage's cached_tokens when the answer carried them)."""

    async def instance_gone(self, instance_id: str) -> None:
        """The instance is no longer live (missed heartbeats, or the router could not reach it)."""
        self.sent.pop(instance_id, None)
