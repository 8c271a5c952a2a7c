"""The weights barrier's state machine (engine/weights/barrier.py) on a fake model and a fake clock: every refusal
code and reason, the check order, and the three timers. The same barrier under a real worker and real HTTP is in
tests/weights/test_weights_http.py."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from inference.engine.contract import messages as p
from inference.engine.contract.weights import (
    LoadTarget,
    SaveRequest,
    ServedCheckpoint,
    WeightsCall,
    WeightsOperation,
    WeightsTimers,
    answer_fields,
)
from inference.engine.weights.barrier import WeightsBarrier
from inference.engine.weights.barrier_state import ShapeMismatch

Op = WeightsOperation
TIMERS = WeightsTimers(
    hold_timeout_s=5,
    commit_watchdog_ms=800,
    heartbeat_timeout_s=30,
    quiesce_drain_timeout_s=60,
    heartbeat_interval_hint_s=5,
)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Inline:
    """An executor that runs what it is given at once (the worker's load thread, without the thread)."""

    def submit(self, fn, *args):
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future


class FakeModel:
    """A model with a queue: `running` sequences finish when the test says so; pausing stops admission."""

    name = "m"
    served_name = "m"

    def __init__(self):
        self.paused = False
        self.run, self.wait = 0, 0
        self.steps = 0
        self.drops = 0
        self.written = 0
        self.refusal: str | None = None
        self.fail_write = False
        self.weights = {"w": 1.0}

    def pause(self):
        self.paused = True

    def resume(self):
        self.paused = False

    def running(self):
        return self.run

    def waiting(self):
        return self.wait

    def queue_full(self):
        return False

    def forward_steps(self):
        return self.steps

    def drop_caches(self):
        self.drops += 1

    def weights_written(self):
        self.written += 1

    def refuse_waiting(self, message):
        refused = [p.Error(request_id=f"r{i}", reason="weights_torn", message=message) for i in range(self.wait)]
        self.wait = 0
        return refused

    def attach_refusal(self):
        return self.refusal

    def layout(self):
        return "views"

    def export(self):
        return {"producer": {}, "storages": [], "parameters": [], "pinned_bytes": 0, "config": None}

    def save(self, request, parent, base_name):
        step = request.step
        name = f"{base_name}:{request.run_id}:step-{step}"
        return {
            "run_id": request.run_id,
            "step": step,
            "parent": parent,
            "base_model": base_name,
            "weights_sha256": "ab" * 32,
            "created_at": "2026-01-01T00:00:00.000+00:00",
            "name": name,
            "path": "/x",
        }

    def read_checkpoint(self, target):
        if target.path == "/mismatch":
            raise ShapeMismatch("w does not fit")
        return {"w": 2.0}

    def write_weights(self, tensors):
        if self.fail_write:
            raise OSError("disk gone")
        self.weights.update(tensors)


@pytest.fixture
def rig():
    clock = Clock()
    model = FakeModel()
    barrier = WeightsBarrier(model, TIMERS, Inline(), wall=clock, clock=clock)
    return barrier, model, clock


def weights_call(op, attachment=None, label="t", role="trainer", **fields) -> WeightsCall:
    """The call the control plane sends: a save carries a SaveRequest, a load a LoadTarget, the others nothing."""
    body = None
    if op is Op.SAVE:
        body = SaveRequest(root="/ckpt", **fields)
    elif op is Op.LOAD:
        body = LoadTarget(**fields)
    return WeightsCall(operation=op, role=role, label=label, attachment_id=attachment, body=body)


def call(barrier, *args, **fields):
    (answer,) = barrier.handle("c", weights_call(*args, **fields))
    return answer


def run(barrier, *args, **fields) -> list[p.Message]:
    """A call answered later (save, load): what handle() and then tick() sent."""
    return barrier.handle("c", weights_call(*args, **fields)) + barrier.tick()


def ok(answer) -> dict:
    assert isinstance(answer, p.WeightsReply), answer
    return answer_fields(p.decode_from_worker(p.encode(answer)).data)  # as the control plane reads it


def code(answer) -> tuple[str, str | None]:
    assert isinstance(answer, p.WeightsRefused), answer
    return answer.code, answer.reason


def attached(barrier) -> str:
    return ok(call(barrier, Op.ATTACH))["attachment_id"]


def test_the_write_cycle_counts_a_commit_and_holds_serving_until_resume(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    assert ok(call(barrier, Op.QUIESCE, aid))["weights_state"] == "clean"
    assert model.paused and barrier.barrier == "quiesced" and model.drops == 1
    model.steps += 0
    assert ok(call(barrier, Op.COMMIT_BEGIN, aid))["weights_state"] == "writing"
    clock.now += 0.05
    end = ok(call(barrier, Op.COMMIT_END, aid))
    assert end["steps_since_load"] == 1 and end["overran"] is False and end["commit_ms"] == pytest.approx(50)
    assert model.written == 1 and model.paused  # still quiesced after commit-end
    assert ok(call(barrier, Op.RESUME, aid)) == {"barrier": "serving", "weights_state": "clean"}
    assert not model.paused
    snap = barrier.snapshot()
    assert snap.commits == 1 and snap.unsaved_commits == 1 and snap.attachment.state == "active"


def test_holder_checks_come_before_state_checks(rig):
    barrier, model, _ = rig
    assert code(call(barrier, Op.COMMIT_END)) == ("NOT_ATTACHED", None)  # nothing attached beats no open commit
    aid = attached(barrier)
    assert code(call(barrier, Op.COMMIT_END, "wrong")) == ("NOT_ATTACHMENT_HOLDER", None)
    assert code(call(barrier, Op.COMMIT_END, None)) == ("NOT_ATTACHMENT_HOLDER", None)  # a missing header too
    assert code(call(barrier, Op.COMMIT_END, aid, label="other")) == ("NOT_ATTACHMENT_HOLDER", None)
    assert code(call(barrier, Op.COMMIT_END, aid)) == ("NO_OPEN_COMMIT", None)


def test_every_state_refusal(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    second = call(barrier, Op.ATTACH, label="u")
    assert code(second) == ("ALREADY_ATTACHED", None) and second.details["label"] == "t"
    assert code(call(barrier, Op.COMMIT_BEGIN, aid)) == ("NOT_QUIESCED", None)
    assert ok(call(barrier, Op.RESUME, aid))["barrier"] == "serving"  # resume while serving: a no-op
    ok(call(barrier, Op.QUIESCE, aid))
    assert code(call(barrier, Op.QUIESCE, aid)) == ("ALREADY_QUIESCED", None)
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    assert code(call(barrier, Op.COMMIT_BEGIN, aid)) == ("WEIGHTS_NOT_CLEAN", None)
    assert code(call(barrier, Op.SAVE, aid, run_id="r")) == ("WEIGHTS_NOT_CLEAN", None)
    assert code(call(barrier, Op.RESUME, aid)) == ("WEIGHTS_NOT_CLEAN", "commit_open")
    assert code(call(barrier, Op.ATTACH, label="u")) == ("ALREADY_ATTACHED", None)
    assert code(call(barrier, Op.CLEAR_STALE, role="operator", label="op")) == ("ATTACHMENT_NOT_STALE", None)
    ok(call(barrier, Op.COMMIT_END, aid))
    ok(call(barrier, Op.DETACH, aid))
    model.refusal = "gguf"
    assert code(call(barrier, Op.ATTACH)) == ("NOT_ATTACHABLE", "gguf")


def test_a_quiesce_waits_for_running_sequences_and_resume_meanwhile_is_refused(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    model.run, model.wait = 6, 2
    assert barrier.handle("q", WeightsCall(operation=Op.QUIESCE, label="t", attachment_id=aid)) == []
    assert model.paused and barrier.barrier == "serving"
    assert code(call(barrier, Op.RESUME, aid)) == ("NOT_QUIESCED", "quiesce_in_progress")
    assert barrier.tick() == []
    model.run = 0
    (reply,) = barrier.tick()
    assert reply.request_id == "q" and reply.data.held_requests == 2 and barrier.barrier == "quiesced"


def test_a_drain_past_its_timeout_is_model_busy_and_holds_nothing(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    model.run = 1
    barrier.handle("q", WeightsCall(operation=Op.QUIESCE, label="t", attachment_id=aid))
    clock.now += 61
    (refused,) = [m for m in barrier.tick() if not isinstance(m, p.WeightsChanged)]  # it also went stale
    assert code(refused) == ("MODEL_BUSY", "drain_timeout")
    assert not model.paused and barrier.barrier == "serving"


def test_the_watchdog_tears_and_a_late_commit_end_returns_clean_with_overran(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    model.wait = 3
    clock.now += 0.7
    assert barrier.tick() == []
    clock.now += 0.2
    out = barrier.tick()
    assert [type(m) for m in out] == [p.Error] * 3 + [p.WeightsChanged]  # the held requests are refused
    assert barrier.weights_state == "torn" and out[-1].snapshot.commit_overran is not None
    assert code(call(barrier, Op.QUIESCE, aid)) == ("WEIGHTS_NOT_CLEAN", None)
    late = ok(call(barrier, Op.COMMIT_END, aid))
    assert late["weights_state"] == "clean" and late["overran"] is True
    assert barrier.snapshot().last_overrun["commit_ms"] == pytest.approx(900)


def test_an_unanswered_hold_resumes_after_the_hold_timeout_but_not_while_a_commit_is_open(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    clock.now += 0.5
    ok(call(barrier, Op.COMMIT_END, aid))  # restarts the hold timer in full
    clock.now += 4.9
    barrier.tick()
    assert barrier.barrier == "quiesced"
    clock.now += 0.2
    (changed,) = barrier.tick()
    assert barrier.barrier == "serving" and not model.paused and changed.snapshot.last_hold_timeout_at is not None


def test_a_silent_attachment_goes_stale_and_only_then_can_be_cleared(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    clock.now += 20
    ok(call(barrier, Op.HEARTBEAT, aid))
    clock.now += 29
    barrier.tick()
    assert barrier.snapshot().attachment.state == "active"
    clock.now += 2
    (changed,) = [m for m in barrier.tick() if isinstance(m, p.WeightsChanged)]
    assert changed.snapshot.attachment.state == "stale"
    assert code(call(barrier, Op.ATTACH, label="u")) == ("ALREADY_ATTACHED", None)  # stale still blocks attach
    cleared = ok(call(barrier, Op.CLEAR_STALE, role="operator", label="op"))
    assert cleared["cleared"]["label"] == "t" and cleared["cleared"]["stale_since"] is not None
    assert barrier.attachment is None


def test_a_heartbeat_revives_a_stale_attachment(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    clock.now += 31
    barrier.tick()
    assert ok(call(barrier, Op.HEARTBEAT, aid))["attachment_state"] == "active"
    assert barrier.snapshot().attachment.state == "active"


def test_clearing_a_stale_holder_mid_commit_leaves_the_commit_for_the_watchdog(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    barrier.timers = WeightsTimers(commit_watchdog_ms=60_000, heartbeat_timeout_s=30)
    clock.now += 31
    barrier.tick()
    ok(call(barrier, Op.CLEAR_STALE, role="operator", label="op"))
    assert barrier.weights_state == "writing"
    assert code(call(barrier, Op.ATTACH)) == ("NOT_ATTACHABLE", "weights_writing")
    clock.now += 60
    barrier.tick()
    assert barrier.weights_state == "torn"
    assert ok(call(barrier, Op.ATTACH))["weights_state"] == "torn"  # attaching to torn is how a trainer finds out


def test_detach_while_writing_tears_and_torn_survives_reattach(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    assert ok(call(barrier, Op.DETACH, aid)) == {"weights_state": "torn", "barrier": "serving"}
    aid = attached(barrier)
    assert barrier.weights_state == "torn"
    ok(call(barrier, Op.DETACH, aid))


def test_a_load_restores_a_torn_set_and_resets_the_counters(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    ok(call(barrier, Op.DETACH, aid))
    assert barrier.weights_state == "torn"
    (reply,) = run(barrier, Op.LOAD, path="/c", served_name="m:r:step-3", origin="checkpoint")
    assert isinstance(reply, p.WeightsReply) and barrier.weights_state == "clean"
    assert model.weights == {"w": 2.0} and not model.paused
    snap = barrier.snapshot()
    assert (snap.served_name, snap.origin, snap.commits, snap.steps_since_load) == ("m:r:step-3", "checkpoint", 0, 0)


def test_a_load_that_does_not_fit_changes_nothing_and_one_that_fails_partway_tears(rig):
    barrier, model, clock = rig
    (refused,) = run(barrier, Op.LOAD, path="/mismatch", served_name="x")
    assert code(refused) == ("SHAPE_MISMATCH", None) and barrier.weights_state == "clean" and not model.paused
    model.fail_write = True
    out = run(barrier, Op.LOAD, path="/c", served_name="x")
    assert code(out[-1]) == ("LOAD_FAILED", None) and barrier.weights_state == "torn"


def test_a_save_records_the_commits_and_renames_the_served_weights(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    for _ in range(2):
        ok(call(barrier, Op.QUIESCE, aid))
        ok(call(barrier, Op.COMMIT_BEGIN, aid))
        ok(call(barrier, Op.COMMIT_END, aid))
        ok(call(barrier, Op.RESUME, aid))
    assert barrier.snapshot().unsaved_commits == 2
    (answer,) = run(barrier, Op.SAVE, aid, run_id="r")
    manifest = ok(answer)
    assert manifest["name"] == "m:r:step-2"
    snap = barrier.snapshot()
    assert (snap.unsaved_commits, snap.served_name, snap.origin, snap.commits) == (0, "m:r:step-2", "checkpoint", 0)
    assert snap.last_save["checkpoint_sha256"] == "ab" * 32


def cycle(barrier, aid: str) -> None:
    """One commit: quiesce, commit-begin, commit-end, resume."""
    for op in (Op.QUIESCE, Op.COMMIT_BEGIN, Op.COMMIT_END, Op.RESUME):
        ok(call(barrier, op, aid))


def test_a_save_after_a_checkpoint_load_continues_its_step_numbers(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    for _ in range(3):
        cycle(barrier, aid)
    assert ok(run(barrier, Op.SAVE, aid, run_id="r")[0])["name"] == "m:r:step-3"
    cycle(barrier, aid)
    assert ok(run(barrier, Op.SAVE, aid, run_id="r")[0])["name"] == "m:r:step-4"  # saved, then one commit more
    # back to step 3: its next commit is step 4 again (saved: CHECKPOINT_EXISTS is the trainer's to resolve), two
    # commits make step 5, where the counter since load alone would say 2 and collide with nothing of this lineage
    loaded = run(barrier, Op.LOAD, path="/c", served_name="m:r:step-3", origin="checkpoint", step=3)
    assert ok(loaded[-1])["steps_since_load"] == 0
    for _ in range(2):
        cycle(barrier, aid)
    assert ok(run(barrier, Op.SAVE, aid, run_id="r")[0])["name"] == "m:r:step-5"
    # the base model's weights again: numbering starts over from its commits
    ok(run(barrier, Op.LOAD, path="/m", served_name="m", origin="model")[-1])
    cycle(barrier, aid)
    assert ok(run(barrier, Op.SAVE, aid, run_id="base")[0])["name"] == "m:base:step-1"


def test_weights_loaded_as_a_checkpoint_answer_under_its_name_and_continue_its_steps(rig):
    barrier, model, clock = rig
    barrier.serve_checkpoint(ServedCheckpoint(name="m:r:step-7", manifest_hash="cd" * 32, step=7))
    snap = barrier.snapshot()
    assert (snap.served_name, snap.base_name, snap.origin, snap.manifest_hash) == (
        "m:r:step-7",
        "m",
        "checkpoint",
        "cd" * 32,
    )
    aid = attached(barrier)
    cycle(barrier, aid)
    saved = ok(run(barrier, Op.SAVE, aid, run_id="r")[0])
    assert saved["name"] == "m:r:step-8"
    assert barrier.parent == "m:r:step-8"


class Deferred:
    """An executor whose work ends when the test says so (a save or a load still running)."""

    def __init__(self):
        self.pending: list[tuple[Future, object, tuple]] = []

    def submit(self, fn, *args):
        future = Future()
        self.pending.append((future, fn, args))
        return future

    def finish(self) -> None:
        for future, fn, args in self.pending:
            future.set_result(fn(*args))
        self.pending.clear()


def test_a_save_in_progress_holds_the_barrier_against_quiesce_commit_and_load(rig):
    barrier, model, clock = rig
    barrier.executor = work = Deferred()
    aid = attached(barrier)
    ok(call(barrier, Op.QUIESCE, aid))
    assert barrier.handle("s", weights_call(Op.SAVE, aid, run_id="r")) == []
    assert code(call(barrier, Op.COMMIT_BEGIN, aid)) == ("PAUSE_IN_PROGRESS", None)
    assert code(call(barrier, Op.SAVE, aid, run_id="r")) == ("PAUSE_IN_PROGRESS", None)
    assert code(call(barrier, Op.LOAD, path="/c", served_name="x")) == ("PAUSE_IN_PROGRESS", None)
    clock.now += TIMERS.hold_timeout_s + 1
    assert barrier.tick() == [] and barrier.barrier == "quiesced"  # the save took over the hold: no timeout
    work.finish()
    (saved,) = barrier.tick()
    assert saved.request_id == "s" and ok(saved)["name"] == "m:r:step-0"
    ok(call(barrier, Op.COMMIT_BEGIN, aid))
    assert barrier.snapshot().transition is None


def test_a_quiesce_with_no_queue_place_left_is_queue_full(rig):
    barrier, model, clock = rig
    aid = attached(barrier)
    model.queue_full = lambda: True
    assert code(call(barrier, Op.QUIESCE, aid)) == ("QUEUE_FULL", None)
    assert not model.paused
