"""The worker protocol's frames: every message survives encoding unchanged, is two frames with a one-byte kind,
and anything else is refused as a ProtocolError."""

import msgpack
import pytest

from inference.engine.contract import messages as p

MESSAGES = [
    p.Submit("r1", "m", messages=[{"role": "user", "content": "héllo"}], tools=[{"type": "function"}],
             enable_thinking=False, sampling={"temperature": 0.5, "logit_bias": {7: -100.0}}, max_tokens=9,
             stop=["\n\n"], stop_token_ids=[2], ignore_eos=True),
    p.Submit("r2", "m", prompt_token_ids=[1, 2, 3]),
    p.Abort("r1"),
    p.Load("c1", "m", "/models/x.gguf", quantize=True, dtype="bfloat16", max_context=2048, max_concurrent=4,
           queue_depth=32, queue_timeout=30.0, prefill_chunk=64),
    p.Unload("c2", "m", drain_timeout=1.5, force=False),
    p.StatusQuery("c3"),
    p.Pause("c4", "m"),
    p.Resume("c5", None),
    p.Shutdown(),
    p.Ready("cuda:1", 123, cuda_devices=2),
    p.Heartbeat(123),
    p.Started("r1", 12, 0, 4096),
    p.Tokens("r1", [7, 8], "a\ufffdb", [p.TokenLogprob(7, b"\xe2\x80", -0.25, [p.TopLogprob(7, b"\xe2\x80", -0.25)])]),
    p.Tokens("r1", [9], ""),
    p.Finished("r1", "length", 12, 9, 0, 21, 4096),
    p.Error("r1", "context_over_budget", "too long", 422, kv_used=5000, kv_cap=4096),
    p.Error(None, "invalid_request_error", "bad frame", 400, retry_after=1.0),
    p.Loaded("c1", "m", "/models/x.gguf", "gguf", "llama", "cuda:1", "bfloat16", 10, 20, 2048, 4, 0.5),
    p.Unloaded("c2", "m", 1),
    p.Status("c3", "cpu", 123, 1000, 500, [p.ModelStatus("m", "/x", "ready", 1, 2, 0, 4, 0, 3, 4, 2048)]),
    p.Paused("c4"),
    p.Resumed("c5"),
    p.StepOutputs([p.Started("r2", 3, 0, 4096), p.Tokens("r2", [5], "x"),
                   p.Tokens("r1", [7], "é", [p.TokenLogprob(7, b"\xc3\xa9", -0.5, [p.TopLogprob(7, b"\xc3", -1.5)])]),
                   p.Finished("r1", "stop", 12, 10, 0, 22, 4096), p.Error("r3", "server_error", "boom", 500)]),
    p.StepOutputs([]),
]  # fmt: skip


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_as_two_frames(message):
    frames = p.encode(message)
    assert len(frames) == 2 and len(frames[0]) == 1
    assert p.decode(frames) == message


def test_kinds_are_distinct():
    kinds = [cls.KIND for cls in p.Message.__args__]
    assert len(set(kinds)) == len(kinds)


@pytest.mark.parametrize(
    "frames",
    [
        [b"Z", msgpack.packb(["x"])],  # unknown kind
        [b"A"],  # payload missing
        [b"A", b"\xc1"],  # not msgpack
        [b"A", msgpack.packb(["r1", "extra", "fields"])],  # wrong arity
        [b"S", msgpack.packb(7)],  # not an array
        [b"b", msgpack.packb([ord("S"), ["r1", "m"]])],  # a step carries only its generations' outputs
        [b"b", msgpack.packb([ord("b"), []])],  # no step inside a step
        [b"b", msgpack.packb([ord("t"), ["r1", [7]]])],  # an inner message of the wrong arity
        [b"b", msgpack.packb([ord("t")])],  # a kind without its fields
    ],
)
def test_anything_else_is_a_protocol_error(frames):
    with pytest.raises(p.ProtocolError):
        p.decode(frames)


def test_a_step_is_one_message_as_compact_as_its_parts():
    """Eight streams' tokens of one step travel as one message, in order, in the bytes of eight messages alone."""
    tokens = [p.Tokens(f"{i:032x}", [100 + i], " word") for i in range(8)]
    frames = p.encode(p.StepOutputs(tokens))
    assert len(frames) == 2 and p.decode(frames).messages == tokens
    alone = sum(len(f) for t in tokens for f in p.encode(t))
    assert len(frames[1]) <= alone + 3  # + the one array header
