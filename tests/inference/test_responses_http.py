"""POST /v1/responses (and GET / DELETE of a stored one) with the `openai` package against a running server: the
same answer as the chat route, OpenAI's stream events, a conversation continued through previous_response_id that
reuses the KV of the turns before, function tools, and the store."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from inference.engine.demo_model import write_demo_model
from tests.inference.session_turns import load
from tests.tool_schemas import WEATHER

pytestmark = pytest.mark.django_db(transaction=True)

STORY = "Once upon a time there was a little girl named Lily. She"
EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture
def sdk(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "stories")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def chat_text(sdk, messages, max_tokens: int) -> str:
    reply = sdk.chat.completions.create(model="stories", messages=messages, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content


def test_a_response_answers_as_the_chat_route_does(sdk):
    reply = sdk.responses.create(model="stories", input=STORY, max_output_tokens=16, temperature=0)
    assert reply.id.startswith("resp_") and reply.output[0].id.startswith("msg_")
    assert reply.output_text == chat_text(sdk, [{"role": "user", "content": STORY}], 16)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 16 and reply.usage.input_tokens > 0
    told = sdk.responses.create(
        model="stories", input=STORY, instructions="Tell a story.", max_output_tokens=8, temperature=0
    )
    system = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": STORY}]
    assert told.output_text == chat_text(sdk, system, 8)
    raw = sdk.responses.with_raw_response.create(model="stories", input=STORY, max_output_tokens=2)
    assert raw.headers["X-miLLM-Model"] == '"stories";origin=model;commits=0'  # which weights answered


def test_a_streamed_response_sends_openais_events_and_the_same_text(sdk):
    whole = sdk.responses.create(model="stories", input=STORY, max_output_tokens=12, temperature=0)
    events = list(sdk.responses.create(model="stories", input=STORY, max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert [k for i, k in enumerate(kinds) if k != "response.output_text.delta" or kinds[i - 1] != k][:-1] == EVENTS
    assert kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].model_extra["millm_model"] == '"stories";origin=model;commits=0'  # which weights answered


def test_each_streamed_event_is_named_by_its_type_on_the_wire(sdk, server):
    body = {"model": "stories", "input": STORY, "max_output_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as response:
        blocks = response.read().decode().strip().split("\n\n")
    assert len(blocks) > len(EVENTS)
    for block in blocks:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        assert name[len("event: ") :] == json.loads(data[len("data: ") :])["type"]


def test_a_conversation_continues_through_previous_response_id_reusing_its_kv(sdk):
    first = sdk.responses.create(model="stories", input=STORY, max_output_tokens=20, temperature=0)
    second = sdk.responses.create(
        model="stories",
        previous_response_id=first.id,
        input="What did Lily do next?",
        max_output_tokens=10,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2  # the turns before
    replayed = [
        {"role": "user", "content": STORY},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What did Lily do next?"},
    ]
    assert second.output_text == chat_text(sdk, replayed, 10)
    assert sdk.responses.retrieve(first.id).output_text == first.output_text
    sdk.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        sdk.responses.create(model="stories", previous_response_id=first.id, input="again")
    unstored = sdk.responses.create(model="stories", input=STORY, max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)


def test_function_tools_give_function_call_items(server, api, tmp_path):
    write_demo_model(tmp_path / "demo")
    load(api, tmp_path / "demo", "demo")
    tool = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as sdk:
        reply = sdk.responses.create(
            model="demo", input="Weather in Paris?", tools=[tool], tool_choice="required", max_output_tokens=200
        )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == tool["name"] and calls[0].call_id.startswith("call_")
    assert isinstance(json.loads(calls[0].arguments), dict)


def test_tools_other_than_functions_are_refused(sdk):
    with pytest.raises(openai.BadRequestError, match="only function tools"):
        sdk.responses.create(model="stories", input="hi", tools=[{"type": "web_search"}])
