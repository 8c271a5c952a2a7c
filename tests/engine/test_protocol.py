"""The worker protocol's frames: every message survives encoding unchanged as one frame, each side accepts only the
messages meant for it, with its fields' types checked, and anything else is a ProtocolError that still names the
request it came with."""

import msgspec
import pytest

from inference.engine.contract import messages as p
from inference.engine.contract.params import GenerationOptions, LoadOptions, SamplingParams, ServingLimits
from inference.engine.contract.reasons import Reason

TO_WORKER = [
    p.Submit(request_id="r1", model="m", messages=[{"role": "user", "content": "héllo"}],
             tools=[{"type": "function"}], enable_thinking=False,
             sampling=SamplingParams(temperature=0.5, logit_bias={7: -100.0}),
             options=GenerationOptions(max_tokens=9, stop=["\n\n"], stop_token_ids=[2], ignore_eos=True)),
    p.Submit(request_id="r2", model="m", prompt_token_ids=[1, 2, 3], session_id="s1", priority="batch"),
    p.Abort(request_id="r1"),
    p.Load(request_id="c1", name="m", path="/models/x.gguf", options=LoadOptions(quantize=True, dtype="bfloat16",
           ctx_cap=2048), limits=ServingLimits(max_concurrent=4, queue_depth=32, queue_timeout=30.0, prefill_chunk=64,
           block_size=32, batch_slots=2, prefix_cache_bytes=2**30, max_sessions=4, session_idle_ttl=60.0,
           watch_grace=1.5)),
    p.Unload(request_id="c2", name="m", drain_timeout=1.5, force=False),
    p.StatusQuery(request_id="c3"),
    p.Pause(request_id="c4", model="m"),
    p.Resume(request_id="c5", model=None),
    p.SessionExport(request_id="c6", model="m", session_id="s1"),
    p.SessionRestore(request_id="c7", model="m", session_id="s1", blob=b"\x00\xffPNKV", tokens=[1, 2]),
    p.SessionRelease(request_id="c8", model="m", session_id="s1"),
    p.SessionWatch(request_id="c9", model="m", session_id="s1", watching=False),
    p.SessionList(request_id="c10", model="m"),
    p.Shutdown(),
]  # fmt: skip

FROM_WORKER = [
    p.Ready(device="cuda:1", pid=123, cuda_devices=2),
    p.Heartbeat(pid=123),
    p.Started(request_id="r1", prompt_tokens=12, cached_tokens=0, kv_cap=4096),
    p.Tokens(request_id="r1", token_ids=[7, 8], text="a\ufffdb", logprobs=[
        p.TokenLogprob(token_id=7, token=b"\xe2\x80", logprob=-0.25,
                       top=[p.TopLogprob(token_id=7, token=b"\xe2\x80", logprob=-0.25)])]),
    p.Tokens(request_id="r1", token_ids=[9], text=""),
    p.Finished(request_id="r1", finish_reason="length", prompt_tokens=12, completion_tokens=9, cached_tokens=0,
               kv_used=21, kv_cap=4096),
    p.Error(request_id="r1", reason=Reason.PROMPT_TOO_LONG, message="too long", kv_used=5000, kv_cap=4096),
    p.Error(request_id=None, reason=Reason.BAD_REQUEST, message="bad frame"),
    p.Loaded(request_id="c1", name="m", path="/models/x.gguf", format="gguf", architecture="llama", device="cuda:1",
             dtype="bfloat16", weight_bytes=10, kv_bytes=20, kv_dtype="bfloat16", context_window=2048,
             context_window_configured=4096, max_concurrent=4, load_seconds=0.5, weights_version=-7),
    p.Loaded(request_id="c1", name="m", path="/m", format="hf", architecture="qwen2", device="cpu", dtype="float32",
             weight_bytes=10, kv_bytes=20, kv_dtype="float32", context_window=2048, context_window_configured=2048,
             max_concurrent=4, load_seconds=0.5, weights_version=1, kernels=["block_matmul", "paged_attention"]),
    p.Unloaded(request_id="c2", name="m", aborted=1),
    p.Status(request_id="c3", device="cpu", pid=123, memory_total=1000, memory_used=500, models=[
        p.ModelStatus(name="m", path="/x", state="ready", weight_bytes=1, kv_bytes=2, slots_used=0, slots_total=4,
                      running=0, waiting=3, max_concurrent=4, context_window=2048, blocks_total=512, blocks_free=500,
                      blocks_cached=3, blocks_pinned=2, block_size=16, sessions=1, prefill_tok_per_s=812.5)]),
    p.SessionBlob(request_id="c6", session_id="s1", weights_version=5, tokens=[1, 2, 3], blob=b"PNKV\x00"),
    p.SessionRestored(request_id="c7", session_id="s1", n_tok=3),
    p.SessionReleased(request_id="c8", session_id="s1", released=True),
    p.SessionWatched(request_id="c9", session_id="s1", watchers=2),
    p.Sessions(request_id="c10", model="m", sessions=[
        p.SessionInfo(session_id="s1", conversations=2, tokens=40, idle_seconds=1.5, watched=True, busy=False)]),
    p.Paused(request_id="c4"),
    p.Resumed(request_id="c5"),
    p.StepOutputs(messages=[
        p.Started(request_id="r2", prompt_tokens=3, cached_tokens=0, kv_cap=4096),
        p.Tokens(request_id="r2", token_ids=[5], text="x"),
        p.Finished(request_id="r1", finish_reason="stop", prompt_tokens=12, completion_tokens=10, cached_tokens=0,
                   kv_used=22, kv_cap=4096, session_conflict=True),
        p.Error(request_id="r3", reason=Reason.GENERATION_FAILED, message="boom")]),
    p.StepOutputs(messages=[]),
]  # fmt: skip


