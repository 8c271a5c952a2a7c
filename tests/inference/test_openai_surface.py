"""The OpenAI surface beyond plain chat, as clients use it: content parts, and logprobs that spell the answer."""

from __future__ import annotations

import pytest

from inference.engine.demo_model import write_demo_model
from tests.inference.serving import sse_events
from tests.inference.session_turns import chat, load

pytestmark = pytest.mark.django_db(transaction=True)

STORY = "Once upon a time there was a little girl named Lily. She"


@pytest.fixture
def stories(api, stories_hf_dir):
    load(api, stories_hf_dir, "stories")
    return "stories"


@pytest.fixture
def demo(api, tmp_path):
    write_demo_model(tmp_path / "demo")
    load(api, tmp_path / "demo", "demo")
    return "demo"


def test_text_parts_give_the_prompt_the_same_text_gives(api, stories):
    as_text = chat(api, stories, [{"role": "user", "content": STORY}], max_tokens=8)
    parts = [{"type": "text", "text": STORY[:20]}, {"type": "text", "text": STORY[20:]}]
    as_parts = chat(api, stories, [{"role": "user", "content": parts}], max_tokens=8)
    assert as_parts["usage"]["prompt_tokens"] == as_text["usage"]["prompt_tokens"]
    assert as_parts["choices"][0]["message"]["content"] == as_text["choices"][0]["message"]["content"]


def test_an_image_part_is_refused_not_dropped(api, stories):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    response = api.post(
        "/v1/chat/completions",
        json={
            "model": stories,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}],
        },
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "image_url" in error["message"]


@pytest.mark.parametrize("model", ["stories", "demo"])
def test_logprob_tokens_spell_the_content(request, api, model):
    name = request.getfixturevalue(model)
    body = chat(
        api,
        name,
        [{"role": "user", "content": STORY}],
        max_tokens=40,
        logprobs=True,
        top_logprobs=2,
        temperature=1.0,
        seed=7,
    )
    choice = body["choices"][0]
    entries = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries) == choice["message"]["content"].encode()


@pytest.mark.parametrize("model", ["stories", "demo"])
def test_streamed_logprob_tokens_spell_the_streamed_content(request, api, model):
    name = request.getfixturevalue(model)
    body = {
        "model": name,
        "messages": [{"role": "user", "content": STORY}],
        "max_tokens": 40,
        "logprobs": True,
        "temperature": 1.0,
        "seed": 11,
        "stream": True,
    }
    with api.stream("POST", "/v1/chat/completions", json=body) as response:
        events = sse_events(response)
    deltas = [e["choices"][0] for e in events if isinstance(e, dict) and e.get("choices")]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    tokens = "".join(t["token"] for d in deltas for t in (d.get("logprobs") or {}).get("content") or [])
    assert content and tokens == content


def test_logprob_tokens_spell_content_cut_by_a_stop_string(api, stories):
    free = chat(api, stories, [{"role": "user", "content": STORY}], max_tokens=40)["choices"][0]["message"]["content"]
    stop = free.split()[3]  # a word the answer reaches
    body = chat(api, stories, [{"role": "user", "content": STORY}], max_tokens=40, logprobs=True, stop=[stop])
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and stop not in choice["message"]["content"]
    assert "".join(e["token"] for e in choice["logprobs"]["content"]) == choice["message"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in choice["logprobs"]["content"]) == choice["message"]["content"].encode()


def test_vllm_fields_ignore_eos_min_tokens_stop_token_ids_and_special_tokens(api, stories, demo):
    prompt = [{"role": "user", "content": STORY}]
    eos = {"logit_bias": {"2": 100}, "max_tokens": 6}  # stories260K's end of sequence, every time
    assert chat(api, stories, prompt, **eos)["usage"]["completion_tokens"] == 1  # it ends at once ...
    assert chat(api, stories, prompt, **eos, ignore_eos=True)["usage"]["completion_tokens"] == 6  # ... or goes on
    at_least = chat(api, stories, prompt, **eos, min_tokens=4)
    assert at_least["usage"]["completion_tokens"] == 5 and at_least["choices"][0]["finish_reason"] == "stop"
    forced = {"logit_bias": {"300": 100}, "max_tokens": 3}  # " ha", every time
    assert chat(api, stories, prompt, **forced)["choices"][0]["message"]["content"] == "ha ha ha"
    cut = chat(api, stories, prompt, **forced, stop_token_ids=[300])
    assert cut["choices"][0]["finish_reason"] == "stop" and cut["usage"]["completion_tokens"] == 1
    assert cut["choices"][0]["message"]["content"] == ""  # a stop token is not part of the text
    special = {"logit_bias": {"1": 100}, "max_tokens": 2}  # the demo model's <|im_start|>, a special token
    assert chat(api, demo, prompt, **special)["choices"][0]["message"]["content"] == ""
    kept = chat(api, demo, prompt, **special, skip_special_tokens=False)["choices"][0]["message"]["content"]
    assert kept == "<|im_start|><|im_start|>"
    assert (
        api.post("/v1/chat/completions", json={"model": stories, "messages": prompt, "min_tokens": -1}).status_code
        == 400
    )
