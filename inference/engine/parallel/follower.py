"""A follower rank of a split model: `python -m inference.engine.parallel.follower SPEC` (rank 0 starts it, with
SPEC its FollowerSpec as JSON). Loads its part of the model, says so through the ranks' store, joins the groups and
runs the steps rank 0 broadcasts until it is told to stop; it exits when its rank 0's process goes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import torch

from inference.engine.contract.logs import configure_worker_logging
from inference.engine.execution.step_threads import apply_step_threads, choose_step_threads
from inference.engine.loaders.loading import load_model
from inference.engine.parallel.ranks import RankGroup, follow_steps, open_store
from inference.engine.parallel.shard import Shard
from inference.engine.parallel.split_load import FollowerSpec, ready_key

log = logging.getLogger("pantheon.worker")

PARENT_POLL_S = 1.0


def exit_with_parent(parent_pid: int) -> None:
    """Ends this process once `parent_pid` is no longer its parent (rank 0's worker died without closing the
    ranks): a follower blocked in a collective would otherwise wait for it for as long as the group allows."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def follow(spec: FollowerSpec) -> int:
    exit_with_parent(spec.parent_pid)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = open_store(spec.port, spec.ranks, master=False)
    group = RankGroup(store, spec.rank, spec.ranks, device)
    try:
        model = load_model(spec.path, device=device, shard=Shard(spec.rank, spec.ranks, group), **spec.load)
    except Exception as exc:
        store.set(ready_key(spec.rank), f"{type(exc).__name__}: {exc}")
        return 1
    if device.type == "cpu":
        threads = max(1, len(os.sched_getaffinity(0)) // spec.ranks)
        apply_step_threads(choose_step_threads(model.config, model.torch_matmuls, threads))
    store.set(ready_key(spec.rank), "ok")
    group.connect()
    try:
        steps = follow_steps(group, model.runner.model, model.runner.cache)
    except RuntimeError as exc:  # gloo's word for a peer that closed its end: rank 0's process ended unclosed
        log.warning("tensor-parallel rank %d of %s: rank 0 is gone (%s)", spec.rank, spec.path, exc)
        return 1
    log.info("tensor-parallel rank %d of %s: closed after %d steps", spec.rank, spec.path, steps)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = FollowerSpec(**json.loads(argv[0]))
    configure_worker_logging(spec.log_format, spec.log_level)
    return follow(spec)


if __name__ == "__main__":
    sys.exit(main())
