"""A served model's weights barrier: the attachment, the step barrier and the weights states of the spec's "Weights:
attachment and the step barrier", run by the worker that serves the model.

The barrier stops serving through the model's scheduler (`BarrierHost.pause`): a scheduler pauses at a step boundary,
so continuous batching keeps running until the sequences already decoding finish, new ones wait in its queue, and
then no forward pass runs until resume. Every call is answered with a message for the control plane (WEIGHTS_REPLY
or WEIGHTS_REFUSED carrying the spec's code); a quiesce that has to drain, a save and a load answer later, from
`tick()`, which the worker runs every loop. `tick()` also runs the three timers: the commit watchdog (a commit open
too long tears the set), the hold timeout (an unanswered quiesce resumes on its own) and the heartbeat timeout (a
silent attachment goes stale), and reports each change as WEIGHTS_CHANGED.

The checks of a holder call come in the spec's order: nothing attached (NOT_ATTACHED), then the attachment id and
label (NOT_ATTACHMENT_HOLDER), then the state. The token and its role were checked by the control plane before the
call was sent.

The records the barrier keeps and what it needs of its host are in barrier_state.py; the two calls that hold it
while a file is read or written (save, load) in barrier_transitions.py.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from inference.engine.contract import messages as p
from inference.engine.contract.weights import (
    Answer,
    Attached,
    AttachmentInfo,
    BarrierAnswer,
    Cleared,
    ClearedAttachment,
    CommitBegun,
    CommitEnded,
    HeartbeatAnswer,
    HeartbeatTimers,
    Quiesced,
    Release,
    ResidentWeights,
    ServedCheckpoint,
    WeightsCall,
    WeightsCode,
    WeightsOperation,
    WeightsSnapshot,
    WeightsTimers,
)
from inference.engine.serving_metrics import ModelMetrics
from inference.engine.weights.barrier_state import (
    ATTACH_REFUSAL_DETAILS,
    Attachment,
    BarrierHost,
    Commit,
    Pending,
    Refusal,
)
from inference.engine.weights.barrier_transitions import SaveAndLoad

RELEASE_CONTRACT = (
    "rebuild each storage exactly once and take every parameter as a view of it; to release, drop every rebuilt "
    "tensor (then torch.cuda.ipc_collect() on CUDA) and detach"
)


class WeightsBarrier(SaveAndLoad):
    """One model's barrier. `wall` and `clock` are injectable for tests (time.time and time.monotonic)."""

    def __init__(
        self,
        host: BarrierHost,
        timers: WeightsTimers,
        executor: Executor,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        metrics: ModelMetrics | None = None,
    ):
        self.metrics = metrics  # what the worker records of the barrier (serving_metrics.py); None: nothing
        self.host = host
        self.timers = timers
        self.executor = executor
        self.wall, self.clock = wall, clock
        self.weights_state = "clean"
        self.barrier = "serving"
        self.attachment: Attachment | None = None
        self.quiescing: Pending | None = None
        self.quiesced_at: float | None = None
        self.hold_deadline: float | None = None  # monotonic; None while the hold timer is suspended
        self.commit: Commit | None = None
        self.steps_since_load = 0
        self.saved_steps = 0
        self.transition: Pending | None = None  # a save or a load holding the barrier
        self.last_save: dict[str, Any] | None = None
        self.commit_overran: float | None = None
        self.last_hold_timeout_at: float | None = None
        self.last_overrun: dict[str, Any] | None = None
        self.exports_since_start = 0
        self.served_name = host.served_name
        self.base_name = host.served_name
        self.origin = "model"
        self.commits: int | None = 0
        self.manifest_hash: str | None = None
        self.parent: str | None = None  # the qualified name of the checkpoint the served weights descend from
        self.parent_step = 0  # that checkpoint's step (0: none), where a save's default step number continues

    @property
    def weights_state(self) -> str:
        """clean, writing or torn (spec: "Weights"); every change goes through the setter, the gauge's one write."""
        return self._weights_state

    @weights_state.setter
    def weights_state(self, state: str) -> None:
        self._weights_state = state
        if self.metrics is not None:
            self.metrics.weights_state(state)

    def serve_checkpoint(self, checkpoint: ServedCheckpoint) -> None:
        """The weights were loaded from `checkpoint` (a trainer's save): they answer under its qualified name."""
        self._name_weights(checkpoint.name, "checkpoint", checkpoint.manifest_hash, checkpoint.step)

    # -- calls ----------------------------------------------------------------------------------------------------

    def handle(self, request_id: str, call: WeightsCall) -> list[p.Message]:
        """Answers a call now, or starts it and answers from `tick()` (quiesce, save, load)."""
        handler = getattr(self, "_" + call.operation.value.replace("-", "_"))
        try:
            data = handler(request_id, call)
        except Refusal as refusal:
            return [self.refused(request_id, refusal)]
        return [] if data is None else [self.reply(request_id, data)]

    def reply(self, request_id: str, data: Answer) -> p.WeightsReply:
        return p.WeightsReply(request_id=request_id, data=data, snapshot=self.snapshot())

    def refused(self, request_id: str, refusal: Refusal) -> p.WeightsRefused:
        return p.WeightsRefused(
            request_id=request_id,
            code=refusal.code,
            message=refusal.message,
            reason=refusal.reason,
            details=refusal.details,
            snapshot=self.snapshot(),
        )

    def _holder(self, call: WeightsCall) -> Attachment:
        attachment = self.attachment
        if attachment is None:
            raise Refusal(WeightsCode.NOT_ATTACHED, f"nothing is attached to {self.served_name!r}")
        presented = call.attachment_id or ""
        if not hmac.compare_digest(presented.encode(), attachment.id.encode()) or call.label != attachment.label:
            raise Refusal(
                WeightsCode.NOT_ATTACHMENT_HOLDER, "this call needs the attachment id and the token that attached"
            )
        return attachment

    def _attach(self, request_id: str, call: WeightsCall) -> Attached:
        if (held := self.attachment) is not None:
            info = self._attachment_info(held)
            raise Refusal(
                WeightsCode.ALREADY_ATTACHED,
                f"{held.role} {held.label!r} is attached ({info.state})",
                role=held.role,
                label=held.label,
                state=info.state,
                attached_at=held.attached_at,
            )
        if self.transition is not None:
            raise Refusal(
                WeightsCode.NOT_ATTACHABLE, f"a {self.transition.operation} is in progress", "model_transition"
            )
        if self.weights_state == "writing":
            message = "a commit is still open; attach again once the watchdog has torn the set"
            raise Refusal(WeightsCode.NOT_ATTACHABLE, message, "weights_writing")
        if (why := self.host.attach_refusal()) is not None:
            detail = ATTACH_REFUSAL_DETAILS.get(why, "")
            raise Refusal(
                WeightsCode.NOT_ATTACHABLE, f"model {self.base_name!r} cannot be attached ({why}){detail}", why
            )
        exported = self.host.export()
        now, mono = self.wall(), self.clock()
        self.attachment = Attachment(secrets.token_urlsafe(24), call.role, call.label, now, now, mono)
        self.exports_since_start += 1
        return Attached(
            attachment_id=self.attachment.id,
            model=ResidentWeights(name=self.base_name, manifest_hash=self.manifest_hash),
            weights_state=self.weights_state,
            steps_since_load=self.steps_since_load,
            heartbeat=HeartbeatTimers(
                timeout_s=self.timers.heartbeat_timeout_s, interval_hint_s=self.timers.heartbeat_interval_hint_s
            ),
            producer=exported["producer"],
            storages=exported["storages"],
            parameters=exported["parameters"],
            release=Release(pinned_bytes=exported["pinned_bytes"], contract=RELEASE_CONTRACT),
            config=exported["config"],
            layout=self.host.layout(),
        )

    def _heartbeat(self, request_id: str, call: WeightsCall) -> HeartbeatAnswer:
        attachment = self._holder(call)
        attachment.last_heartbeat_at, attachment.last_heartbeat = self.wall(), self.clock()
        attachment.reported_stale = False
        return HeartbeatAnswer(
            attachment_state="active",
            timeout_s=self.timers.heartbeat_timeout_s,
            interval_hint_s=self.timers.heartbeat_interval_hint_s,
            weights_state=self.weights_state,
        )

    def _quiesce(self, request_id: str, call: WeightsCall) -> Quiesced | None:
        self._holder(call)
        if self.weights_state != "clean":
            raise Refusal(WeightsCode.WEIGHTS_NOT_CLEAN, f"the weights are {self.weights_state}")
        if self.quiescing is not None:
            raise Refusal(WeightsCode.ALREADY_QUIESCED, "a quiesce is still draining", "quiesce_in_progress")
        if self.barrier == "quiesced":
            raise Refusal(WeightsCode.ALREADY_QUIESCED, "this attachment already holds the barrier")
        if self.transition is not None:
            raise Refusal(WeightsCode.PAUSE_IN_PROGRESS, f"a {self.transition.operation} holds the barrier")
        if self.host.queue_full():
            raise Refusal(WeightsCode.QUEUE_FULL, f"model {self.served_name!r} has no queue place left to hold")
        self.host.pause()
        drain = self.timers.quiesce_drain_timeout_s
        self.quiescing = Pending(request_id, WeightsOperation.QUIESCE, deadline=self.clock() + drain)
        return self._finish_quiesce() if not self.host.running() else None

    def _finish_quiesce(self) -> Quiesced:
        """Nothing runs any more: drop what the old weights computed, hold, start the hold timer."""
        self.quiescing = None
        self.host.drop_caches()
        self.barrier = "quiesced"
        self.quiesced_at = self.wall()
        self.hold_deadline = self.clock() + self.timers.hold_timeout_s
        return Quiesced(
            held_requests=self.host.waiting(),
            held_batch_chunks=0,
            weights_state=self.weights_state,
            quiesced_at=self.quiesced_at,
            hold_deadline=self.quiesced_at + self.timers.hold_timeout_s,
        )

    def _resume(self, request_id: str, call: WeightsCall) -> BarrierAnswer:
        self._holder(call)
        if self.quiescing is not None:
            raise Refusal(
                WeightsCode.NOT_QUIESCED, "quiesce is still draining; wait for it to return", "quiesce_in_progress"
            )
        if self.commit is not None and self.weights_state == "writing":
            raise Refusal(WeightsCode.WEIGHTS_NOT_CLEAN, "a commit is open; end it first", "commit_open")
        if self.barrier == "quiesced" and self.transition is None:
            self._release_hold()
        return BarrierAnswer(barrier=self.barrier, weights_state=self.weights_state)

    def _release_hold(self) -> None:
        if self.metrics is not None and self.quiesced_at is not None:
            self.metrics.hold_released(self.wall() - self.quiesced_at)
        self.barrier, self.quiesced_at, self.hold_deadline = "serving", None, None
        self.host.resume()

    def _commit_begin(self, request_id: str, call: WeightsCall) -> CommitBegun:
        attachment = self._holder(call)
        if self.barrier != "quiesced":
            raise Refusal(WeightsCode.NOT_QUIESCED, "quiesce before commit-begin")
        if self.weights_state != "clean":
            raise Refusal(WeightsCode.WEIGHTS_NOT_CLEAN, f"the weights are {self.weights_state}")
        if self.transition is not None:
            raise Refusal(WeightsCode.PAUSE_IN_PROGRESS, f"a {self.transition.operation} holds the barrier")
        self.weights_state = "writing"
        self.commit = Commit(attachment.id, self.wall(), self.clock(), self.host.forward_steps())
        self.hold_deadline = None
        return CommitBegun(weights_state="writing", began_at=self.commit.began_at, watchdog_ms=self._watchdog_ms)

    def _commit_end(self, request_id: str, call: WeightsCall) -> CommitEnded:
        attachment = self._holder(call)
        commit = self.commit
        if commit is None:
            raise Refusal(WeightsCode.NO_OPEN_COMMIT, "no commit is open")
        if commit.owner != attachment.id:
            raise Refusal(WeightsCode.NOT_ATTACHMENT_HOLDER, "only the attachment that began the commit may end it")
        commit_ms = (self.clock() - commit.began) * 1000.0
        overran = self.weights_state == "torn" or commit_ms > self._watchdog_ms
        self.host.weights_written()
        self.weights_state, self.commit = "clean", None
        self.steps_since_load += 1
        if self.commits is not None:
            self.commits += 1
        if self.metrics is not None:
            self.metrics.committed()
        if overran:
            self.last_overrun = {"at": self.wall(), "commit_ms": commit_ms}
        if self.barrier == "quiesced":
            self.hold_deadline = self.clock() + self.timers.hold_timeout_s
        return CommitEnded(
            weights_state="clean",
            steps_since_load=self.steps_since_load,
            commit_ms=commit_ms,
            overran=overran,
            forward_steps_during_commit=self.host.forward_steps() - commit.forward_steps,
        )

    def _detach(self, request_id: str, call: WeightsCall) -> BarrierAnswer:
        self._holder(call)
        if self.weights_state == "writing":
            self._tear()
        if self.barrier == "quiesced" and self.transition is None:
            self._release_hold()
        if self.quiescing is not None:  # the drain is abandoned: answer it and serve again
            self.quiescing = None
            self.host.resume()
        self.attachment = None
        return BarrierAnswer(barrier=self.barrier, weights_state=self.weights_state)

    def _clear_stale(self, request_id: str, call: WeightsCall) -> Cleared:
        attachment = self.attachment
        if attachment is None:
            raise Refusal(WeightsCode.NOT_ATTACHED, f"nothing is attached to {self.served_name!r}")
        info = self._attachment_info(attachment)
        if info.state != "stale":
            raise Refusal(
                WeightsCode.ATTACHMENT_NOT_STALE, f"{attachment.label!r} is active; the holder may be mid-commit"
            )
        if self.barrier == "quiesced" and self.commit is None and self.transition is None:
            self._release_hold()
        self.attachment = None
        cleared = ClearedAttachment(role=attachment.role, label=attachment.label, stale_since=info.stale_since)
        return Cleared(cleared=cleared, weights_state=self.weights_state, barrier=self.barrier)

    # -- what happens between calls -------------------------------------------------------------------------------

    def tick(self) -> list[p.Message]:
        """Finishes what can finish (a drained quiesce, a save, a load's next phase) and runs the timers."""
        out: list[p.Message] = []
        now = self.clock()
        changed = False
        if (q := self.quiescing) is not None:
            if not self.host.running():
                out.append(self.reply(q.request_id, self._finish_quiesce()))
            elif now >= q.deadline:
                self.quiescing = None
                self.host.resume()
                message = f"running requests did not finish within {self.timers.quiesce_drain_timeout_s:g} s"
                out.append(self.refused(q.request_id, Refusal(WeightsCode.MODEL_BUSY, message, "drain_timeout")))
        if self.transition is not None:
            out += self._advance_transition(now)
        if self.weights_state == "writing" and self.commit is not None and self.transition is None:
            if (now - self.commit.began) * 1000.0 > self._watchdog_ms:
                self.commit_overran = self.wall()
                out += self._tear()
                changed = True
        if self.hold_deadline is not None and now >= self.hold_deadline and self.weights_state == "clean":
            self.last_hold_timeout_at = self.wall()
            self._release_hold()
            changed = True
        if (a := self.attachment) is not None and not a.reported_stale and self._is_stale(a, now):
            a.reported_stale = True
            changed = True
        if changed:
            out.append(p.WeightsChanged(snapshot=self.snapshot()))
        return out

    def next_deadline(self) -> float | None:
        """The monotonic time of the next timer, so the worker's idle wait ends in time for it."""
        times = [self.hold_deadline] if self.hold_deadline is not None else []
        if self.commit is not None and self.weights_state == "writing":
            times.append(self.commit.began + self._watchdog_ms / 1000.0)
        if (a := self.attachment) is not None and not a.reported_stale:
            times.append(a.last_heartbeat + self.timers.heartbeat_timeout_s)
        if self.quiescing is not None or self.transition is not None:
            times.append(self.clock())
        return min(times) if times else None

    def _tear(self) -> list[p.Message]:
        """The weights are half-written: nothing is served until a load restores them; held requests are refused."""
        self.weights_state = "torn"
        self.hold_deadline = None
        return self.host.refuse_waiting(
            f"the weights of {self.served_name!r} are torn; restore them with POST /api/weights/load"
        )

    # -- status ---------------------------------------------------------------------------------------------------

    @property
    def _watchdog_ms(self) -> float:
        return self.timers.commit_watchdog_ms

    def _is_stale(self, attachment: Attachment, now: float) -> bool:
        return now - attachment.last_heartbeat > self.timers.heartbeat_timeout_s

    def _attachment_info(self, attachment: Attachment) -> AttachmentInfo:
        stale = self._is_stale(attachment, self.clock())
        return AttachmentInfo(
            state="stale" if stale else "active",
            role=attachment.role,
            label=attachment.label,
            attached_at=attachment.attached_at,
            last_heartbeat_at=attachment.last_heartbeat_at,
            stale_since=attachment.last_heartbeat_at + self.timers.heartbeat_timeout_s if stale else None,
            reference=attachment.reference,
        )

    def snapshot(self) -> WeightsSnapshot:
        commit = None
        if self.commit is not None:
            open_ms = (self.clock() - self.commit.began) * 1000.0
            commit = {
                "began_at": self.commit.began_at,
                "open_ms": open_ms,
                "watchdog_ms": self._watchdog_ms,
                "overran": self.weights_state == "torn" or open_ms > self._watchdog_ms,
            }
        return WeightsSnapshot(
            model=self.host.name,
            served_name=self.served_name,
            base_name=self.base_name,
            origin=self.origin,
            commits=self.commits,
            manifest_hash=self.manifest_hash,
            weights_state=self.weights_state,
            barrier=self.barrier,
            attachment=None if self.attachment is None else self._attachment_info(self.attachment),
            quiesced_at=self.quiesced_at,
            held_requests=self.host.waiting() if self.barrier == "quiesced" else None,
            steps_since_load=self.steps_since_load,
            unsaved_commits=self.steps_since_load - self.saved_steps,
            last_save=self.last_save,
            commit=commit,
            commit_overran=self.commit_overran,
            last_hold_timeout_at=self.last_hold_timeout_at,
            last_overrun=self.last_overrun,
            exports_since_start=self.exports_since_start,
            transition=None if self.transition is None else self.transition.operation.value,
            attach_refusal=self.host.attach_refusal(),
            layout=self.host.layout(),
            forward_steps=self.host.forward_steps(),
        )
