"""Tool calling over HTTP on the random-weight demo model, whose free output is noise: only the grammar can make it a
call. `tool_choice: "required"` and a named function always give one call to an offered tool (the named one) whose
arguments validate, side by side with unconstrained requests in one batch; the stream reassembles to the same
message; an output cut inside a call reports `tool_call_error`; malformed tools and choices are 400 before anything
runs; the openai package's whole flow (tools -> tool_calls -> tool message -> answer) works, streaming and not; and
the turn after a call resumes the session's cache, so the call and its result rendered back as the model wrote them.
"""

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from tests.inference.serving import sse_events
from tests.inference.session_turns import error_of, load
from tests.tool_parsing import parse_tool_calls
from tests.tool_schemas import MEASURE, MEASURE_TOOL, SCHEMAS, TOOLS

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED_ADD = {"type": "function", "function": {"name": "add"}}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model  # torch: only the test process imports it

    return write_demo_model(tmp_path_factory.mktemp("demo"))


def ask(api: httpx.Client, **body) -> httpx.Response:
    request = {"model": "demo", "messages": MESSAGES, "max_tokens": 200, "temperature": 1.0, **body}
    return api.post("/v1/chat/completions", json=request)


def assert_one_valid_call(body: dict, name: str | None = None) -> dict:
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    message = choice["message"]
    assert message["content"] is None and "tool_call_error" not in choice
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in SCHEMAS and (name is None or call["function"]["name"] == name)
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    return call


def test_required_and_named_always_call_an_offered_tool_beside_free_requests(api, demo_dir):
    load(api, demo_dir, "demo", max_concurrent=8)

    def constrained(seed: int) -> tuple[str | None, dict]:
        name = "add" if seed % 2 else None
        choice = NAMED_ADD if name else "required"
        response = ask(api, tools=TOOLS, tool_choice=choice, seed=seed)
        assert response.status_code == 200, response.text
        return name, response.json()

    def free(seed: int) -> dict:
        response = ask(api, seed=seed, max_tokens=40, tools=TOOLS)  # tools offered, choice auto: not constrained
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(8) as pool:
        free_runs = [pool.submit(free, seed) for seed in range(10)]
        runs = list(pool.map(constrained, range(30)))
    ids = [assert_one_valid_call(body, name)["id"] for name, body in runs]
    assert len(set(ids)) == len(ids)
    free_choices = [f.result()["choices"][0] for f in free_runs]
    assert all(c["finish_reason"] in ("stop", "length") and isinstance(c["message"]["content"], str)
               for c in free_choices)  # fmt: skip


def stream_message(api: httpx.Client, **body) -> tuple[dict, str, list[dict]]:
    """A streamed completion reassembled: (message, finish_reason, the chunks)."""
    request = {"model": "demo", "messages": MESSAGES, "max_tokens": 200, "temperature": 1.0, "stream": True, **body}
    with api.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        chunks = [e for e in sse_events(response) if isinstance(e, dict)]
    content, calls = [], []
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        content.append(delta.get("content") or "")
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                assert call["index"] == len(calls)
                calls.append({"id": call["id"], "type": call["type"], "function": dict(call["function"])})
            else:
                calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = calls
    return message, chunks[-1]["choices"][0]["finish_reason"], chunks


def without_ids(message: dict) -> dict:
    calls = [{k: v for k, v in call.items() if k != "id"} for call in message.get("tool_calls", [])]
    return {**message, "tool_calls": calls}


def test_the_stream_reassembles_to_the_same_message(api, demo_dir):
    load(api, demo_dir, "demo")
    for seed, choice in [(3, "required"), (4, NAMED_ADD)]:
        whole = ask(api, tools=TOOLS, tool_choice=choice, seed=seed).json()
        message, finish_reason, chunks = stream_message(api, tools=TOOLS, tool_choice=choice, seed=seed)
        assert finish_reason == whole["choices"][0]["finish_reason"] == "tool_calls"
        assert without_ids(message) == without_ids(whole["choices"][0]["message"])
        openings = [c for c in chunks if "id" in (c["choices"][0]["delta"].get("tool_calls") or [{}])[0]]
        assert openings[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == ""


def test_an_output_cut_inside_the_call_reports_tool_call_error(api, demo_dir):
    load(api, demo_dir, "demo")
    body = ask(api, tools=TOOLS, tool_choice="required", seed=1, max_tokens=6).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"] and not choice["message"]["content"]
    assert choice["tool_call_error"]["code"] == "unfinished_call"
    message, finish_reason, chunks = stream_message(api, tools=TOOLS, tool_choice="required", seed=1, max_tokens=6)
    assert finish_reason == "length" and chunks[-1]["choices"][0]["tool_call_error"] == choice["tool_call_error"]
    assert "tool_calls" not in message


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}},
        {"tools": TOOLS, "tool_choice": "always"},
        {"tools": TOOLS, "tool_choice": {"type": "function"}},
        {"tools": TOOLS, "tool_choice": ["required"]},
        {"tool_choice": "required"},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "an object"}}]},
        {"tools": [{"type": "retrieval"}]},
        {"tools": [{"type": "function", "function": {"description": "no name"}}]},
    ],
)
def test_malformed_tools_and_choices_are_400(api, demo_dir, fields):
    load(api, demo_dir, "demo")
    assert error_of(ask(api, **fields)) == (400, "invalid_request_error")


def test_tool_choice_none_offers_no_tools(api, demo_dir):
    load(api, demo_dir, "demo")
    body = ask(api, tools=TOOLS, tool_choice="none", seed=2, max_tokens=30).json()
    assert "tool_calls" not in body["choices"][0]["message"]
    assert body["usage"]["prompt_tokens"] == ask(api, seed=2, max_tokens=1).json()["usage"]["prompt_tokens"]


