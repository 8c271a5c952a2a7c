"""A load with the flex attention backend, through the engine client and its worker loop: it says which backend it
runs, writes the text a gather load of the same model writes (prompts in flight together, so a step holds prefill
chunks and decode rows of several sequences; and again, from the blocks the first round left cached), and a split
load cannot take it."""

import asyncio

import pytest
import pytest_asyncio

from inference.runtime.generation import EngineError
from inference.runtime.in_process_client import InProcessEngineClient
from tests.inference.engine_calls import generate, load, seen_as

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPTS = ["Once upon a time", "Tom and his dog went to the park. They", "Once upon a time, there was a"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client():
    client = InProcessEngineClient()
    await client.start()
    yield client
    await client.close()


async def texts(client, model: str) -> tuple[list[str], int]:
    """The greedy completions of PROMPTS, all in flight at once, and the prompt tokens they found cached."""

    async def one(prompt: str) -> tuple[str, int]:
        generation = await generate(
            client, model, messages=[{"role": "user", "content": prompt}], sampling={"temperature": 0}, max_tokens=40
        )
        events = [event async for event in generation]
        return "".join(event.text for event in events[:-1]), events[-1].cached_tokens

    answers = await asyncio.gather(*(one(prompt) for prompt in PROMPTS))
    return [text for text, _ in answers], sum(cached for _, cached in answers)


async def test_a_flex_load_writes_the_text_of_a_gather_load(client, stories_hf_dir):
    gather = await load(client, "gather", str(stories_hf_dir), ctx_cap=256, max_concurrent=3, prefill_chunk=8)
    flex = await load(
        client, "flex", str(stories_hf_dir), ctx_cap=256, max_concurrent=3, prefill_chunk=8, attention="flex"
    )
    assert (gather.attention, flex.attention) == ("gather", "flex")
    expected, _ = await texts(client, "gather")
    assert all(expected)
    assert (await texts(client, "flex"))[0] == expected
    again, cached = await texts(client, "flex")
    assert again == expected and cached > 0


async def test_a_split_load_cannot_take_flex(client, stories_hf_dir):
    with pytest.raises(EngineError) as refused:
        await load(client, "split", str(stories_hf_dir), tensor_parallel=2, attention="flex")
    assert seen_as(refused.value) == ("load_failed", 400)
    assert "attention flex does not split across ranks" in refused.value.message
