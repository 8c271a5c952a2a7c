"""The load option host_cache_mb in a real `serve` (stories260K on the CPU worker, no prefix cache beyond the one
window): a prompt pushed out of the KV pool by another comes back from the host tier as cached tokens, and
/admin/models counts the blocks moved and the bytes held; a split load asking for a host tier is refused with the
reason."""

import random

import pytest

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW, BLOCK = 128, 16
rng = random.Random(41)
FIRST = [1] + [rng.randrange(3, 512) for _ in range(99)]  # 6 full blocks
OTHER = [2] + [rng.randrange(3, 512) for _ in range(119)]  # 8 blocks with its answer: the whole pool


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(PANTHEON_PREFIX_CACHE_BYTES="0")


def cached_tokens(api, prompt: list[int]) -> int:
    body = {"model": "tiered", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = api.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_prompt_evicted_from_the_pool_is_served_from_the_host_tier_and_counted(api, stories_hf_dir):
    body = {"path": str(stories_hf_dir), "name": "tiered", "max_concurrent": 1, "ctx_cap": WINDOW, "host_cache_mb": 1}
    response = api.post("/admin/models/load", json=body)
    assert response.status_code == 200, response.text
    assert cached_tokens(api, FIRST) == 0
    assert cached_tokens(api, OTHER) == 0  # takes every block of the pool: the first prompt's go to the host tier
    assert cached_tokens(api, FIRST) == 6 * BLOCK

    row = next(row for row in api.get("/admin/models").json()["data"] if row["id"] == "tiered")
    hits = row["live"]["prefix_cache"]
    assert hits["host_restored_blocks"] == 6
    assert hits["host_offloaded_blocks"] >= 6
    assert 0 < hits["host_bytes"] <= 2**20
    assert hits["hit_tokens"] == 6 * BLOCK


def test_a_split_load_with_a_host_tier_is_refused_with_the_reason(api, stories_hf_dir):
    body = {"path": str(stories_hf_dir), "name": "split", "tensor_parallel": 2, "host_cache_mb": 1}
    response = api.post("/admin/models/load", json=body)
    assert response.status_code == 400, response.text
    assert "host_cache_mb needs tensor_parallel 1" in response.json()["error"]["message"]
