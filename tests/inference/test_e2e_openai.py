"""Pantheon end to end, as a user runs it: `manage.py load_model` with no server running catalogues stories260K,
`manage.py serve` starts with a real worker process and loads it, and the `openai` package lists the model and gets
a non-streaming and a streaming chat completion whose text is exactly the engine's own greedy output."""

import os
from pathlib import Path

import openai
import psutil
import pytest

from inference.engine.loaders.loading import load_model
from inference.engine.text.chat_template import ChatTemplate
from inference.models import CatalogModel
from tests.greedy import greedy
from tests.inference.serving import run_manage, serving_env, wait_for

MESSAGES = [
    {"role": "system", "content": "You tell short stories."},
    {"role": "user", "content": "Tell me about a cat named Tom."},
]
MAX_TOKENS = 24

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def reference(stories_hf_dir):
    """The engine's greedy completion of MESSAGES through its runner: prompt ids, completion ids, text."""
    model = load_model(stories_hf_dir, max_concurrent=1)
    tok = model.tokenizer
    text = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token).render(MESSAGES)
    prompt = tok.encode(text, add_special_tokens=not (tok.bos_token and text.startswith(tok.bos_token)))
    out = greedy(model.runner, prompt, MAX_TOKENS, stop=model.eos_token_ids).tokens
    completion = [t for t in out if t not in model.eos_token_ids]
    return prompt, completion, tok.decode(completion), "stop" if len(completion) < len(out) else "length"


@pytest.fixture(scope="module")
def server(start_server, stories_hf_dir, tmp_path_factory):
    """A server started after `load_model` catalogued the model with no server running (so serve loads it)."""
    env = serving_env(tmp_path_factory.mktemp("no-server"))
    offline = run_manage(env, "load_model", str(stories_hf_dir), "--name", "stories")
    assert offline.returncode == 0, offline.stderr
    assert "No server is running" in offline.stdout
    assert CatalogModel.objects.get(name="stories").autoload
    return start_server()


@pytest.fixture(scope="module")
def client(server):
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    wait_for(lambda: [m.id for m in sdk.models.list().data] == ["stories"], timeout=60)
    return sdk


def test_models_list_advertises_the_served_window(client):
    [model] = client.models.list().data
    assert model.id == "stories" and model.owned_by == "pantheon"
    assert model.model_extra["context_window"] == 512  # stories260K's own window: no ctx_cap was given
    assert model.model_extra["max_concurrent"] >= 1


def test_non_streaming_completion_is_the_engines_greedy_output(client, reference):
    prompt, completion, text, finish_reason = reference
    response = client.chat.completions.create(model="stories", messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS)
    [choice] = response.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == text
    assert choice.finish_reason == finish_reason
    assert response.model == "stories" and response.id.startswith("chatcmpl-")
    assert response.usage.prompt_tokens == len(prompt)
    assert response.usage.completion_tokens == len(completion)
    assert response.usage.total_tokens == len(prompt) + len(completion)
    assert response.usage.prompt_tokens_details.cached_tokens == 0
    assert response.usage.model_extra["kv_cap"] == 512
    assert response.usage.model_extra["kv_used"] == len(prompt) + len(completion)


def test_streaming_completion_is_the_engines_greedy_output(client, reference):
    prompt, completion, text, finish_reason = reference
    stream = client.chat.completions.create(
        model="stories", messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    closing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in closing] == [finish_reason]
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == len(completion)
    assert usage.usage.prompt_tokens == len(prompt)


def test_completion_ids_are_unique(client):
    ids = {client.chat.completions.create(model="stories", messages=MESSAGES, max_tokens=1).id for _ in range(3)}
    assert len(ids) == 3


def test_sampling_fields_reach_the_engine(client, reference, stories_hf_dir):
    tokenizer = load_model(stories_hf_dir, max_concurrent=1).tokenizer
    forced = 300
    response = client.chat.completions.create(
        model="stories", messages=MESSAGES, max_tokens=3, logit_bias={str(forced): 100}, logprobs=True, top_logprobs=2
    )
    entries = response.choices[0].logprobs.content
    forced_bytes = tokenizer.token_bytes(forced)  # " ha"; the first loses the leading space, as the text does
    assert [bytes(e.bytes) for e in entries] == [forced_bytes.removeprefix(b" ")] + [forced_bytes] * 2
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)

    def sampled(seed):
        return (
            client.chat.completions.create(
                model="stories", messages=MESSAGES, max_tokens=16, temperature=1.0, seed=seed
            )
            .choices[0]
            .message.content
        )

    assert sampled(7) == sampled(7)
    assert len({sampled(seed) for seed in range(4)}) > 1

    text = reference[2]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = client.chat.completions.create(
        model="stories", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stop=[stop]
    ).choices[0]
    assert stopped.finish_reason == "stop" and stopped.message.content == text[: text.index(stop)]


def test_logprobs_tokens_spell_the_content_in_both_response_forms(client, reference):
    _, _, text, _ = reference
    fields = {"model": "stories", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True}
    reply = client.chat.completions.create(**fields, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert reply.choices[0].message.content == text == "".join(e.token for e in entries)
    assert all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)
    assert b"".join(bytes(e.bytes) for e in entries) == text.encode()  # the bytes spell it too
    streamed = []
    for chunk in client.chat.completions.create(**fields, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            tokens = "".join(e.token for e in chunk.choices[0].logprobs.content)
            assert tokens == (chunk.choices[0].delta.content or "")  # each chunk carries its own tokens
            streamed.append(tokens)
    assert "".join(streamed) == text


def test_the_protocols_io_threads_never_preempt_the_loops_they_serve(client, server):
    """Both ends of the worker protocol (the server, its worker process) run libzmq's I/O threads under SCHED_BATCH
    (io_threads.py says why)."""
    worker = next(c for c in psutil.Process(server.process.pid).children() if "worker_process" in " ".join(c.cmdline()))
    for pid in (server.process.pid, worker.pid):
        policies = io_thread_policies(pid)
        assert policies and set(policies.values()) == {os.SCHED_BATCH}, (pid, policies)


def io_thread_policies(pid: int) -> dict[str, int]:
    """Thread id -> scheduling policy of each of the process's libzmq threads (named ZMQbg/...)."""
    policies = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().startswith("ZMQbg/"):
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            policies[task.name] = int(fields[38])  # field 41 of proc_pid_stat(5), after pid and (comm)
    return policies
