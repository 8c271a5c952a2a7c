"""Sessions in the scheduler, on the real stories260K model: a turn continuing its conversation prefills only the new
tokens and decodes what a cold run decodes; the id limit, the idle TTL, watches and their grace period; pool
pressure takes idle conversations back; export and restore continue exactly; competing conversations are reported."""

from __future__ import annotations

import pytest

from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason
from inference.engine.hosted_model import HostedModel
from inference.engine.kv.sessions import SessionTable
from inference.engine.loaders.loading import load_model
from inference.engine.scheduler import Scheduler
from inference.engine.session_calls import answer
from inference.engine.step_results import Ended
from tests.engine.test_scheduler import finished, run, sequence, tokens_of

PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]  # BOS "Once upon a time ..."
NEW_TURNS = [[13, 354, 300], [13, 400, 401, 402, 403, 404], [13, 290], [13, 311, 312, 313, 314, 315, 316, 317]]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def model(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=4, context_window=256)


@pytest.fixture
def clock():
    return Clock()


def scheduler_with_sessions(model, clock, *, max_sessions=4, idle_ttl=60.0, watch_grace=5.0):
    sessions = SessionTable(
        model.runner.cache, max_sessions=max_sessions, idle_ttl=idle_ttl, watch_grace=watch_grace, clock=clock
    )
    return Scheduler(
        model.runner, model.tokenizer, max_concurrent=model.runner.max_concurrent, sessions=sessions, clock=clock
    )


def turn(scheduler, model, request_id, prompt, session_id=None, max_tokens=12):
    """Runs one request to its end; returns (its FINISHED, its output tokens)."""
    seq = sequence(model, request_id, prompt, max_tokens=max_tokens)
    if session_id is not None:
        seq.session = scheduler.sessions.claim(session_id)
        assert seq.session is not None
    scheduler.add(seq)
    messages = run(scheduler)
    return finished(messages, request_id), tokens_of(messages, request_id)


def test_a_four_turn_session_prefills_only_new_tokens_and_decodes_what_a_cold_run_does(model, clock):
    warm = scheduler_with_sessions(model, clock)
    cold_model = load_model(model.path, max_concurrent=1, context_window=256)
    cold = Scheduler(cold_model.runner, cold_model.tokenizer)
    prompt, previous = PROMPT, None
    for i, new in enumerate(NEW_TURNS):
        done, output = turn(warm, model, f"w{i}", prompt, session_id="chat")
        cold_done, cold_output = turn(cold, cold_model, f"c{i}", prompt)
        cold_model.runner.cache.pool.forget_prefixes()  # keep the reference cold
        assert output == cold_output
        assert cold_done.cached_tokens == 0
        if previous is not None:
            assert done.cached_tokens == previous.prompt_tokens + previous.completion_tokens
        assert done.kv_used == len(prompt) + len(output)
        previous, prompt = done, prompt + output + new
    session = warm.sessions.sessions["chat"]
    assert len(session.conversations) == 1 and not session.turns


def test_a_turn_whose_last_history_token_differs_recomputes_only_that_position(model, clock):
    scheduler = scheduler_with_sessions(model, clock)
    done, output = turn(scheduler, model, "a", PROMPT, session_id="s")
    # the client renders the end of the answer differently (a stop token written as other text)
    again, _ = turn(scheduler, model, "b", PROMPT + output[:-1] + [300, 301], session_id="s")
    assert again.cached_tokens == len(PROMPT) + len(output) - 1


def test_a_new_id_beyond_max_sessions_is_refused_until_one_is_released(model, clock):
    scheduler = scheduler_with_sessions(model, clock, max_sessions=2)
    for sid in ("a", "b"):
        turn(scheduler, model, sid, PROMPT, session_id=sid)
    assert scheduler.sessions.claim("c") is None
    assert scheduler.sessions.claim("a") is not None  # a known id always gets in
    scheduler.sessions.end_turn(scheduler.sessions.sessions["a"], None, None)
    assert scheduler.sessions.release("b") is True
    assert scheduler.sessions.release("b") is False  # idempotent
    assert scheduler.sessions.claim("c") is not None


def test_idle_sessions_expire_but_not_while_watched_and_only_after_the_grace_period(model, clock):
    scheduler = scheduler_with_sessions(model, clock, idle_ttl=60.0, watch_grace=5.0)
    sessions = scheduler.sessions
    for sid in ("idle", "watched"):
        turn(scheduler, model, sid, PROMPT + [400 + len(sid)] * 20, session_id=sid)
    pinned = sessions.pinned_blocks()
    assert pinned >= 2
    sessions.watch("watched", True)
    clock.now += 61
    assert sessions.expire() == ["idle"]
    assert "watched" in sessions.sessions and sessions.pinned_blocks() < pinned
    sessions.watch("watched", False)
    clock.now += 4
    sessions.watch("watched", True)  # a new watch within the grace period keeps it
    clock.now += 10
    assert sessions.expire() == []
    sessions.watch("watched", False)
    clock.now += 4.9
    assert sessions.expire() == []
    clock.now += 0.2
    assert sessions.expire() == ["watched"]
    assert sessions.pinned_blocks() == 0 and not sessions.sessions


