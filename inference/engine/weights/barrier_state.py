"""The parts of a weights barrier (barrier.py): what it needs of the model it guards, the refusal it answers a call
with, and the records it keeps between calls (the attachment, the open commit, a call answered later)."""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from inference.engine.contract import messages as p
from inference.engine.contract.weights import LoadTarget, SaveRequest, WeightsCode, WeightsOperation


class BarrierHost(Protocol):
    """What the barrier needs of the model it guards (ServedWeights provides it over a HostedModel)."""

    name: str
    served_name: str  # what the weights answer under until a save or a load names them

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def running(self) -> int: ...
    def waiting(self) -> int: ...
    def queue_full(self) -> bool: ...
    def forward_steps(self) -> int: ...
    def drop_caches(self) -> None: ...
    def weights_written(self) -> None: ...
    def refuse_waiting(self, message: str) -> list[p.Message]: ...
    def attach_refusal(self) -> str | None: ...
    def layout(self) -> str | None: ...
    def export(self) -> dict[str, Any]: ...
    def save(self, request: SaveRequest, parent: str | None, base_name: str) -> dict[str, Any]: ...
    def read_checkpoint(self, target: LoadTarget) -> Any: ...
    def write_weights(self, tensors: Any) -> None: ...


# What an attach refusal's message adds to its reason, where the reason alone does not say what to do.
ATTACH_REFUSAL_DETAILS = {
    "tensor_parallel": ": it is split across ranks, each holding a part of every layer; load it with "
    "tensor_parallel 1 to attach a trainer",
}


class Refusal(Exception):
    """A call refused with the spec's code; `reason` when the spec names one."""

    def __init__(self, code: WeightsCode, message: str, reason: str | None = None, **details: Any):
        super().__init__(message)
        self.code, self.message, self.reason, self.details = code, message, reason, details


class ShapeMismatch(Refusal):
    """The checkpoint's parameters do not fit the resident storages (raised by `BarrierHost.read_checkpoint`)."""

    def __init__(self, message: str):
        super().__init__(WeightsCode.SHAPE_MISMATCH, message)


def as_refusal(exc: BaseException, code: WeightsCode) -> Refusal:
    """What a save or a load that raised `exc` is refused with: its own refusal, else `code` naming the exception."""
    if isinstance(exc, Refusal):
        return exc
    return Refusal(code, f"{type(exc).__name__}: {exc}")


@dataclass(slots=True)
class Attachment:
    id: str
    role: str
    label: str
    attached_at: float
    last_heartbeat_at: float  # wall clock, for status
    last_heartbeat: float  # monotonic, for the timeout
    reported_stale: bool = False

    @property
    def reference(self) -> str:
        """8 characters that name the attachment in the audit log without giving its id away."""
        return hashlib.sha256(self.id.encode()).hexdigest()[:8]


@dataclass(slots=True)
class Commit:
    owner: str  # the attachment id that began it
    began_at: float
    began: float  # monotonic
    forward_steps: int  # the scheduler's counter when it began (a test asserts it does not move)


@dataclass(slots=True)
class Pending:
    """A call answered later: a quiesce draining, a save or a load running on the executor."""

    request_id: str
    operation: WeightsOperation
    deadline: float = 0.0  # for a drain
    future: Future | None = None
    body: SaveRequest | LoadTarget | None = None
    phase: str = "drain"  # load: "read" -> "drain" -> "write"; quiesce: "drain"; save: "save"
    payload: Any = None
    paused_here: bool = False  # whether this call paused serving (and so resumes it when it ends)
