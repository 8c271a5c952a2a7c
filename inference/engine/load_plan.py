"""What a LOAD asks of the memory before the weights are read, and the scheduler it serves with after.

`plan_load` settles the window, the KV pool's dtype and the prefix cache's share from the checkpoint's config and
the free memory, so a model that cannot fit is refused before any weight is read; `load_weights` loads as planned
(on one device, or split across ranks: parallel/); `new_scheduler` builds the scheduler (and the session table)
the load's limits describe. HostedModel.load runs the three.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inference.engine.contract import messages as p
from inference.engine.contract.params import LoadOptions, ServingLimits
from inference.engine.errors import LoadError
from inference.engine.execution.runner import DEFAULT_ATTENTION
from inference.engine.kv.sessions import SessionTable
from inference.engine.kv_budget import (
    MIN_WINDOW,
    configured_window,
    effective_window,
    element_size,
    free_memory,
    kv_bytes_per_token,
    prefix_cache_bytes,
    read_config,
    weight_bytes_estimate,
)
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.loaders.loading import automatic_kv_dtype, load_model
from inference.engine.loaders.progress import ReadProgress
from inference.engine.parallel.shard import SplitRefused
from inference.engine.parallel.split_load import load_split_model
from inference.engine.scheduler import Scheduler
from inference.engine.serving_metrics import ModelMetrics

MIB = 2**20


@dataclass(frozen=True, slots=True)
class LoadPlan:
    configured: int  # the window the options ask for (see kv_budget.configured_window)
    window: int  # the window that fits in free memory next to the weights
    kv_dtype: str | None  # None: the weights' dtype
    cache_tokens: int  # positions the prefix cache may hold beyond the sequences' windows
    attachable: bool  # the weights laid out for a trainer to attach to (engine/weights/)


def plan_load(req: p.Load, device: str) -> LoadPlan:
    """The window is the configured one, lowered to what fits in free memory next to the weights, and the prefix
    cache gets its budget from what is left (see kv_budget); a model that cannot fit even MIN_WINDOW positions
    fails with MemoryError."""
    options, limits = req.options, req.limits
    slots = limits.max_concurrent
    if split(options) and options.attention == "flex":
        # the follower ranks' pools are kept in step by rank 0's journal of changes, which does not tell them which
        # blocks hold finite values, the part of the pool flex reads
        raise SplitRefused(req.path, "attention flex does not split across ranks; load it with tensor_parallel 1")
    config = read_config(req.path)
    if options.ctx_cap > config.context_limit:
        raise LoadError(req.path, f"ctx_cap {options.ctx_cap} exceeds the model's {config.context_limit}")
    check_host_cache(req.path, options)
    configured = configured_window(config, options.ctx_cap)
    element = element_size(options.dtype or None, device)
    budget = free_memory(device) - weight_bytes_estimate(config, element) - limits.min_free_memory
    kv_dtype = options.kv_dtype or automatic_kv_dtype(req.path, options.dtype or None, device)
    per_token = kv_bytes_per_token(config, element_size(kv_dtype or options.dtype or None, device))
    window = effective_window(configured, per_token, slots, budget)
    if window < min(MIN_WINDOW, configured):
        raise MemoryError(
            f"{device} has no room for the KV cache of {slots} sequences: {max(0, budget)} bytes "
            f"left after the weights and the {limits.min_free_memory}-byte reserve"
        )
    windows = slots * -(-window // limits.block_size) * limits.block_size  # positions the sequences may fill
    return LoadPlan(
        configured=configured,
        window=window,
        kv_dtype=kv_dtype,
        cache_tokens=prefix_cache_bytes(limits.prefix_cache_bytes, budget - windows * per_token) // per_token,
        # A GGUF file, an int8 load or a split one is never attachable, and loads as usual (attach then says why).
        attachable=limits.attachable and not options.quantize and Path(req.path).is_dir() and not split(options),
    )


def load_weights(req: p.Load, plan: LoadPlan, device: str, progress: ReadProgress | None) -> LoadedModel:
    """The model as the plan and the load's options say, on one device or split across `tensor_parallel` ranks."""
    options, limits = req.options, req.limits
    how = {
        "attachable": plan.attachable,
        "dtype": options.dtype or None,
        "kv_dtype": plan.kv_dtype,
        "quantize": options.quantize,
        "max_concurrent": limits.max_concurrent,
        "context_window": plan.window,
        "block_size": limits.block_size,
        "cache_tokens": plan.cache_tokens,
        "host_cache_bytes": options.host_cache_mb * MIB,
        "attention": options.attention or DEFAULT_ATTENTION,
        "progress": progress,
    }
    if split(options):
        return load_split_model(req.path, options.tensor_parallel, device=device, **how)
    return load_model(req.path, device=device, **how)


def check_host_cache(path: str, options: LoadOptions) -> None:
    """Refuses a host tier that cannot be: on a split model (SplitRefused: its ranks replay rank 0's pool changes
    from a journal, kv_cache.KVCache.change, which carries no host copies), or larger than the host's free memory
    (MemoryError)."""
    if options.host_cache_mb and split(options):
        raise SplitRefused(
            Path(path), "host_cache_mb needs tensor_parallel 1: a split model's ranks share no host tier"
        )
    if options.host_cache_mb * MIB > free_memory("cpu"):
        raise MemoryError(f"host_cache_mb {options.host_cache_mb} exceeds the host's free memory")


def split(options: LoadOptions) -> bool:
    """Whether the load splits the model across ranks (tensor_parallel 0 and 1 do not)."""
    return options.tensor_parallel > 1


def new_scheduler(model: LoadedModel, limits: ServingLimits, metrics: ModelMetrics) -> Scheduler:
    """The scheduler of a loaded model, with a session table when the limits allow sessions, recording into
    `metrics`."""
    sessions = None
    if limits.max_sessions:
        sessions = SessionTable(
            model.runner.cache,
            max_sessions=limits.max_sessions,
            idle_ttl=limits.session_idle_ttl,
            watch_grace=limits.watch_grace,
        )
    return Scheduler(
        model.runner,
        model.tokenizer,
        max_concurrent=limits.max_concurrent,
        batch_slots=limits.batch_slots,
        queue_depth=limits.queue_depth,
        queue_timeout=limits.queue_timeout,
        prefill_chunk=limits.prefill_chunk,
        repetition_span=limits.repetition_span,
        sessions=sessions,
        metrics=metrics,
    )
