"""POST /v1/completions with the `openai` package against a running server: prompt forms, echo and legacy
logprobs (prompt logprobs equal to the engine's teacher-forced log-softmax), streaming, and its refusals."""

from __future__ import annotations

import openai
import pytest

from inference.engine.demo_model import write_demo_model
from inference.engine.loaders.loading import load_model
from tests.greedy import greedy
from tests.inference.session_turns import load

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Once upon a time there was a little girl named Lily."


@pytest.fixture
def sdk(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "stories")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def engine(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=1)


def teacher_forced(engine, ids: list[int]):
    slot = engine.runner.allocate_slot()
    try:
        return engine.runner.prefill(slot, ids, all_logits=True).log_softmax(-1)
    finally:
        engine.runner.free_slot(slot)


def test_a_completion_continues_the_prompt_without_a_template(sdk, engine):
    reply = sdk.completions.create(model="stories", prompt=PROMPT, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=True)
    assert reply.usage.prompt_tokens == len(ids)  # the text as it is, with the BOS: no chat template
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 12
    assert choice.text == engine.tokenizer.decode(greedy(engine.runner, ids, 12).tokens)
    as_ids = sdk.completions.create(model="stories", prompt=ids, max_tokens=12, temperature=0)
    assert as_ids.choices[0].text == choice.text


def test_echo_with_max_tokens_0_scores_the_prompt_as_the_engine_does(sdk, engine):
    reply = sdk.completions.create(model="stories", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = reply.choices[0]
    logprobs = choice.logprobs
    ids = engine.tokenizer.encode(PROMPT, add_special_tokens=True)
    reference = teacher_forced(engine, ids)
    assert choice.text == engine.tokenizer.decode(ids) and reply.usage.completion_tokens == 0
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for position in range(1, len(ids)):
        assert logprobs.token_logprobs[position] == pytest.approx(
            reference[position - 1, ids[position]].item(), abs=1e-4
        )
        assert len(logprobs.top_logprobs[position]) == 1
    assert "".join(logprobs.tokens) == choice.text  # the tokens spell the text, offsets point into it
    assert [
        choice.text[o : o + len(t)] for o, t in zip(logprobs.text_offset, logprobs.tokens, strict=True)
    ] == logprobs.tokens


def test_echo_and_logprobs_with_a_continuation_spell_it_all(sdk):
    reply = sdk.completions.create(model="stories", prompt=PROMPT, max_tokens=10, echo=True, logprobs=2, temperature=0)
    choice = reply.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert "".join(choice.logprobs.tokens) == choice.text
    plain = sdk.completions.create(model="stories", prompt=PROMPT, max_tokens=10, temperature=0).choices[0].text
    assert choice.text == PROMPT + plain


def test_several_prompts_and_n_choices_are_indexed_prompt_by_prompt(sdk):
    prompts = ["Once upon a time", "The sun was"]
    reply = sdk.completions.create(model="stories", prompt=prompts, max_tokens=6, n=2, temperature=1.0, seed=3)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    alone = sdk.completions.create(model="stories", prompt=prompts[1], max_tokens=6, n=2, temperature=1.0, seed=3)
    assert [c.text for c in reply.choices[2:]] == [c.text for c in alone.choices]
    assert reply.usage.completion_tokens == 24


def test_a_streamed_completion_equals_the_whole_one(sdk):
    fields = {"model": "stories", "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 0, "echo": True}
    whole = sdk.completions.create(**fields).choices[0]
    chunks = list(sdk.completions.create(**fields, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert text == whole.text and "".join(tokens) == whole.text
    assert chunks[-1].usage.completion_tokens == 16 and chunks[-2].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("fields", "mentions"),
    [
        ({"suffix": "The end."}, "suffix"),
        ({"max_tokens": 0}, "only with echo"),
        ({"prompt": []}, "must not be an empty list"),
        ({"prompt": [1, "a"]}, "must be a string"),
        ({"prompt": [[1, 2], [-5]]}, "token ids must be integers"),
        ({"best_of": 3}, "best_of"),
    ],
)
def test_bad_completion_bodies_are_400s_that_say_why(sdk, fields, mentions):
    with pytest.raises(openai.BadRequestError, match=mentions):
        sdk.completions.create(**{"model": "stories", "prompt": PROMPT, **fields})


def test_a_prompt_over_the_window_is_context_over_budget(sdk):
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.completions.create(model="stories", prompt=[1] * 600, max_tokens=4)


def test_logprob_tokens_spell_the_text_on_a_byte_token_model(server, api, tmp_path):
    write_demo_model(tmp_path / "demo")  # random weights: its output is mostly byte tokens
    load(api, tmp_path / "demo", "demo")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as sdk:
        fields = {"model": "demo", "prompt": PROMPT, "max_tokens": 40, "logprobs": 1, "temperature": 1.0, "seed": 5}
        for echo in (False, True):
            choice = sdk.completions.create(**fields, echo=echo).choices[0]
            assert "".join(choice.logprobs.tokens) == choice.text
            chunks = list(sdk.completions.create(**fields, echo=echo, stream=True))
            tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
            assert "".join(tokens) == "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
        eos = {"model": "demo", "prompt": PROMPT, "max_tokens": 5, "logit_bias": {"2": 100}}  # its <|im_end|>
        assert sdk.completions.create(**eos).usage.completion_tokens == 1
        assert sdk.completions.create(**eos, extra_body={"ignore_eos": True}).usage.completion_tokens == 5  # vLLM's
