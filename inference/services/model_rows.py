"""The model rows of GET /v1/models (the client's plan) and of GET /admin/models and POST /admin/models/load (the
operator's view), each built from one placement (the engine client's record of a served model).

Served numbers come from the worker (what the scheduler really runs: `max_concurrent`, `context_window`, which is
also every completion's `usage.kv_cap`); the `*_configured` ones from the load options. A number that is not known
yet (a model still loading) is left out rather than reported as 0. The operator rows carry `graphs`, how the decode
step runs (compiled or CUDA graphs per batch-size bucket, or eager, and why when a compile fell back: the worker's
live answer, else the load's); its fields are Pantheon's own, not the spec's graph-slot counts (docs/api/).
`attention` is omitted: the engine has a single attention path. `served_weights` says which weights answer, as
X-miLLM-Model does: a trainer checkpoint's qualified name once one is saved or loaded, also after a restart.

Replicas (docs/replicas.md): /v1/models shows a served name once; /admin/models shows one row per placement, each
with the served name as `id`, its own `instance_id`, and `placement`, its key (the worker's name for it).
"""

from __future__ import annotations

from typing import Any

import msgspec
from django.conf import settings

from inference.engine.contract import messages as p
from inference.runtime.client_protocol import ModelPlacement
from inference.runtime.router import ModelRouter, key_order

OWNED_BY = "pantheon"


def _dies(device: str) -> list[int]:
    return [int(device.split(":", 1)[1])] if device.startswith("cuda:") else []


def _max_sessions(placement: ModelPlacement) -> int:
    """Residency: the session ids the worker keeps KV for (the load's max_sessions, else its max_concurrent; 0 when
    sessions are off), as the load sent it."""
    return placement.load.limits.max_sessions


def _required_with_thinking(info: p.Loaded | None) -> bool | None:
    """Whether `tool_choice: "required"` may be sent with thinking on and still reason freely: the call grammar is
    armed (PANTHEON_TOOL_GRAMMAR is not 0) and held back until the think block closes, which the worker does when
    the template opens the block in the prompt or the model can open it with a `<think>` token of its own."""
    if info is None:
        return None
    return settings.PANTHEON_TOOL_GRAMMAR != "0" and info.thinks_before_grammar


def load_progress_fields(progress: p.LoadProgress | None) -> dict[str, int] | None:
    """How far a running load has read: tensors and bytes of the totals (None once it is loaded, or before the
    worker reported anything)."""
    if progress is None:
        return None
    return {"tensors_read": progress.tensors_read, "tensors_total": progress.tensors_total,
            "bytes_read": progress.bytes_read, "bytes_total": progress.bytes_total}  # fmt: skip


def v1_model_row(placement: ModelPlacement) -> dict[str, Any]:
    """One entry of GET /v1/models."""
    info = placement.info
    max_concurrent = info.max_concurrent if info else None
    row: dict[str, Any] = {
        "id": placement.served_name,
        "object": "model",
        "created": int(placement.loaded_at or 0),
        "owned_by": OWNED_BY,
        "max_sessions": _max_sessions(placement),
        "max_concurrent": max_concurrent,
        "context_window": info.context_window if info else None,
        "tool_choice_required_with_thinking": _required_with_thinking(info),
    }
    return {k: v for k, v in row.items() if v is not None}


def graphs_fields(graphs: p.DecodeGraphs | None) -> dict[str, Any] | None:
    """The `graphs` object: mode, buckets, warmup_ms, fallback_reason (null unless a compile fell back)."""
    if graphs is None:
        return None
    return {"mode": graphs.mode, "buckets": graphs.buckets, "warmup_ms": graphs.warmup_ms,
            "fallback_reason": graphs.fallback_reason}  # fmt: skip


def served_weights_fields(placement: ModelPlacement) -> dict[str, Any] | None:
    """The `served_weights` object: the name the weights answer under, their origin (model or checkpoint), the
    commits since and how many of those no checkpoint records (None until the worker reported its barrier)."""
    weights = placement.weights
    if weights is None:
        return None
    return {"name": weights.served_name, "origin": weights.origin, "commits": weights.commits,
            "unsaved_commits": weights.unsaved_commits}  # fmt: skip