def test_the_openai_package_runs_the_whole_tool_flow_streaming_and_not(server, api, demo_dir):
    load(api, demo_dir, "demo")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    first = client.chat.completions.create(
        model="demo", messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=11, temperature=1.0, max_tokens=200
    )
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name in SCHEMAS
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    history = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    final = client.chat.completions.create(model="demo", messages=history, tools=TOOLS, seed=1, max_tokens=20)
    assert final.choices[0].finish_reason in ("stop", "length") and isinstance(final.choices[0].message.content, str)

    stream = client.chat.completions.create(
        model="demo", messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=11, temperature=1.0,
        max_tokens=200, stream=True,
    )  # fmt: skip
    names, arguments, finish = {}, {}, None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.function.name:
                names[delta.index] = delta.function.name
            arguments[delta.index] = arguments.get(delta.index, "") + (delta.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert (names[0], arguments[0]) == (call.function.name, call.function.arguments)  # the same seed, both ways


def test_the_turn_after_a_call_resumes_the_session(api, demo_dir):
    load(api, demo_dir, "demo")
    first = ask(api, tools=TOOLS, tool_choice="required", seed=5, session_id="tools-1").json()
    call = assert_one_valid_call(first)
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "21 degrees"},
    ]
    second = ask(api, messages=history, tools=TOOLS, seed=5, max_tokens=8, session_id="tools-1").json()
    usage = first["usage"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the whole first turn, prompt and call, is reused (its very last token may be recomputed)
    assert cached >= usage["prompt_tokens"] + usage["completion_tokens"] - 1


def test_v1_models_reports_whether_required_may_think(api, demo_dir, stories_hf_dir):
    load(api, demo_dir, "demo")
    load(api, stories_hf_dir, "stories")
    rows = {row["id"]: row for row in api.get("/v1/models").json()["data"]}
    assert rows["demo"]["tool_choice_required_with_thinking"] is True  # its vocabulary has a <think> token
    assert rows["stories"]["tool_choice_required_with_thinking"] is False  # no think block to wait for
    dialects = {row["id"]: row["tool_dialect"] for row in api.get("/admin/models").json()["data"]}
    # the demo template writes <tool_call>; stories260K's writes no call markup, but it is a Llama whose template
    # writes the BOS, which the spec takes for MiniCPM
    assert dialects == {"demo": "hermes", "stories": "minicpm"}


def test_a_constrained_call_has_the_logprobs_of_the_tokens_it_emitted(api, demo_dir):
    load(api, demo_dir, "demo")
    body = ask(api, tools=TOOLS, tool_choice="required", seed=9, logprobs=True, top_logprobs=20).json()
    [call] = body["choices"][0]["message"]["tool_calls"]
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == body["usage"]["completion_tokens"] - 1  # every token but the one that ended the turn
    assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 20 for e in entries)
    _, [parsed], _ = parse_tool_calls("hermes", TOOLS, "".join(e["token"] for e in entries))
    assert (parsed.name, parsed.arguments) == (call["function"]["name"], call["function"]["arguments"])


def demo_variant(demo_dir, directory, **tokenizer_config) -> object:
    """A copy of the demo model with its tokenizer_config.json changed (its template, its BOS)."""
    directory = shutil.copytree(demo_dir, directory / "model")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, **tokenizer_config}))
    return directory


@pytest.fixture(scope="module")
def dialect_dirs(demo_dir, tmp_path_factory):
    """The demo model as each dialect's model: its own template writes hermes calls; qwen3_coder's call markup in
    the template; a template that writes the BOS and no call markup (a Llama, so MiniCPM's); and `json` for a served
    name that starts with "ornith"."""
    template = json.loads((demo_dir / "tokenizer_config.json").read_text())["chat_template"]
    plain = (
        "{{- bos_token }}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    return {
        "hermes": ("demo", demo_dir),
        "qwen3_coder": ("coder", demo_variant(demo_dir, tmp_path_factory.mktemp("coder"),
                                              chat_template=template + "{#- calls: <function=NAME> -#}")),
        "minicpm": ("minicpm", demo_variant(demo_dir, tmp_path_factory.mktemp("minicpm"), chat_template=plain,
                                            bos_token="<|endoftext|>")),
        "json": ("ornith", demo_dir),
    }  # fmt: skip


@pytest.mark.parametrize("dialect", ["hermes", "qwen3_coder", "minicpm", "json"])
def test_a_compelled_call_whose_arguments_are_numbers_completes_on_a_model_that_loves_digits(
    api, dialect_dirs, dialect
):
    """A random-weight model pushed to digits (logit_bias on every digit token) writes each number only as far as
    the grammar lets it (16 integral digits), so the call completes instead of running out at max_tokens."""
    from inference.engine.text.tokenizer import Tokenizer
    from tests.engine.digit_model import digit_bias

    name, path = dialect_dirs[dialect]
    load(api, path, name)
    assert {row["id"]: row["tool_dialect"] for row in api.get("/admin/models").json()["data"]}[name] == dialect
    body = api.post("/v1/chat/completions", json={
        "model": name, "messages": MESSAGES, "max_tokens": 400, "temperature": 1.0, "seed": 3,
        "tools": [MEASURE_TOOL], "tool_choice": {"type": "function", "function": {"name": "measure"}},
        "logit_bias": digit_bias(Tokenizer.from_hf_dir(path)),
    }).json()  # fmt: skip
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, MEASURE)
    assert len(str(arguments["count"])) == 16 and all(math.isfinite(value) for value in arguments.values())
