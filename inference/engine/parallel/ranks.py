"""The ranks of a tensor-parallel model talking over torch.distributed: the all-reduce its row-parallel layers sum
with, and each step's plan, which rank 0 broadcasts and the other ranks (the followers) run.

Rank 0 is the worker that hosts the model: its scheduler, KV bookkeeping (block tables, prefix cache, sessions) and
sampler are the only ones. What the other ranks need of a step is what reaches the model's forward: the step's token
ids, its KV views (positions, write rows, block tables, masks: `CacheView`, already resolved against rank 0's
tables, the same on every rank since every rank's pool has the same blocks of its own heads), the rows whose
logits are kept, and the changes rank 0 made to its pool's tensors since the last step (blocks zeroed or copied:
`KVCache.change`'s journal). `StepBroadcast` sends that as the first thing of every forward pass, so a follower's
pool holds, head for head, what rank 0's holds, and both run the same forward with the same all-reduces in the
same order (SGLang's TP workers receive their batch the same way, as a pickled object over a gloo group).

The groups are made directly (ProcessGroupGloo, ProcessGroupNCCL over a TCPStore on loopback) rather than with
init_process_group, whose group is one per process: a worker may host several split models, each with ranks of
its own. The plan always goes over gloo (host memory); the all-reduce over NCCL where the model is on CUDA.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import pickle
import subprocess
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from inference.engine.contract import messages as p
from inference.engine.kv.kv_cache import CacheView, KVCache, PoolChange
from inference.engine.model.transformer import Transformer

# A follower waits for the next step for as long as the model stays loaded, which may be days; the ranks' own
# processes end a follower whose rank 0 has gone (follower.py), so the wait needs no bound of its own.
WAIT_FOR_STEPS = datetime.timedelta(days=3650)
LOOPBACK = "127.0.0.1"
FOLLOWER_EXIT_S = 30.0  # how long a closed follower may take to exit before it is killed

log = logging.getLogger("pantheon.worker")


def open_store(port: int, ranks: int, *, master: bool) -> dist.TCPStore:
    """The ranks' rendezvous on loopback: rank 0 holds it (port 0: a free port, then `store.port`)."""
    return dist.TCPStore(LOOPBACK, port, ranks, master, timeout=datetime.timedelta(minutes=5), wait_for_workers=False)


class RankGroup:
    """One rank's end of a split model's groups: `connect` joins them (every rank must), then `all_reduce` sums a
    tensor over the ranks in place and `broadcast` hands rank 0's object to every rank."""

    def __init__(self, store: dist.Store, rank: int, ranks: int, device: torch.device):
        self.store, self.rank, self.ranks, self.device = store, rank, ranks, device
        self.plan: dist.ProcessGroup | None = None
        self.compute: dist.ProcessGroup | None = None

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def connect(self) -> None:
        """Joins the plan group and the all-reduce group (blocks until every rank has called it)."""
        self.plan = dist.ProcessGroupGloo(dist.PrefixStore("plan", self.store), self.rank, self.ranks, WAIT_FOR_STEPS)
        if self.device.type == "cuda":
            store = dist.PrefixStore("nccl", self.store)
            self.compute = dist.ProcessGroupNCCL(store, self.rank, self.ranks)
        else:
            self.compute = self.plan

    def all_reduce(self, tensor: torch.Tensor) -> None:
        # tensor: any shape, contiguous; summed in place
        self.compute.allreduce([tensor]).wait()

    def broadcast(self, obj: object = None) -> object:
        """Rank 0's `obj` on every rank: its pickle's length, then its bytes."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([data.numel()])
        else:
            size = torch.zeros(1, dtype=torch.long)
        self.plan.broadcast([size], options).wait()
        if self.rank != 0:
            data = torch.empty(int(size), dtype=torch.uint8)
        self.plan.broadcast([data], options).wait()
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())


@dataclasses.dataclass(slots=True)
class StepPlan:
    """What a follower runs of one forward pass (see the module's docstring); tensors on the host."""

    changes: list[PoolChange]
    tokens: torch.Tensor  # [T] long
    views: list[CacheView]
    select: torch.Tensor | None  # [N] long


def _moved(view: CacheView, device: torch.device) -> CacheView:
    fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(view)}
    return CacheView(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in fields.items()})


class StepBroadcast:
    """Rank 0's model's step sink (Transformer.step_sink): broadcasts each forward pass's plan before it runs. Only
    the worker's loop steps a model, so plans and all-reduces never interleave."""

    def __init__(self, group: RankGroup, cache: KVCache):
        self.group, self.cache = group, cache
        cache.journal = []

    def __call__(self, tokens: torch.Tensor, views: list[CacheView], select: torch.Tensor | None) -> None:
        host = torch.device("cpu")
        changes, self.cache.journal = self.cache.journal, []
        on_host = select if select is None else select.cpu()
        self.group.broadcast(StepPlan(changes, tokens.cpu(), [_moved(v, host) for v in views], on_host))

    def close(self) -> None:
        """Tells the followers to stop (they leave their loop and exit)."""
        self.group.broadcast(None)


@torch.inference_mode()
def follow_steps(group: RankGroup, model: Transformer, cache: KVCache) -> int:
    """A follower's loop: runs each plan rank 0 broadcasts, until it broadcasts None; the number of steps run. Only
    rank 0 samples, so a follower stops at the final hidden states (its output head would be rank 0's again)."""
    steps = 0
    while (plan := group.broadcast()) is not None:
        for change in plan.changes:
            cache.change(change)
        views = [_moved(v, cache.device) for v in plan.views]
        select = None if plan.select is None else plan.select.to(cache.device)
        model.forward(plan.tokens.to(cache.device), cache, views, select=select, hidden=True)
        steps += 1
    return steps


@dataclass(slots=True)
class SplitRanks:
    """The follower ranks of a split model as rank 0 holds them."""

    ranks: int
    group: RankGroup
    followers: list[subprocess.Popen] = field(default_factory=list)
    sink: StepBroadcast | None = None  # set once every rank has joined
    closed: bool = False

    @property
    def follower_pids(self) -> list[int]:
        return [proc.pid for proc in self.followers]

    def report(self) -> p.TensorParallel:
        """What LOADED says of the split (/admin/models shows it)."""
        return p.TensorParallel(ranks=self.ranks, backend=self.group.backend, follower_pids=self.follower_pids)

    def close(self) -> None:
        """Ends the followers: told to stop when they serve, else (or when they do not exit) killed; and waited for."""
        if self.closed:
            return
        self.closed = True
        if self.sink is not None and all(proc.poll() is None for proc in self.followers):
            try:
                self.sink.close()
            except RuntimeError:  # a follower went meanwhile: the others are killed below
                log.warning("tensor-parallel ranks: a follower left before the close", exc_info=True)
        for proc in self.followers:
            try:
                proc.wait(timeout=FOLLOWER_EXIT_S if self.sink is not None else 0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.info("tensor-parallel ranks ended: followers %s exited %s", self.follower_pids,
                 [proc.returncode for proc in self.followers])  # fmt: skip