def prefix_hits(live: p.ModelStatus) -> dict[str, Any]:
    """`live.prefix_cache`: the prompt tokens looked up in the prefix cache since the load, those whose KV it held
    (`hit_tokens`) and their ratio (`hit_rate`, null before any lookup); and its host tier's blocks copied out of the
    pool (`host_offloaded_blocks`) and back (`host_restored_blocks`), and the bytes it holds (`host_bytes`), all 0
    without one."""
    looked_up, hits = live.prefix_lookup_tokens, live.prefix_hit_tokens
    return {"lookup_tokens": looked_up, "hit_tokens": hits,
            "hit_rate": round(hits / looked_up, 4) if looked_up else None,
            "host_offloaded_blocks": live.host_offloaded_blocks, "host_restored_blocks": live.host_restored_blocks,
            "host_bytes": live.host_bytes}  # fmt: skip


def admin_model_row(placement: ModelPlacement, live: p.ModelStatus | None = None) -> dict[str, Any]:
    """One instance as GET /admin/models and POST /admin/models/load show it. `live` adds the scheduler's
    current occupancy (running, waiting, slots), the KV pool's (blocks total, free, cached, pinned by sessions,
    their size, the sessions held) and the prefix cache's hits when the worker answered a status query; the
    prefix cache's size is the load's (`prefix_cache`)."""
    info: p.Loaded | None = placement.info
    options = placement.load.options
    max_concurrent = live.max_concurrent if live else info.max_concurrent if info else None
    context_window = live.context_window if live else info.context_window if info else None
    row: dict[str, Any] = {
        "id": placement.served_name,
        "object": "model",
        "instance_id": placement.instance_id,
        "placement": placement.name,
        "state": placement.state,
        "path": info.path if info else placement.load.path,
        "format": info.format if info else None,
        "architecture": info.architecture if info else None,
        "tool_dialect": info.tool_dialect if info else None,
        "device": placement.device,
        "dies": _dies(placement.device),
        "dtype": info.dtype if info else None,
        "vram_bytes": (info.weight_bytes + info.kv_bytes + info.prefix_cache_bytes) if info else None,
        "weights_in_memory": {"bytes": info.weight_bytes, "linear_formats": info.linear_formats} if info else None,
        "kv_cache": {"dtype": info.kv_dtype, "bytes": info.kv_bytes} if info else None,
        "attention": info.attention if info else None,  # how attention reads the KV cache (load option attention)
        "prefix_cache": {"bytes": info.prefix_cache_bytes} if info else None,  # beyond the sequences' windows
        "max_sessions": _max_sessions(placement),
        "max_concurrent": max_concurrent,
        "max_concurrent_configured": placement.load.limits.max_concurrent,  # what the load asked the scheduler for
        "context_window": context_window,
        "context_window_configured": (info.context_window_configured if info else None)
        or options.ctx_cap
        or context_window,
        "reasoning_budget": options.reasoning_budget,
        "quantize": options.quantize,
        "compile": options.compile,
        "graphs": graphs_fields(live.graphs if live else info.graphs if info else None),
        "kernels": info.kernels if info else None,  # the C kernels its worker runs; [] where torch runs all
        "tensor_parallel": msgspec.structs.asdict(info.tensor_parallel) if info and info.tensor_parallel else None,
        "served_weights": served_weights_fields(placement),
        "loaded_at": int(placement.loaded_at) if placement.loaded_at else None,
        "load_progress": load_progress_fields(placement.load_progress),
    }
    if live is not None:
        row["live"] = {"running": live.running, "waiting": live.waiting, "slots_used": live.slots_used,
                       "slots_total": live.slots_total, "state": live.state,
                       "blocks_total": live.blocks_total, "blocks_free": live.blocks_free,
                       "blocks_cached": live.blocks_cached, "blocks_pinned": live.blocks_pinned,
                       "block_size": live.block_size, "sessions": live.sessions,
                       "prefix_cache": prefix_hits(live), "batch_running": live.batch_running,
                       "batch_waiting": live.batch_waiting, "batch_slots": live.batch_slots}  # fmt: skip
    return {k: v for k, v in row.items() if v is not None}


async def instance_rows(router: ModelRouter) -> list[dict[str, Any]]:
    """Every live instance as GET /admin/models lists it (and the UI shows it), with the scheduler's occupancy."""
    live = {(s.device, m.name): m for s in await router.client.status() for m in s.models}
    placements = sorted(router.placements().values(), key=lambda pl: (pl.served_name, key_order(pl)))
    return [admin_model_row(placement, live.get((placement.device, placement.name))) for placement in placements]
