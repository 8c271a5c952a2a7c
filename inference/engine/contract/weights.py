"""The weights barrier's words on the wire: the operations a trainer (or operator) calls, the timers, and the state a
worker reports after every call and on every change its timers make.

The worker that serves a model owns that model's barrier (engine/weights/barrier.py); the control plane keeps the
latest `WeightsSnapshot` of each model beside its placement, so `/v1` can tell which weights answered, refuse while
the set is torn and refuse an auto-load that would discard unsaved commits, without asking the worker. A refusal
carries the spec's code (`NOT_ATTACHED`, `WEIGHTS_NOT_CLEAN`, ...) and its `reason`; the control plane alone turns a
code into an HTTP status (weights/errors.py).

Times are seconds since the epoch (time.time()), so both processes can print them.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec

WeightsState = Literal["clean", "writing", "torn"]
BarrierState = Literal["serving", "quiesced"]
AttachmentState = Literal["active", "stale"]
Origin = Literal["model", "checkpoint", "adapter"]


class WeightsOperation(enum.StrEnum):
    """What a WEIGHTS_CALL asks of a model's barrier (the route it came from, without the prefix)."""

    ATTACH = "attach"
    DETACH = "detach"
    HEARTBEAT = "heartbeat"
    QUIESCE = "quiesce"
    RESUME = "resume"
    COMMIT_BEGIN = "commit-begin"
    COMMIT_END = "commit-end"
    CLEAR_STALE = "clear-stale"
    SAVE = "save"
    LOAD = "load"


class WeightsCode(enum.StrEnum):
    """Every code a weights refusal carries (the spec's), from the worker's barrier or the control plane's own
    checks. weights/errors.py gives each its HTTP status; a WEIGHTS_REFUSED whose code is not one of these does not
    decode, so no unknown code reaches a client."""

    WEIGHTS_UNAUTHORIZED = "WEIGHTS_UNAUTHORIZED"
    WEIGHTS_FORBIDDEN = "WEIGHTS_FORBIDDEN"
    RATE_LIMITED = "RATE_LIMITED"
    NOT_ATTACHMENT_HOLDER = "NOT_ATTACHMENT_HOLDER"
    NOT_ATTACHED = "NOT_ATTACHED"
    ALREADY_ATTACHED = "ALREADY_ATTACHED"
    ALREADY_QUIESCED = "ALREADY_QUIESCED"
    NOT_QUIESCED = "NOT_QUIESCED"
    NO_OPEN_COMMIT = "NO_OPEN_COMMIT"
    WEIGHTS_NOT_CLEAN = "WEIGHTS_NOT_CLEAN"
    PAUSE_IN_PROGRESS = "PAUSE_IN_PROGRESS"
    BARRIER_UNAVAILABLE = "BARRIER_UNAVAILABLE"
    MODEL_BUSY = "MODEL_BUSY"
    ATTACHMENT_NOT_STALE = "ATTACHMENT_NOT_STALE"
    SHAPE_MISMATCH = "SHAPE_MISMATCH"
    CHECKPOINT_EXISTS = "CHECKPOINT_EXISTS"
    WEIGHTS_UNSAVED = "WEIGHTS_UNSAVED"
    MODEL_NOT_LOADED = "MODEL_NOT_LOADED"
    NOT_ATTACHABLE = "NOT_ATTACHABLE"
    INVALID_REQUEST = "INVALID_REQUEST"
    CHECKPOINT_CORRUPT = "CHECKPOINT_CORRUPT"
    CHECKPOINT_NOT_FOUND = "CHECKPOINT_NOT_FOUND"
    NOT_FOUND = "NOT_FOUND"
    QUEUE_FULL = "QUEUE_FULL"
    WEIGHTS_TORN = "WEIGHTS_TORN"
    SAVE_FAILED = "SAVE_FAILED"
    LOAD_FAILED = "LOAD_FAILED"
    INTERNAL = "INTERNAL"
    SERVICE_UNAVAILABLE = "SERVICE_UNAVAILABLE"  # the database cannot be reached (pantheon_site/errors.py)


