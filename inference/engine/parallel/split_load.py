"""Loading a model split across `ranks` devices, as its rank 0 does it inside the worker: start the follower ranks
(processes of their own, follower.py), load rank 0's part while they load theirs, wait until every one is ready,
join the groups, and hand every forward pass's plan to them from then on (ranks.py). `SplitRanks.close` ends them,
when the model is unloaded or the worker stops; a follower whose worker died ends itself.

On a CPU every rank is on the CPU (gloo: the ranks are processes, each with its own share of the weights and of
the KV); on CUDA rank r is on the load's device index + r (NCCL for the all-reduce).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from inference.engine.errors import LoadError
from inference.engine.kv_budget import read_config
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.loaders.loading import load_model
from inference.engine.parallel.ranks import RankGroup, SplitRanks, StepBroadcast, open_store
from inference.engine.parallel.shard import Shard, check_split

log = logging.getLogger("pantheon.worker")

READY_POLL_S = 0.05  # how often rank 0 looks for the followers' "ready" while they load


@dataclass(frozen=True, slots=True)
class FollowerSpec:
    """What a follower process is told (as JSON on its command line): whose rank it is, where to meet, what to load."""

    path: str
    rank: int
    ranks: int
    port: int
    device: str
    parent_pid: int
    load: dict[str, Any]  # load_model's keyword arguments, as rank 0 loads with them
    log_format: str = "plain"  # rank 0's, so the worker's stderr stays one stream of one format
    log_level: str = "INFO"


def ready_key(rank: int) -> str:
    return f"ready/{rank}"


def rank_device(device: str, rank: int, ranks: int) -> str:
    """Rank `rank`'s device: the CPU, or the CUDA device `rank` places after the load's."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cpu"
    first = dev.index or 0
    if first + ranks > torch.cuda.device_count():
        raise LoadError(
            device, f"tensor_parallel {ranks} from {device} needs CUDA devices {first}..{first + ranks - 1}"
        )
    return f"cuda:{first + rank}"


def load_split_model(path: str | Path, ranks: int, *, device: str, **load: Any) -> LoadedModel:
    """Rank 0's part of a model split across `ranks` (the followers load theirs meanwhile), serving once every
    rank is ready; `load` is load_model's other keyword arguments. LoadError when the model does not divide by
    `ranks` (before any process starts) or a follower fails (with its reason)."""
    check_split(path, read_config(path), ranks)
    dev = torch.device(device)
    store = open_store(0, ranks, master=True)
    split = SplitRanks(ranks, RankGroup(store, 0, ranks, dev))
    try:
        for rank in range(1, ranks):
            spec = FollowerSpec(str(path), rank, ranks, store.port, rank_device(device, rank, ranks),
                                os.getpid(), _on_the_wire(load), *_log_setup())  # fmt: skip
            command = [sys.executable, "-m", "inference.engine.parallel.follower", json.dumps(asdict(spec))]
            split.followers.append(subprocess.Popen(command, env=_follower_env()))
        model = load_model(path, device=device, shard=Shard(0, ranks, split.group), **load)
        _wait_ready(path, store, split.followers)
        split.group.connect()
        split.sink = StepBroadcast(split.group, model.runner.cache)
        model.runner.model.step_sink = split.sink
    except BaseException:
        split.close()
        raise
    model.split = split
    log.info("%s: split over %d ranks (%s), followers %s; decode runs the eager forward (no decode plan or compiled "
             "graphs)", path, ranks, split.group.backend, split.follower_pids)  # fmt: skip
    return model


def _on_the_wire(load: dict[str, Any]) -> dict[str, Any]:
    """load_model's arguments as JSON can carry them (dtypes by name; the progress counter stays rank 0's)."""
    wire = {k: v for k, v in load.items() if k != "progress"}
    return {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v for k, v in wire.items()}


def _log_setup() -> tuple[str, str]:
    """This process's log format and level (contract/logs.py configured them)."""
    root = logging.getLogger()
    json_lines = any(type(handler.formatter).__name__ == "JsonFormatter" for handler in root.handlers)
    return "json" if json_lines else "plain", logging.getLevelName(root.getEffectiveLevel())


def _follower_env() -> dict[str, str]:
    """This environment, with this very engine's package first on the path: a follower runs the code rank 0 runs,
    whatever its working directory or installed copy."""
    root = str(Path(__file__).resolve().parents[3])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def _wait_ready(path: str | Path, store: Any, followers: list[subprocess.Popen]) -> None:
    """Until every follower has said it loaded; LoadError with its reason when one failed or exited instead."""
    pending = dict(enumerate(followers, start=1))
    while pending:
        for rank, proc in list(pending.items()):
            if store.check([ready_key(rank)]):
                said = store.get(ready_key(rank)).decode()
                if said != "ok":
                    raise LoadError(path, f"tensor-parallel rank {rank} failed to load: {said}")
                del pending[rank]
            elif proc.poll() is not None:
                raise LoadError(path, f"tensor-parallel rank {rank} exited with code {proc.returncode} while loading")
        if pending:
            time.sleep(READY_POLL_S)
