"""POST /v1/embeddings with the `openai` package: the vector is Hugging Face transformers' final hidden state,
pooled and normalised; float and base64 agree; inputs in every form; refusals."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch
from transformers import AutoModel

from inference.engine.text.tokenizer import Tokenizer
from tests.inference.session_turns import load

pytestmark = pytest.mark.django_db(transaction=True)

TEXTS = ["Once upon a time there was a little girl named Lily.", "The sun was warm and the sky was blue."]


@pytest.fixture(scope="module")
def reference(stories_hf_dir):
    return AutoModel.from_pretrained(stories_hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


def hidden_states(reference, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference(torch.tensor([ids])).last_hidden_state[0]  # [S, D], after the final norm


@pytest.fixture
def sdk(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "stories")
    load(api, stories_hf_dir, "stories-last", pooling="last")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_an_embedding_is_the_mean_pooled_final_hidden_state(sdk, reference, tokenizer):
    reply = sdk.embeddings.create(model="stories", input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1]
    ids = [tokenizer.encode(text, add_special_tokens=True) for text in TEXTS]
    assert reply.usage.prompt_tokens == sum(len(i) for i in ids) == reply.usage.total_tokens
    for item, tokens in zip(reply.data, ids, strict=True):
        expected = torch.nn.functional.normalize(hidden_states(reference, tokens).mean(0), dim=-1)
        assert torch.allclose(torch.tensor(item.embedding), expected, atol=1e-4)
    last = sdk.embeddings.create(model="stories-last", input=TEXTS[0]).data[0].embedding
    expected = torch.nn.functional.normalize(hidden_states(reference, ids[0])[-1], dim=-1)
    assert torch.allclose(torch.tensor(last), expected, atol=1e-4)  # the load's pooling option


def test_float_and_base64_agree_and_token_ids_are_inputs_too(sdk, tokenizer):
    as_float = sdk.embeddings.create(model="stories", input=TEXTS[0]).data[0].embedding
    raw = sdk.embeddings.with_raw_response.create(model="stories", input=TEXTS[0], encoding_format="base64")
    encoded = raw.http_response.json()["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist() == pytest.approx(as_float, abs=0)
    ids = tokenizer.encode(TEXTS[0], add_special_tokens=True)
    assert sdk.embeddings.create(model="stories", input=ids).data[0].embedding == pytest.approx(as_float, abs=1e-6)
    both = sdk.embeddings.create(model="stories", input=[ids, ids[:5]])
    assert len(both.data) == 2 and both.usage.prompt_tokens == len(ids) + 5


def test_refusals(sdk):
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.embeddings.create(model="stories", input=[[5] * 600])
    with pytest.raises(openai.BadRequestError, match="dimensions must be 64"):
        sdk.embeddings.create(model="stories", input="hi", dimensions=32)
    with pytest.raises(openai.BadRequestError, match="must not be an empty list"):
        sdk.embeddings.create(model="stories", input=[])


def test_inputs_of_different_lengths_embedded_together_equal_each_alone(sdk):
    texts = [TEXTS[0], "Hi", TEXTS[1] * 3] * 4  # more inputs than the model's slots: several passes
    together = sdk.embeddings.create(model="stories", input=texts).data
    for text, item in zip(texts[:3], together[:3], strict=True):
        alone = sdk.embeddings.create(model="stories", input=text).data[0].embedding
        assert item.embedding == pytest.approx(alone, abs=1e-5)
    last = sdk.embeddings.create(model="stories-last", input=texts).data
    assert last[1].embedding == pytest.approx(
        sdk.embeddings.create(model="stories-last", input="Hi").data[0].embedding, abs=1e-5
    )
