"""The routing policy as a unit (fleet/routing.py): session affinity on a real Redis (its session map and exports,
shared by two policies as by two routers), re-homing, and cache-aware choice against load. The instances are
records, as the registry would hand them; the end-to-end tests with real serve processes are in test_fleet_affinity.py.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import redis.asyncio

from fleet.contract import InstanceRecord, InstanceReport, RouteRequest
from fleet.prefix_hashes import CHUNK_CHARS, ServedPrefixes, chunk_hashes, prefix_text
from fleet.routing import RoutingConfig, RoutingPolicy
from fleet.session_store import SessionStore

REDIS_URL = os.environ.get("PANTHEON_TEST_FLEET_REDIS_URL", "redis://127.0.0.1:6379/11")
SYSTEM = "You are a careful assistant for a shipping company. " * 20  # ~1000 characters, shared by conversations


def record(name: str, in_flight: int = 0, epoch: str = "e1", cached: list[str] | None = None) -> InstanceRecord:
    report = InstanceReport(
        instance_id=f"127.0.0.1:{name}:m", model_id="m", endpoint=f"http://127.0.0.1:{name}", in_flight=in_flight,
        epoch=epoch, cached_prefixes=cached or [],
    )  # fmt: skip
    return InstanceRecord(report=report, last_seen=time.time())


def chat(*turns: str, session: str | None = None) -> RouteRequest:
    messages = [{"role": "system", "content": SYSTEM}] + [{"role": "user", "content": t} for t in turns]
    return RouteRequest(model_id="m", session_key=session, prefix_text=prefix_text({"messages": messages}))


async def _clear(client) -> None:
    """Only the fleet's keys: the database may be shared with other tests' registries."""
    keys = [key async for key in client.scan_iter(match="pantheon:fleet:*")]
    if keys:
        await client.delete(*keys)


@pytest.fixture
async def redis_url():
    client = redis.asyncio.from_url(REDIS_URL)
    await _clear(client)
    yield REDIS_URL
    await _clear(client)
    await client.aclose()


def policy(url: str = "", **config) -> RoutingPolicy:
    return RoutingPolicy(RoutingConfig(redis_url=url, **config))


@pytest.mark.parametrize("shared", ["redis", "memory"])
async def test_a_session_stays_where_its_kv_lives_even_when_that_instance_is_busier(redis_url, shared):
    router = policy(redis_url if shared == "redis" else "")
    a, b = record("8001"), record("8002", in_flight=1)
    first = await router.choose(chat("hello", session="s1"), [a, b])
    assert first.instance.report.instance_id == a.report.instance_id
    busy_a = record("8001", in_flight=5)
    later = await router.choose(chat("hello", "more", session="s1"), [busy_a, b])
    assert (later.instance.report.instance_id, later.why) == (a.report.instance_id, "session")
    fresh = RouteRequest(model_id="m", session_key="s2", prefix_text="another prompt")
    other = await router.choose(fresh, [busy_a, b])  # a new session without a cached prefix goes to the least busy
    assert other.instance.report.instance_id == b.report.instance_id
    await router.close()


async def test_two_routers_on_one_redis_send_a_session_to_the_same_instance(redis_url):
    one, two = policy(redis_url), policy(redis_url)
    # Each router sees the load differently, so each alone would place the session elsewhere; the first claim wins.
    placed = await one.choose(chat("hello", session="shared"), [record("8001"), record("8002", in_flight=3)])
    followed = await two.choose(chat("hello", session="shared"), [record("8001", in_flight=3), record("8002")])
    assert placed.instance.report.instance_id == followed.instance.report.instance_id == "127.0.0.1:8001:m"
    assert followed.why == "session"
    # At once: both look the session up before either claims it; the first claim still wins for both.
    for n in range(10):
        request = RouteRequest(model_id="m", session_key=f"race{n}")
        choices = await asyncio.gather(
            one.choose(request, [record("8001"), record("8002", in_flight=3)]),
            two.choose(request, [record("8001", in_flight=3), record("8002")]),
        )
        assert choices[0].instance.report.instance_id == choices[1].instance.report.instance_id
    await one.close()
    await two.close()


async def test_a_session_whose_instance_is_gone_rehomes_and_is_restored_from_its_last_export(redis_url):
    router, other_router = policy(redis_url), policy(redis_url)
    a, b, c = record("8001"), record("8002", in_flight=2), record("8003", in_flight=1)
    for session in ("exported", "plain"):
        assert (await router.choose(chat("x", session=session), [a, b, c])).instance is a
    assert await other_router.exported("m", "exported", b"a session file")  # the export passed through another router
    await router.instance_gone(a.report.instance_id)
    moved = await router.choose(chat("x", "y", session="exported"), [b, c])
    assert (moved.instance.report.instance_id, moved.why, moved.restore_file) == (c.report.instance_id, "rehome",
                                                                                    b"a session file")  # fmt: skip
    plain = await router.choose(chat("x", "y", session="plain"), [b, c])
    assert (plain.why, plain.restore_file) == ("rehome", None)  # nothing to restore: the instance prefills it again
    after = await other_router.choose(chat("x", "y", "z", session="exported"), [b, c])
    assert (after.instance.report.instance_id, after.why) == (c.report.instance_id, "session")
    await router.close()
    await other_router.close()


async def test_two_routers_rehoming_a_session_at_once_agree_and_restore_it_once(redis_url):
    one, two = policy(redis_url), policy(redis_url)
    a = record("8001")
    for n in range(10):
        await one.choose(RouteRequest(model_id="m", session_key=f"s{n}"), [a])
        await one.exported("m", f"s{n}", b"file")
        request = RouteRequest(model_id="m", session_key=f"s{n}")  # a is gone; each router sees b and c differently
        choices = await asyncio.gather(
            one.choose(request, [record("8002"), record("8003", in_flight=3)]),
            two.choose(request, [record("8002", in_flight=3), record("8003")]),
        )
        assert choices[0].instance.report.instance_id == choices[1].instance.report.instance_id
        assert [c.restore_file for c in choices].count(b"file") == 1
    await one.close()
    await two.close()


async def test_an_instance_restarted_under_the_same_id_no_longer_holds_its_sessions(redis_url):
    router = policy(redis_url)
    a, b = record("8001"), record("8002", in_flight=1)
    await router.choose(chat("x", session="s"), [a, b])
    restarted = record("8001", in_flight=3, epoch="e2")
    choice = await router.choose(chat("x", "y", session="s"), [restarted, b])
    assert (choice.instance.report.instance_id, choice.why) == (b.report.instance_id, "rehome")
    await router.close()


async def test_an_export_over_the_cap_is_not_kept_and_drops_the_older_one(redis_url):
    store = SessionStore.from_url(redis_url, ttl_s=60, export_max_bytes=10)
    assert await store.keep_export("m", "s", b"small")
    assert not await store.keep_export("m", "s", b"far too large a file")
    assert await store.export("m", "s") is None
    await store.close()


async def test_cache_aware_sends_a_shared_prefix_to_its_instance_unless_load_is_imbalanced():
    router = policy(balance_abs=4, balance_ratio=1.5)
    a, b = record("8001"), record("8002")
    assert (await router.choose(chat("first conversation"), [a, b])).instance is a
    # The same system prompt, a different question: most of the prompt is cached at a, slightly busier than b.
    a1 = record("8001", in_flight=2)
    choice = await router.choose(chat("second conversation"), [a1, b])
    assert (choice.instance.report.instance_id, choice.why) == (a.report.instance_id, "prefix")
    # A prompt sharing too little falls back to the least busy.
    short = RouteRequest(model_id="m", prefix_text=prefix_text({"messages": [{"role": "user", "content": "x" * 900}]}))
    assert (await router.choose(short, [a1, b])).why == "least_busy"
    # Imbalanced: 6 over 1 is more than 4 over and 1.5 times; the prefix no longer wins.
    choice = await router.choose(chat("third conversation"), [record("8001", in_flight=6), record("8002", 1)])
    assert (choice.instance.report.instance_id, choice.why) == (b.report.instance_id, "least_busy")
    await router.close()


async def test_least_busy_policy_ignores_prefixes():
    router = policy(policy="least_busy")
    await router.choose(chat("first"), [record("8001"), record("8002")])
    choice = await router.choose(chat("second"), [record("8001", in_flight=1), record("8002")])
    assert (choice.instance.report.instance_id, choice.why) == ("127.0.0.1:8002:m", "least_busy")
    await router.close()


async def test_the_picture_of_an_instance_goes_with_a_new_epoch_or_when_it_goes_away():
    router = policy()
    a, b = record("8001"), record("8002")
    await router.choose(chat("first"), [a, b])
    assert router.prefixes.match(a, chunk_hashes(chat("first").prefix_text)) > 0
    assert router.prefixes.match(record("8001", epoch="e2"), chunk_hashes(chat("first").prefix_text)) == 0
    await router.choose(chat("first"), [a, b])
    await router.instance_gone(a.report.instance_id)
    assert router.prefixes.size(a.report.instance_id) == 0
    await router.close()


async def test_an_instance_report_of_what_it_served_steers_a_router_that_never_sent_it_anything():
    served = ServedPrefixes(capacity=1000)
    served.record(chunk_hashes(chat("from another router").prefix_text))
    router = policy()
    b = record("8002", in_flight=1, cached=served.report("e1"))
    choice = await router.choose(chat("a question"), [record("8001"), b])
    assert (choice.instance.report.instance_id, choice.why) == (b.report.instance_id, "prefix")
    await router.close()


def test_served_prefixes_are_bounded_newest_first_and_emptied_with_a_new_epoch():
    served = ServedPrefixes(capacity=8)
    old, new = chunk_hashes("o" * CHUNK_CHARS * 6), chunk_hashes("n" * CHUNK_CHARS * 6)
    served.report("e1")
    served.record(old)
    served.record(new)
    reported = served.report("e1")
    assert reported[:6] == new and reported[6:] == old[:2]  # the oldest prompt's longest prefixes went first
    assert served.report("e2") == []


def test_chunk_hashes_name_whole_prefixes():
    one, two = chunk_hashes("a" * 200 + "b" * 100), chunk_hashes("a" * 200 + "c" * 100)
    assert len(one) == 300 // CHUNK_CHARS
    shared = 200 // CHUNK_CHARS
    assert one[:shared] == two[:shared] and one[shared] != two[shared]
