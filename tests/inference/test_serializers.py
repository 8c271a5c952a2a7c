"""The request bodies as the spec defines them: defaults, clamps, aliases, lenient message content, and a 400
invalid_request_error naming the field for everything else."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from inference.api.chat_requests import parse_chat_request
from inference.api.serializers import UnloadModelSerializer, parse_body
from inference.engine.contract.params import SamplingParams
from inference.services.load_body import LoadModelSerializer
from pantheon_site.errors import InvalidRequest

HELLO = [{"role": "user", "content": "hello"}]


def chat(**fields):
    return parse_chat_request(json.dumps({"messages": HELLO, **fields}).encode())


def test_defaults_are_the_specs():
    request = chat()
    assert request.sampling == SamplingParams(temperature=0.7, top_p=0.95, top_k=40)
    assert request.options.max_tokens == 1024
    delivery = request.delivery
    assert (request.model, request.options.stop, delivery.stream, delivery.include_usage) == ("", [], False, False)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 0}, 512),
        ({"max_tokens": -5}, 512),
        ({"max_tokens": 10**9}, 1_048_576),
        ({"max_completion_tokens": 7}, 7),
        ({"max_tokens": 3, "max_completion_tokens": 7}, 3),
        ({"max_tokens": None, "max_completion_tokens": 7}, 7),
    ],
)
def test_max_tokens_clamps_and_alias(fields, expected):
    assert chat(**fields).options.max_tokens == expected


def test_penalties_logit_bias_and_top_logprobs_are_clamped():
    request = chat(
        presence_penalty=5,
        frequency_penalty=-9,
        logprobs=True,
        top_logprobs=50,
        logit_bias={"7": 250, "8": -1000, "9": 1.5, "x": 3, "10": "high", "11": True},
    )
    assert request.sampling.presence_penalty == 2.0
    assert request.sampling.frequency_penalty == -2.0
    assert request.sampling.top_logprobs == 20
    assert request.sampling.logit_bias == {7: 100.0, 8: -100.0, 9: 1.5}


def test_top_logprobs_only_with_logprobs():
    assert chat(top_logprobs=5).sampling.top_logprobs == 0


def test_stop_string_or_list_and_stream_options():
    assert chat(stop="END").options.stop == ["END"]
    assert chat(stop=["a", "", "b"]).options.stop == ["a", "b"]
    streaming = chat(stream=True, stream_options={"include_usage": True}).delivery
    assert streaming.stream and streaming.include_usage


def test_messages_missing_role_is_user_and_text_parts_are_joined():
    parts = [{"type": "text", "text": "Once upon "}, {"type": "input_text", "text": "a time"}]
    request = parse_chat_request(
        json.dumps(
            {
                "messages": [
                    {"content": "hi"},
                    {"role": "user", "content": parts},
                    {"role": "assistant", "content": None, "reasoning_content": "thought"},
                    {"role": "user", "content": "again", "reasoning_content": "dropped"},
                ]
            }
        ).encode()
    )
    assert request.messages == [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "Once upon a time"},
        {"role": "assistant", "content": "", "reasoning_content": "thought"},
        {"role": "user", "content": "again"},
    ]


@pytest.mark.parametrize(
    ("content", "mentions"),
    [
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}], "'image_url' cannot be read"),
        (
            [{"type": "text", "text": "look"}, {"type": "input_audio", "input_audio": {}}],
            "'input_audio' cannot be read",
        ),
        ([{"type": "hologram", "text": "x"}], "unknown content part type 'hologram'"),
        ([{"type": "text"}], "needs a string `text`"),
        (["bare string"], "must be an object"),
        (42, "must be a string, an array of content parts or null"),
    ],
)
def test_content_a_text_model_cannot_read_is_refused(content, mentions):
    with pytest.raises(InvalidRequest, match=mentions):
        parse_chat_request(json.dumps({"messages": [{"role": "user", "content": content}]}).encode())


def test_seed_is_kept_within_63_bits():
    assert chat(seed=5).sampling.seed == 5
    assert 0 <= chat(seed=-1).sampling.seed < 2**63


def test_tool_choice_none_drops_tools():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert chat(tools=tools).tool_plan.tools == tools
    assert chat(tools=tools, tool_choice="none").tool_plan.tools is None


@pytest.mark.parametrize(
    ("setting", "choice", "grammar", "function"),
    [
        ("", "auto", None, None),
        ("", "required", "required", None),
        ("", {"type": "function", "function": {"name": "g"}}, "required", "g"),
        ("1", "auto", "auto", None),
        ("1", "required", "required", None),
        ("0", "required", None, None),
        ("0", {"type": "function", "function": {"name": "g"}}, None, None),
    ],
)
def test_pantheon_tool_grammar_decides_what_is_constrained(settings, setting, choice, grammar, function):
    settings.PANTHEON_TOOL_GRAMMAR = setting
    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    plan = chat(tools=tools, tool_choice=choice).tool_plan
    assert (plan.tools, plan.grammar, plan.function) == (tools, grammar, function)


def test_pantheon_no_think_turns_thinking_off_unless_the_request_asks(settings):
    assert chat().enable_thinking is None
    settings.PANTHEON_NO_THINK = True
    assert chat().enable_thinking is False
    assert chat(enable_thinking=True).enable_thinking is True


@pytest.mark.parametrize(
    ("raw", "mentions"),
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"{not json", "JSON"),
        (b"[1, 2]", "object"),
        (b'"text"', "object"),
        (b"{}", "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": "hello"}', "messages"),
        (b'{"messages": ["hello"]}', "messages"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "role"),
        (b'{"messages": [{"content": "x"}], "temperature": "hot"}', "temperature"),
        (b'{"messages": [{"content": "x"}], "stop": [1]}', "stop"),
        (b'{"messages": [{"content": "x"}], "logit_bias": [1]}', "logit_bias"),
        (b'{"messages": [{"content": "x"}], "max_tokens": 1.5}', "max_tokens"),
    ],
)
def test_invalid_bodies_are_invalid_request_errors(raw, mentions):
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw)
    assert caught.value.status == 400 and caught.value.type == "invalid_request_error"
    assert mentions in caught.value.message


def test_nothing_of_one_request_carries_into_the_next():
    """The serializers are bound once and reused (serializers.validated): a request's values, or its error, must
    not show in the next one's, on the same thread or on others at the same time."""
    chat(temperature=0.1, top_p=0.5, stop=["x"], max_tokens=3, logprobs=True, top_logprobs=2, seed=7)
    with pytest.raises(InvalidRequest):
        parse_chat_request(b'{"messages": [{"role": "wizard", "content": "x"}], "temperature": "hot"}')
    request = chat()
    assert request.sampling == SamplingParams(temperature=0.7, top_p=0.95, top_k=40)
    assert (request.options.max_tokens, request.options.stop) == (1024, [])

    def parsed(n):
        return [chat(max_tokens=n, stop=[str(n)]) for _ in range(200)]

    with ThreadPoolExecutor(4) as pool:
        for n, requests in zip(range(1, 5), pool.map(parsed, range(1, 5)), strict=True):
            assert {(r.options.max_tokens, tuple(r.options.stop)) for r in requests} == {(n, (str(n),))}


def test_load_body():
    body = parse_body(LoadModelSerializer, b'{"path": "/m.gguf", "dies": [0], "ctx_cap": -1, "max_concurrent": 2}')
    assert body["path"] == "/m.gguf" and body["dies"] == [0]
    assert body["ctx_cap"] == 0 and body["max_concurrent"] == 2
    assert "quantize" not in body  # an option the body leaves out keeps the catalogue entry's value


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{oops",
        b"{}",
        b'{"name": "x"}',
        b'{"path": "/m", "dies": [0,1,2,3,4,5,6,7,8]}',
        b'{"path": "/m", "device": "tpu"}',
        b'{"path": "/m", "dies": [-1]}',
    ],
)
def test_invalid_load_bodies(raw):
    with pytest.raises(InvalidRequest):
        parse_body(LoadModelSerializer, raw)


def test_unload_body_needs_a_name_or_an_id():
    assert parse_body(UnloadModelSerializer, b'{"name": "m"}') == {"name": "m"}
    assert parse_body(UnloadModelSerializer, b'{"id": 3}') == {"id": 3}
    for raw in (b"{}", b'{"name": ""}', b"[]", b"{bad"):
        with pytest.raises(InvalidRequest):
            parse_body(UnloadModelSerializer, raw)