class WeightsTimers(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The spec's timers (WEIGHTS_* settings), sent with every LOAD so the worker runs them."""

    hold_timeout_s: float = 5.0
    commit_watchdog_ms: float = 800.0
    heartbeat_timeout_s: float = 30.0
    quiesce_drain_timeout_s: float = 60.0
    heartbeat_interval_hint_s: float = 5.0

    def __post_init__(self) -> None:
        if min(self.hold_timeout_s, self.commit_watchdog_ms, self.heartbeat_timeout_s) <= 0:
            raise ValueError("the weights timers must be positive")
        if self.quiesce_drain_timeout_s < 0:
            raise ValueError("quiesce_drain_timeout_s must not be negative")
        if not 0 < self.heartbeat_interval_hint_s < self.heartbeat_timeout_s:
            raise ValueError("heartbeat_interval_hint_s must be positive and below heartbeat_timeout_s")


class ServedCheckpoint(msgspec.Struct, array_like=True, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """The trainer checkpoint a LOAD serves (its manifest's qualified name, weights_sha256 and step): the barrier
    answers under that name from the start, as after POST /api/weights/load of it, and a save continues its step
    numbers. Sent when the catalogue row records the checkpoint its model serves (a restart, a reload)."""

    name: str
    manifest_hash: str
    step: int = 0

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> ServedCheckpoint:
        """From a checkpoint's manifest.json (contract/checkpoint.py read_manifest)."""
        step = manifest.get("step")
        return cls(
            name=str(manifest.get("name") or ""),
            manifest_hash=manifest["weights_sha256"],
            step=step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0,
        )


class AttachmentInfo(msgspec.Struct, array_like=True, kw_only=True):
    """The attachment as anyone may see it: never its id."""

    state: AttachmentState
    role: str
    label: str
    attached_at: float
    last_heartbeat_at: float
    stale_since: float | None
    reference: str  # 8 characters derived from the id, for the audit log


class WeightsSnapshot(msgspec.Struct, array_like=True, kw_only=True):
    """A model's barrier after a call or a timer: what GET /api/weights/status shows, plus what serving reads
    (`served_name`, `origin`, `commits` for X-miLLM-Model; `unsaved_commits` for the weights_unsaved refusal)."""

    model: str  # the worker's name for the model (the name it was loaded under)
    served_name: str  # the name its weights answer under: the base name, or a checkpoint's qualified name
    base_name: str  # the base model's served name, also after a save or a checkpoint load
    origin: Origin
    commits: int | None  # commit-ends since served_name was set
    manifest_hash: str | None  # the weights_sha256 of the checkpoint it was loaded from
    weights_state: WeightsState
    barrier: BarrierState
    attachment: AttachmentInfo | None
    quiesced_at: float | None
    held_requests: int | None
    steps_since_load: int
    unsaved_commits: int
    last_save: dict[str, Any] | None  # {checkpoint_sha256, at, path}
    commit: dict[str, Any] | None  # {began_at, open_ms, watchdog_ms, overran} while a commit is open or torn
    commit_overran: float | None  # when the watchdog last tore the set
    last_hold_timeout_at: float | None
    last_overrun: dict[str, Any] | None  # {at, commit_ms}: the last late commit-end
    exports_since_start: int
    transition: str | None  # "save" or "load" while one holds the barrier
    attach_refusal: str | None  # the model's own NOT_ATTACHABLE reason (tensor_parallel, gguf, quantized, dtype, ...)
    layout: str | None  # how the exported views relate to the engine's storage ("views", "views+repack")
    forward_steps: int  # the scheduler's forward passes so far


class SaveRequest(msgspec.Struct, tag="save", array_like=True, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a save writes: `root`/<run_id>/step-<step>/ (root: the control plane's checkpoint folder). Without a
    step the barrier continues the lineage's numbering."""

    run_id: str
    root: str
    step: int | None = None


class LoadTarget(msgspec.Struct, tag="load", array_like=True, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a weights load writes in place (weights/services.py decides it): the directory, the name the weights
    then answer under and where they come from; for a checkpoint its manifest hash, parent and step, and whether its
    sha256 is verified before anything is touched."""

    path: str
    served_name: str
    origin: Origin = "model"
    manifest_hash: str | None = None
    parent: str | None = None
    step: int = 0
    verify: bool = False


class WeightsCall(msgspec.Struct, array_like=True, kw_only=True, forbid_unknown_fields=True):
    """What travels inside a WEIGHTS_CALL message (see messages.py): the operation, who asks (the token's role and
    label, already checked by the control plane), the attachment id they presented, and what a save or a load
    writes (the other calls take nothing)."""

    operation: WeightsOperation
    role: str = ""
    label: str = ""
    attachment_id: str | None = None
    body: SaveRequest | LoadTarget | None = None


# -- what a call answers (WEIGHTS_REPLY's `data`; the route's `data`, as answer_fields gives it) -----------------


class WeightsAnswer(msgspec.Struct, kw_only=True, tag_field="answer", tag=str.lower):
    """The base of every answer: tagged by its class's name, so WEIGHTS_REPLY decodes the right one."""


class ResidentWeights(msgspec.Struct, kw_only=True):
    name: str  # the base model's served name
    manifest_hash: str | None


class HeartbeatTimers(msgspec.Struct, kw_only=True):
    timeout_s: float
    interval_hint_s: float


class Release(msgspec.Struct, kw_only=True):
    pinned_bytes: int
    contract: str


class Attached(WeightsAnswer):
    """ATTACH: the attachment id (given once, here), and every served parameter as a view of a storage the trainer
    maps (engine/weights/handles.py: `storages`, `parameters`, `producer`)."""

    attachment_id: str
    model: ResidentWeights
    weights_state: WeightsState
    steps_since_load: int
    heartbeat: HeartbeatTimers
    producer: dict[str, Any]
    storages: list[dict[str, Any]]
    parameters: list[dict[str, Any]]
    release: Release
    config: dict[str, Any] | None
    layout: str | None


class HeartbeatAnswer(WeightsAnswer):
    attachment_state: AttachmentState
    timeout_s: float
    interval_hint_s: float
    weights_state: WeightsState


class Quiesced(WeightsAnswer):
    held_requests: int
    held_batch_chunks: int
    weights_state: WeightsState
    quiesced_at: float
    hold_deadline: float


class BarrierAnswer(WeightsAnswer):
    """RESUME and DETACH: the barrier and the weights as the call left them."""

    barrier: BarrierState
    weights_state: WeightsState


class CommitBegun(WeightsAnswer):
    weights_state: WeightsState
    began_at: float
    watchdog_ms: float


class CommitEnded(WeightsAnswer):
    weights_state: WeightsState
    steps_since_load: int
    commit_ms: float
    overran: bool
    forward_steps_during_commit: int


class ClearedAttachment(msgspec.Struct, kw_only=True):
    role: str
    label: str
    stale_since: float | None


class Cleared(WeightsAnswer):
    cleared: ClearedAttachment
    weights_state: WeightsState
    barrier: BarrierState


class Saved(WeightsAnswer):
    """SAVE: the checkpoint's manifest (engine/weights/checkpoint_files.py) and where it was written."""

    run_id: str
    step: int
    parent: str | None
    base_model: str
    weights_sha256: str
    created_at: str
    name: str
    path: str


class Loaded(WeightsAnswer):
    weights_state: WeightsState
    served_name: str
    steps_since_load: int


Answer = Attached | HeartbeatAnswer | Quiesced | BarrierAnswer | CommitBegun | CommitEnded | Cleared | Saved | Loaded


def answer_fields(answer: WeightsAnswer) -> dict[str, Any]:
    """An answer as the route's `data`: its fields, without the tag that only the wire needs."""
    fields = msgspec.to_builtins(answer)
    del fields["answer"]
    return fields
