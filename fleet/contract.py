"""The fleet's shared words: what a serve instance reports to a router, what a router keeps of it, and what a routing
choice is asked and answers.

Both sides import this module (a serve instance's registration agent and the router), and it imports neither Django
nor torch, so it is the one place these shapes are written. The bodies follow the spec's router registration
(`PANTHEON_REGISTRY_URL`): `POST /registry/register` once per served model at startup (and again after the router
forgot it), then `POST /registry/heartbeat` with the same body every `PANTHEON_REGISTRY_HEARTBEAT_S`, carrying the
live load and the context window, which can move at runtime.
"""

from __future__ import annotations

import msgspec


class InstanceReport(msgspec.Struct, kw_only=True):
    """One served model on one serve instance, as that instance reports it (the body of register and heartbeat).

    `instance_id` is `host:port:model` (spec: unique per process; a model's in-process replicas collapse into it and
    are balanced inside the instance). `capacity` and `free_slots` are summed over those replicas; `in_flight` is
    running plus waiting. `context_window` is the minimum over the replicas, None while unknown. `epoch` changes
    whenever the instance's caches were emptied (a restart, a reload after a crash, a weights change), so a router
    drops what it believed the instance held. `cached_prefixes` are the prefix hashes the instance holds
    (fleet/prefix_hashes.py), newest first, bounded; empty when it does not report them.
    """

    instance_id: str
    model_id: str
    endpoint: str  # http://host:port, where the router forwards
    node_id: str = "node0"
    transport: str = "local"
    capacity: int = 1
    in_flight: int = 0
    free_slots: int = 0
    context_window: int | None = None
    epoch: str = ""
    cached_prefixes: list[str] = msgspec.field(default_factory=list)


class InstanceRecord(msgspec.Struct, kw_only=True):
    """What a router's registry keeps of one instance: its last report and when it came (the router's clock,
    time.time()). Shared by every router process through Redis (fleet/registry.py); an instance whose last report
    is older than `PANTHEON_REGISTRY_TIMEOUT_S` is not live and is dropped."""

    report: InstanceReport
    last_seen: float


class RouteRequest(msgspec.Struct, kw_only=True):
    """What a routing choice is asked about one /v1 request: the model it names, its session key (body
    `session_id` / `prompt_cache_key` / `promptCacheKey`, else the `X-Session-Id` header; None without one), and
    `prefix_text`: the request's prompt as one text in the order a model reads it (the messages' roles and contents,
    or the completion prompt, or the responses input), on which cache-aware routing matches prefixes."""

    model_id: str
    session_key: str | None = None
    prefix_text: str = ""


class Choice(msgspec.Struct, kw_only=True):
    """A routing choice: the instance to forward to, why (`session`: where the session's KV lives; `rehome`: the
    session's instance is gone and this one takes it; `prefix`: the longest cached prefix; `least_busy`), and, for a
    re-homed session with a stored export, the session file to restore there before forwarding (`restore_file`: the
    bytes `POST /admin/session/export` answers with `Accept: application/octet-stream`, which `POST /session/restore`
    takes raw; inference/services/session_file.py)."""

    instance: InstanceRecord
    why: str
    restore_file: bytes | None = None
