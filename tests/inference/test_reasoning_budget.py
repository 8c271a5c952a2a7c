"""Reasoning on a model whose chat template opens the think block in the prompt (the random-weight demo model with
such a template): the output starts inside the block, so it is reasoning_content until the block closes; a
reasoning budget of 8 closes it after 8 tokens (the closing text is forced) and the rest is content, in both
response forms, with the request's budget or the load's default."""

import json

import jsonschema
import pytest

from tests.inference.serving import sse_events
from tests.inference.session_turns import load

pytestmark = pytest.mark.django_db(transaction=True)

OPENS_THINK = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)
MESSAGES = [{"role": "user", "content": "Think, then answer."}]


@pytest.fixture(scope="module")
def thinking_demo(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model  # torch: only the test process imports it

    directory = write_demo_model(tmp_path_factory.mktemp("thinking-demo"))
    (directory / "chat_template.jinja").write_text(OPENS_THINK)
    return directory


def ask(api, **body) -> dict:
    request = {"model": "t", "messages": MESSAGES, "max_tokens": 48, "temperature": 1.0, "logprobs": True, **body}
    response = api.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("field", ["reasoning_budget", "max_reasoning_tokens"])
def test_a_budget_of_8_closes_the_block_after_8_tokens(api, thinking_demo, field):
    load(api, thinking_demo, "t")
    for seed in range(3):
        body = ask(api, seed=seed, **{field: 8})
        message = body["choices"][0]["message"]
        tokens = "".join(e["token"] for e in body["choices"][0]["logprobs"]["content"])
        head, tag, tail = tokens.partition("</think>")
        assert tag, tokens  # the block was closed
        assert message["reasoning_content"] == head.lstrip("\n")
        assert message["content"] and tail.lstrip("\n").startswith(message["content"])  # (tail: + a stop token)
        first_eight = "".join(e["token"] for e in body["choices"][0]["logprobs"]["content"][:8])
        assert head.startswith(first_eight) and len(head.strip()) <= len(first_eight) + 2


def test_without_a_budget_the_output_stays_reasoning(api, thinking_demo):
    load(api, thinking_demo, "t")
    body = ask(api, seed=1)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and not message["content"]
    assert body["choices"][0]["finish_reason"] == "length"


def test_the_loads_budget_is_the_default_and_a_request_may_lift_it(api, thinking_demo):
    load(api, thinking_demo, "t", reasoning_budget=8)
    assert ask(api, seed=2)["choices"][0]["message"]["content"]
    unbounded = ask(api, seed=2, reasoning_budget=0)["choices"][0]["message"]
    assert not unbounded["content"]


def test_the_stream_splits_the_same_way(api, thinking_demo):
    load(api, thinking_demo, "t")
    whole = ask(api, seed=4, reasoning_budget=8)["choices"][0]["message"]
    request = {"model": "t", "messages": MESSAGES, "max_tokens": 48, "temperature": 1.0, "seed": 4}
    request |= {"reasoning_budget": 8, "stream": True}
    with api.stream("POST", "/v1/chat/completions", json=request) as response:
        deltas = [e["choices"][0]["delta"] for e in sse_events(response) if isinstance(e, dict) and e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == whole["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == whole["content"]


def test_a_json_schema_constrains_the_answer_after_the_think_block_not_the_reasoning(api, thinking_demo):
    load(api, thinking_demo, "t")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "c": {"enum": ["red", "blue"]}},
        "required": ["n", "c"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    for seed in range(3):
        body = ask(api, seed=seed, reasoning_budget=8, max_tokens=80, response_format=response_format)
        message = body["choices"][0]["message"]
        assert message["reasoning_content"]  # free text, not JSON
        jsonschema.validate(json.loads(message["content"]), schema)
        assert (body["choices"][0]["finish_reason"], body["response_format_status"]) == ("stop", "applied")
    cut = ask(api, seed=0, max_tokens=20, response_format=response_format)  # never leaves the think block
    assert cut["response_format_status"] == "not_enforced"
