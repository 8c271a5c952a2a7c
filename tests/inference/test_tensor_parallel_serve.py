"""A model loaded with tensor_parallel 2 through the load route, in a real `serve`: it answers with the text of the
same model on one rank (two requests at once included, batched by its scheduler; a session's turns, with the
same cached tokens), /admin/models shows its ranks, a
trainer's attach is refused with a reason, and its unload ends the follower rank's process."""

from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from tests.inference.session_turns import SYSTEM, USER_TURNS, assistant_message, chat, load
from tests.weights.weights_calls import new_token, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

PROMPTS = ["Once upon a time", "Tom and his dog went to the park. They"]


def completion(api, model: str, prompt: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 40}
    response = api.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def conversation(api, model: str) -> list[tuple[str, int]]:
    """A session's turns (each continues the last, its KV kept between them): each one's answer and cached tokens."""
    messages, turns = [SYSTEM], []
    for user in USER_TURNS[:3]:
        messages.append({"role": "user", "content": user})
        body = chat(api, model, messages, session_id=f"tp-{model}")
        turns.append(
            (body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens_details"]["cached_tokens"])
        )
        messages.append(assistant_message(body))
    assert turns[-1][1] > 0  # the later turns continued the session's KV
    return turns


def test_a_split_load_serves_the_text_of_one_rank_and_its_unload_ends_the_follower(server, api, stories_hf_dir):
    trainer = new_token("trainer", "t")  # so a load may be attachable: the split one is refused all the same
    whole = load(api, stories_hf_dir, "whole", ctx_cap=256, max_sessions=2)
    split = load(api, stories_hf_dir, "split", ctx_cap=256, max_sessions=2, tensor_parallel=2)["tensor_parallel"]
    assert (split["ranks"], split["backend"], split["decode"]) == (2, "gloo", "eager")
    [follower] = split["follower_pids"]
    assert psutil.Process(follower).parent().pid in server.worker_pids()
    assert "tensor_parallel" not in whole

    expected = [completion(api, "whole", prompt) for prompt in PROMPTS]
    assert [completion(api, "split", prompt) for prompt in PROMPTS] == expected
    with ThreadPoolExecutor(2) as pool:  # both in flight at once: one batched step over the two ranks
        assert list(pool.map(lambda prompt: completion(api, "split", prompt), PROMPTS)) == expected

    assert conversation(api, "split") == conversation(api, "whole")

    refused = weights_call(server, "attach", trainer, body={"model": "split"})
    assert refused.error == (400, "NOT_ATTACHABLE", "tensor_parallel")
    assert "load it with tensor_parallel 1" in refused.body["error"]["message"]

    assert api.post("/admin/models/unload", json={"name": "split"}).status_code == 200
    assert not psutil.pid_exists(follower)
    assert completion(api, "whole", PROMPTS[0]) == expected[0]


def test_a_split_that_does_not_divide_is_refused_with_the_reason(api, stories_hf_dir):
    load = {"path": str(stories_hf_dir), "name": "split3", "tensor_parallel": 3}
    response = api.post("/admin/models/load", json=load)
    assert response.status_code == 400, response.text
    assert "do not divide by tensor_parallel 3" in response.json()["error"]["message"]
