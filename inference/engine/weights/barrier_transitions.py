"""The two calls that hold a weights barrier while a file is read or written (barrier.py): a save writes the served
weights to a checkpoint on the worker's load thread; a load reads and checks a checkpoint there, pauses serving,
waits for the running requests to finish, then writes the weights in place. Either answers from `tick()` when it
ends; a write that breaks off partway leaves the set torn.
"""

from __future__ import annotations

from typing import Any

import msgspec

from inference.engine.contract import messages as p
from inference.engine.contract.weights import (
    Loaded,
    LoadTarget,
    Saved,
    SaveRequest,
    WeightsCall,
    WeightsCode,
    WeightsOperation,
)
from inference.engine.weights.barrier_state import Pending, Refusal, as_refusal


class SaveAndLoad:
    """The save and load half of WeightsBarrier (whose state and helpers these methods use)."""

    def _save(self, request_id: str, call: WeightsCall) -> None:
        self._holder(call)
        if self.weights_state != "clean":
            raise Refusal(
                WeightsCode.WEIGHTS_NOT_CLEAN, f"the weights are {self.weights_state}; a save needs them clean"
            )
        if self.transition is not None or self.quiescing is not None:
            raise Refusal(WeightsCode.PAUSE_IN_PROGRESS, "a quiesce, save or load is in progress")
        request = _body_of(call, SaveRequest)
        if request.step is None:  # the lineage's next number
            request = msgspec.structs.replace(request, step=self.parent_step + (self.commits or 0))
        pending = Pending(request_id, WeightsOperation.SAVE, body=request, phase="save")
        pending.future = self.executor.submit(self.host.save, request, self.parent, self.base_name)
        self.transition = pending
        self.hold_deadline = None

    def _load(self, request_id: str, call: WeightsCall) -> None:
        if self.weights_state == "writing":
            raise Refusal(
                WeightsCode.WEIGHTS_NOT_CLEAN,
                "a commit is open; end it (or let the watchdog tear the set) first",
                "commit_open",
            )
        if self.transition is not None or self.quiescing is not None:
            raise Refusal(WeightsCode.PAUSE_IN_PROGRESS, "a quiesce, save or load is in progress")
        target = _body_of(call, LoadTarget)
        pending = Pending(request_id, WeightsOperation.LOAD, body=target, phase="read")
        pending.future = self.executor.submit(self.host.read_checkpoint, target)
        self.transition = pending
        self.hold_deadline = None

    def _advance_transition(self, now: float) -> list[p.Message]:
        """The next step of the save or load holding the barrier, once what it waits for is done."""
        pending = self.transition
        if pending.phase == "drain":
            return self._advance_drain(pending, now)
        if not pending.future.done():
            return []
        self.transition = None
        if pending.phase == "save":
            return self._saved(pending)
        if pending.phase == "read":
            return self._read(pending, now)
        return self._written(pending)

    def _advance_drain(self, pending: Pending, now: float) -> list[p.Message]:
        """A load waits for the running requests to finish before it writes (or gives up at the drain timeout)."""
        if not self.host.running():
            self.host.drop_caches()
            self.weights_state = "writing"
            pending.phase = "write"
            pending.future = self.executor.submit(self.host.write_weights, pending.payload)
            return self._advance_transition(now)
        if now >= pending.deadline:
            self.transition = None
            self._end_pause(pending)
            message = f"running requests did not finish within {self.timers.quiesce_drain_timeout_s:g} s"
            return [self.refused(pending.request_id, Refusal(WeightsCode.MODEL_BUSY, message, "drain_timeout"))]
        return []

    def _saved(self, pending: Pending) -> list[p.Message]:
        if self.barrier == "quiesced":
            self.hold_deadline = self.clock() + self.timers.hold_timeout_s
        if (failure := pending.future.exception()) is not None:
            return [self.refused(pending.request_id, as_refusal(failure, WeightsCode.SAVE_FAILED))]
        manifest = Saved(**pending.future.result())
        self.saved_steps = self.steps_since_load
        self.last_save = {"checkpoint_sha256": manifest.weights_sha256, "at": self.wall(), "path": manifest.path}
        self._name_weights(manifest.name, "checkpoint", manifest.weights_sha256, manifest.step)
        return [self.reply(pending.request_id, manifest)]

    def _read(self, pending: Pending, now: float) -> list[p.Message]:
        """The checkpoint is read and checked: pause serving (unless a quiesce holds it already) and drain."""
        if (failure := pending.future.exception()) is not None:
            if self.barrier == "quiesced":
                self.hold_deadline = self.clock() + self.timers.hold_timeout_s
            return [self.refused(pending.request_id, as_refusal(failure, WeightsCode.LOAD_FAILED))]
        pending.payload = pending.future.result()
        pending.phase, pending.deadline = "drain", now + self.timers.quiesce_drain_timeout_s
        if self.barrier == "serving":
            pending.paused_here = True
            self.host.pause()
        self.transition = pending
        return self._advance_transition(now)

    def _written(self, pending: Pending) -> list[p.Message]:
        """The write ended: clean with the new weights, or torn when it broke off partway."""
        if (failure := pending.future.exception()) is not None:
            out = self._tear()
            self._end_pause(pending)
            return [*out, self.refused(pending.request_id, as_refusal(failure, WeightsCode.LOAD_FAILED))]
        self.host.weights_written()
        self.weights_state, self.commit = "clean", None
        self.steps_since_load = self.saved_steps = 0
        target: LoadTarget = pending.body
        self.parent, self.parent_step = target.parent, 0
        self._name_weights(target.served_name, target.origin, target.manifest_hash, target.step)
        self._end_pause(pending)
        loaded = Loaded(weights_state="clean", served_name=self.served_name, steps_since_load=0)
        return [self.reply(pending.request_id, loaded)]

    def _end_pause(self, pending: Pending) -> None:
        if pending.paused_here:
            self.host.resume()
        elif self.barrier == "quiesced":
            self.hold_deadline = self.clock() + self.timers.hold_timeout_s

    def _name_weights(self, served_name: str, origin: str, manifest_hash: str | None, step: int = 0) -> None:
        """The served weights now answer under `served_name` (a checkpoint's: saved or loaded as step `step`);
        commits count again from here."""
        if origin == "checkpoint":
            self.parent, self.parent_step = served_name, step
        self.served_name, self.origin, self.manifest_hash, self.commits = served_name, origin, manifest_hash, 0


def _body_of(call: WeightsCall, kind: type[SaveRequest] | type[LoadTarget]) -> Any:
    """What a save or a load writes; a call without it is refused (the control plane always sends it)."""
    if not isinstance(call.body, kind):
        raise Refusal(WeightsCode.INVALID_REQUEST, f"a {call.operation} call carries a {kind.__name__}")
    return call.body