def test_a_pool_under_pressure_takes_back_idle_conversations(stories_hf_dir, clock):
    model = load_model(stories_hf_dir, max_concurrent=1, context_window=64)  # a pool of 4 blocks
    scheduler = scheduler_with_sessions(model, clock)
    turn(scheduler, model, "s", PROMPT + [5] * 30, session_id="kept", max_tokens=4)
    assert scheduler.sessions.pinned_blocks() == 3
    done, output = turn(scheduler, model, "big", [1] + [6] * 50, max_tokens=8)  # needs all 4 blocks
    assert done.finish_reason == "length" and len(output) == 8
    assert "kept" not in scheduler.sessions.sessions


def test_export_then_restore_continues_exactly(model, clock):
    scheduler = scheduler_with_sessions(model, clock)
    _, output = turn(scheduler, model, "a", PROMPT, session_id="s")
    history = PROMPT + output
    blob = answer(model, scheduler.sessions, p.SessionExport(request_id="e", model="m", session_id="s"))
    assert isinstance(blob, p.SessionBlob) and blob.tokens == history
    expected_done, expected = turn(scheduler, model, "b", history + NEW_TURNS[0], session_id="s")

    other = load_model(model.path, max_concurrent=4, context_window=256)
    restored_into = scheduler_with_sessions(other, clock)
    call = p.SessionRestore(request_id="r", model="m", session_id="s", blob=blob.blob, tokens=blob.tokens)
    reply = answer(other, restored_into.sessions, call)
    assert reply == p.SessionRestored(request_id="r", session_id="s", n_tok=len(history))
    done, continued = turn(restored_into, other, "b", history + NEW_TURNS[0], session_id="s")
    assert continued == expected and done.cached_tokens == expected_done.cached_tokens == len(history)


def test_a_blob_restored_elsewhere_or_damaged_is_refused_and_changes_nothing(model, clock):
    scheduler = scheduler_with_sessions(model, clock)
    turn(scheduler, model, "a", PROMPT, session_id="s")
    blob = answer(model, scheduler.sessions, p.SessionExport(request_id="e", model="m", session_id="s"))
    free = model.runner.cache.pool.num_free

    def restore(data: bytes, tokens=blob.tokens, target=model, table=scheduler.sessions):
        call = p.SessionRestore(request_id="r", model="m", session_id="t", blob=data, tokens=tokens)
        return answer(target, table, call)

    altered = bytearray(blob.blob)
    altered[len(altered) // 2] ^= 1
    for refused in (restore(blob.blob[:-10]), restore(bytes(altered)), restore(blob.blob, tokens=blob.tokens[1:])):
        assert isinstance(refused, p.Error) and refused.reason == Reason.BAD_SESSION_BLOB
    model.weights_version += 1  # as after a load of other weights
    mismatch = restore(blob.blob)
    assert isinstance(mismatch, p.Error) and mismatch.reason == Reason.WEIGHTS_VERSION_MISMATCH
    assert model.runner.cache.pool.num_free == free and "t" not in scheduler.sessions.sessions


def test_export_refuses_unknown_busy_and_sessionless(model, clock):
    scheduler = scheduler_with_sessions(model, clock)

    def export(session_id, table=scheduler.sessions):
        return answer(model, table, p.SessionExport(request_id="e", model="m", session_id=session_id))

    assert export("nobody").reason == Reason.SESSION_NOT_FOUND
    seq = sequence(model, "a", PROMPT, max_tokens=20)
    seq.session = scheduler.sessions.claim("s")
    scheduler.add(seq)
    scheduler.step()
    assert export("s").reason == Reason.SESSION_BUSY
    assert export("s", table=None).reason == Reason.SESSIONS_DISABLED


def test_two_conversations_racing_under_one_id_report_a_conflict(model, clock):
    scheduler = scheduler_with_sessions(model, clock)
    _, output = turn(scheduler, model, "a", PROMPT, session_id="s")
    history = PROMPT + output
    first, second = (sequence(model, rid, history + [300 + i], max_tokens=6) for i, rid in enumerate("bc"))
    for seq in (first, second):
        seq.session = scheduler.sessions.claim("s")
        scheduler.add(seq)
    messages = run(scheduler)
    assert finished(messages, "b").session_conflict is False
    assert finished(messages, "b").cached_tokens == len(history)
    late = finished(messages, "c")
    assert late.session_conflict is True
    assert late.cached_tokens == len(history) // 16 * 16  # its full blocks still come from the prefix cache
    assert len(scheduler.sessions.sessions["s"].conversations) == 2


def test_a_session_call_right_after_a_turns_finished_sees_the_turn_ended(model, clock):
    """FINISHED goes out before the step that keeps the last token's KV; a call in between must not find the
    session busy, and exports the whole turn."""
    scheduler = scheduler_with_sessions(model, clock)
    hosted = HostedModel("m", model, scheduler)
    seq = sequence(model, "a", PROMPT, max_tokens=3)
    seq.session = scheduler.sessions.claim("s")
    scheduler.add(seq)
    while not any(isinstance(m, Ended) for m in scheduler.step()):
        pass
    exported = hosted.answer_session_call(p.SessionExport(request_id="e", model="m", session_id="s"))
    assert isinstance(exported, p.SessionBlob), exported
    assert exported.tokens == PROMPT + seq.output_ids
