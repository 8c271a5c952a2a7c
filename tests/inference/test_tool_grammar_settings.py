"""PANTHEON_TOOL_GRAMMAR over HTTP, and tool calls on a think-style template, on the random-weight demo model.

With `1`, `auto` keeps every call the model opens well formed (the demo's `<tool_call>` token is pushed with a
logit bias so that calls open at all); with `0` the same requests, and even `required`, decode free, so the noise
shows up as broken calls. On a template that opens the think block in the prompt, `required` leaves the reasoning
free and compels the call after `</think>`, and /v1/models says so."""

import json

import jsonschema
import pytest
from tokenizers import Tokenizer

from tests.inference.serving import operator_client
from tests.inference.session_turns import load
from tests.inference.test_tool_calls_http import MESSAGES, assert_one_valid_call
from tests.tool_schemas import SCHEMAS, TOOLS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model  # torch: only the test process imports it

    return write_demo_model(tmp_path_factory.mktemp("demo"))


def bias(demo_dir, token: str, value: float) -> dict[str, float]:
    return {str(Tokenizer.from_file(str(demo_dir / "tokenizer.json")).token_to_id(token)): value}


@pytest.fixture(scope="module")
def opener_bias(demo_dir) -> dict[str, float]:
    """A logit bias that makes the demo model open calls often."""
    return bias(demo_dir, "<tool_call>", 6.0)


@pytest.fixture(scope="module")
def thinking_demo(tmp_path_factory):
    """The demo model with its own template (tools and all), except that the assistant turn opens a think block."""
    from inference.engine.demo_model import CHAT_TEMPLATE, write_demo_model

    directory = write_demo_model(tmp_path_factory.mktemp("thinking-demo"))
    closed = (
        "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    )
    assert closed in CHAT_TEMPLATE
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace(closed, "{{- '<think>\\n' }}"))
    return directory


def chat(client, **body) -> dict:
    request = {"model": "demo", "messages": MESSAGES, "max_tokens": 120, "temperature": 1.0, "tools": TOOLS, **body}
    response = client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    return response.json()


def calls_and_errors(bodies: list[dict]) -> tuple[list[dict], list[dict]]:
    calls = [call for b in bodies for call in b["choices"][0]["message"].get("tool_calls") or []]
    errors = [b["choices"][0]["tool_call_error"] for b in bodies if "tool_call_error" in b["choices"][0]]
    return calls, errors


def test_with_1_auto_keeps_every_opened_call_well_formed(start_server, operator_token, demo_dir, opener_bias):
    server = start_server(PANTHEON_TOOL_GRAMMAR="1")
    with operator_client(server, operator_token) as api:
        load(api, demo_dir, "demo")
        bodies = [chat(api, seed=seed, logit_bias=opener_bias) for seed in range(12)]
    calls, errors = calls_and_errors(bodies)
    assert calls, "the bias should have made the model open calls"
    for call in calls:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    assert all(e["code"] == "unfinished_call" for e in errors)  # only a call still open at max_tokens


def test_with_0_nothing_is_constrained(start_server, operator_token, demo_dir, opener_bias):
    server = start_server(PANTHEON_TOOL_GRAMMAR="0")
    with operator_client(server, operator_token) as api:
        load(api, demo_dir, "demo")
        bodies = [chat(api, seed=seed, logit_bias=opener_bias, tool_choice="required") for seed in range(12)]
        assert api.get("/v1/models").json()["data"][0]["tool_choice_required_with_thinking"] is False
    calls, errors = calls_and_errors(bodies)
    assert not calls and any(e["code"] in ("malformed_call", "unfinished_call") for e in errors)


def test_required_with_thinking_reasons_freely_then_calls(api, thinking_demo):
    load(api, thinking_demo, "t")
    assert api.get("/v1/models").json()["data"][0]["tool_choice_required_with_thinking"] is True
    for seed in range(4):
        body = chat(api, model="t", seed=seed, tool_choice="required", reasoning_budget=8, max_tokens=200)
        assert body["choices"][0]["message"]["reasoning_content"]
        assert_one_valid_call(body)


def test_with_thinking_on_the_output_may_open_its_own_think_block_before_the_call(api, demo_dir):
    """The demo template leaves the think block to the model; a bias makes it open one (it is a single token)."""
    load(api, demo_dir, "demo")
    thinking = bias(demo_dir, "<think>", 12.0)
    for seed in range(4):
        body = chat(api, seed=seed, tool_choice="required", enable_thinking=True, reasoning_budget=8,
                    logit_bias=thinking, max_tokens=200)  # fmt: skip
        assert body["choices"][0]["message"]["reasoning_content"]
        assert_one_valid_call(body)
    body = chat(api, seed=0, tool_choice="required", logit_bias=thinking)  # thinking not asked for: no block
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert_one_valid_call(body)