@pytest.mark.parametrize("message", TO_WORKER, ids=lambda m: type(m).__name__)
def test_every_message_to_a_worker_round_trips_as_one_frame(message):
    assert p.decode_to_worker(p.encode(message)) == message


@pytest.mark.parametrize("message", FROM_WORKER, ids=lambda m: type(m).__name__)
def test_every_message_from_a_worker_round_trips_as_one_frame(message):
    assert p.decode_from_worker(p.encode(message)) == message


def test_a_loaded_frame_without_kernels_reads_as_none_active():
    """A worker of a build before `kernels` (the frame ends before it) reads as running torch's ops only."""
    loaded = FROM_WORKER[[type(m) for m in FROM_WORKER].index(p.Loaded)]
    values = msgspec.msgpack.decode(p.encode(loaded))
    last = p.Loaded.__struct_fields__.index("kernels") + 1
    assert p.decode_from_worker(msgspec.msgpack.encode(values[:last])).kernels == []


def test_kinds_are_distinct():
    kinds = [cls.__struct_config__.tag for cls in (*p.ToWorker.__args__, *p.FromWorker.__args__)]
    assert len(set(kinds)) == len(kinds)


def test_each_side_accepts_only_what_is_meant_for_it():
    with pytest.raises(p.ProtocolError):
        p.decode_to_worker(p.encode(p.Heartbeat(pid=1)))
    with pytest.raises(p.ProtocolError):
        p.decode_from_worker(p.encode(p.Abort(request_id="r1")))


def _submit_values() -> list:
    return msgspec.msgpack.decode(p.encode(p.Submit(request_id="r9", model="m", prompt_token_ids=[1])))


def _with(values: list, field: str, value) -> bytes:
    """A SUBMIT frame with `field` (by name: its place follows the tag) set to `value`."""
    values = list(values)
    values[p.Submit.__struct_fields__.index(field) + 1] = value
    return msgspec.msgpack.encode(values)


@pytest.mark.parametrize(
    ("frame", "request_id"),
    [
        (msgspec.msgpack.encode(["Z", "x"]), "x"),  # unknown kind
        (b"", None),  # empty
        (b"\xc1", None),  # not msgpack
        (msgspec.msgpack.encode(["A", "r1", "extra", "fields"]), "r1"),  # wrong arity
        (msgspec.msgpack.encode(7), None),  # not an array
        (_with(_submit_values(), "sampling", {"top_k": "5"}), "r9"),  # a mistyped sampling field
        (_with(_submit_values(), "sampling", {"warmth": 1.0}), "r9"),  # a sampling field nobody knows
        (_with(_submit_values(), "sampling", {"temperature": float("nan")}), "r9"),  # an invariant broken
        (_with(_submit_values(), "prompt_token_ids", None), "r9"),  # no prompt of any kind
        (_with(_submit_values(), "prompt", "also text"), "r9"),  # two prompts
        (_with(_submit_values(), "options", {"max_tokens": "7"}), "r9"),  # max_tokens a string
        (_with(_submit_values(), "options", {"max_tokens": -1}), "r9"),  # max_tokens negative
        (_with(_submit_values(), "options", {"max_tokens": 2, "min_tokens": 3}), "r9"),  # min_tokens past it
        (_with(_submit_values(), "priority", "urgent"), "r9"),  # a priority that is neither interactive nor batch
    ],
)
def test_anything_else_is_a_protocol_error_naming_its_request(frame, request_id):
    with pytest.raises(p.ProtocolError) as refused:
        p.decode_to_worker(frame)
    assert refused.value.request_id == request_id


def test_a_step_is_one_message_as_compact_as_its_parts():
    """Eight streams' tokens of one step travel as one message, in order, in the bytes of eight messages alone."""
    tokens = [p.Tokens(request_id=f"{i:032x}", token_ids=[100 + i], text=" word") for i in range(8)]
    frame = p.encode(p.StepOutputs(messages=tokens))
    assert p.decode_from_worker(frame).messages == tokens
    alone = sum(len(p.encode(t)) for t in tokens)
    assert len(frame) <= alone + 4  # + its own array header, tag and list header
