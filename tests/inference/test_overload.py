"""Overload, bounded (bench/overload.py is the full run): 4x a small capacity of clients at once, each request ends
200, or 429/503 with Retry-After, none hangs or is lost, and the server serves a normal request afterwards."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.overload import chat_body, drive
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)

SLOTS, QUEUE = 2, 2
CLIENTS = 4 * (SLOTS + QUEUE)
REQUESTS_EACH = 3


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(PANTHEON_BATCH_SLOTS=str(SLOTS), PANTHEON_QUEUE_DEPTH=str(QUEUE))


def test_four_times_the_capacity_is_served_or_refused_with_retry_after_and_nothing_hangs(
    server, stories_hf_dir, operator_token
):
    loaded = httpx.post(server.url + "/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"},
                        headers=bearer(operator_token), timeout=120)  # fmt: skip
    assert loaded.status_code == 200, loaded.text
    # The timeout only tells a hung request from a slow one: far longer than a queue wait and a 32-token answer.
    outcomes = asyncio.run(drive(server.url, CLIENTS, chat_body(32), requests=REQUESTS_EACH, timeout=300))
    assert len(outcomes) == CLIENTS * REQUESTS_EACH  # every client's every request came back
    broken = [o for o in outcomes if not o.kept_the_promise]
    assert not broken, broken[:5]
    statuses = {o.status for o in outcomes}
    assert 200 in statuses and 429 in statuses  # served what fits, refused the rest
    after = httpx.post(server.url + "/v1/chat/completions", json=chat_body(8), timeout=120)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 8
