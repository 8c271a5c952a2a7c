"""The prefix cache's memory budget, against a running server with its default settings (stories260K on the CPU
worker): a prompt's prefix stays cached after more distinct prompts than the sequences' own windows hold, and
/admin/models reports the cache's size and its hits."""

import random

import httpx
import pytest

from pantheon_site.tokens import do_create_token
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)

SLOTS, WINDOW, BLOCK = 2, 128, 16  # the pool's windows hold 2 x 128 = 256 positions
PROMPT_TOKENS = 100
OTHER_PROMPTS = 6  # 600 positions of other prompts after the first: more than the windows hold twice over


@pytest.fixture(scope="module")
def server(start_server, stories_hf_dir):
    server = start_server()
    token = do_create_token("operator", "prefix-budget")[1]
    with httpx.Client(base_url=server.url, timeout=120, headers=bearer(token)) as api:
        body = {"path": str(stories_hf_dir), "name": "stories", "max_concurrent": SLOTS, "ctx_cap": WINDOW}
        response = api.post("/admin/models/load", json=body)
        assert response.status_code == 200, response.text
    return server


def distinct_prompts(count: int) -> list[list[int]]:
    """Prompts of random token ids whose first tokens all differ, so no two share a block."""
    rng = random.Random(35)
    firsts = rng.sample(range(3, 512), count)
    return [[first] + [rng.randrange(3, 512) for _ in range(PROMPT_TOKENS - 1)] for first in firsts]


def cached_tokens(api, prompt: list[int]) -> int:
    body = {"model": "stories", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = api.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def stories_row(api) -> dict:
    return next(row for row in api.get("/admin/models").json()["data"] if row["id"] == "stories")


def test_a_prefix_outlives_more_prompts_than_the_windows_hold_and_the_hits_are_reported(api):
    first, *others = distinct_prompts(1 + OTHER_PROMPTS)
    assert cached_tokens(api, first) == 0
    for prompt in others:
        assert cached_tokens(api, prompt) == 0
    # every full block of the first prompt is still cached (a prompt leaves its last token to be computed)
    reused = cached_tokens(api, first)
    assert reused == (PROMPT_TOKENS - 1) // BLOCK * BLOCK

    row = stories_row(api)
    cache, live = row["prefix_cache"], row["live"]
    hits = live["prefix_cache"]
    window_blocks = SLOTS * WINDOW // BLOCK
    cache_blocks = cache["bytes"] // (row["kv_cache"]["bytes"] // (window_blocks + 1))  # kv_cache: + a scratch block
    assert cache_blocks * BLOCK >= (1 + OTHER_PROMPTS) * PROMPT_TOKENS  # the automatic budget holds every prompt sent
    assert live["blocks_total"] == window_blocks + cache_blocks
    assert row["vram_bytes"] == row["weights_in_memory"]["bytes"] + row["kv_cache"]["bytes"] + cache["bytes"]
    assert hits["lookup_tokens"] == (2 + OTHER_PROMPTS) * PROMPT_TOKENS
    assert hits["hit_tokens"] == reused
    assert hits["hit_rate"] == round(reused / hits["lookup_tokens"], 4)
