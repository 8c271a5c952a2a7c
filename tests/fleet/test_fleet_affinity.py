"""Session affinity end to end (docs/fleet.md, "Routing"): two routers on one Redis and two real `manage.py serve`
instances on loopback. Sessions spread over both instances and each later turn lands where its KV lives (warm
cached_tokens), whichever router it goes through; killing an instance ends its streams with an error event, the other
keeps serving, and its sessions re-home there: restored from the export a router kept (cached_tokens > 0) or
prefilled again (cached_tokens near 0)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import struct

import httpx
import pytest
import redis

from fleet.prefix_hashes import chunk_hashes, prefix_text
from fleet.registry import INSTANCE_KEY
from tests.fleet.fleet_processes import MODEL, instance_id
from tests.inference.conftest import operator_token  # noqa: F401
from tests.inference.serving import bearer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SESSIONS = 16
NAMES = ["Lily", "Ben", "Tom", "Sue", "Max", "Anna", "Sam", "Mia", "Tim", "Zoe", "Bob", "Kim", "Jack", "Amy", "Leo",
         "Eve"]  # fmt: skip
LONG = 400  # tokens of a stream held open across the kill (ignore_eos): far more than is read before it


@pytest.fixture(scope="module")
def fleet(start_fleet):
    # Room on one instance for every session of the module: the survivor takes the victim's.
    return start_fleet(instances=2, routers=2, load_options={"max_sessions": 2 * SESSIONS + 8})


class Conversation:
    """One session's messages; `turn` sends the next user message (or resends the last one) through a router."""

    def __init__(self, n: int, test: str = "rehome"):
        self.session = f"{test}-{n}"
        self.messages = [{"role": "user", "content": f"{NAMES[n]} went to the park with a red ball"}]

    def turn(self, router_url: str, **extra) -> tuple[str, dict]:
        body = {"model": MODEL, "messages": self.messages, "max_tokens": 8, "temperature": 0,
                "session_id": self.session, **extra}  # fmt: skip
        answer = httpx.post(router_url + "/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        reply = answer.json()
        self.messages = self.messages + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]}]
        self.why = answer.headers["x-pantheon-route"]  # why the router chose the instance
        return answer.headers["x-pantheon-instance"], reply["usage"]

    def ask(self, text: str) -> None:
        self.messages = self.messages + [{"role": "user", "content": text}]


def at_once(calls):
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_two_routers_on_one_redis_send_a_session_to_the_same_instance(fleet):
    one, two = (router.url for router in fleet.routers)
    conversations = [Conversation(n, "two-routers") for n in range(4)]
    first = at_once([lambda c=c: c.turn(one) for c in conversations])
    for conversation in conversations:
        conversation.ask("Then it began to rain")
    second = at_once([lambda c=c: c.turn(two) for c in conversations])  # the other router: the same instances
    assert [where for where, _ in second] == [where for where, _ in first]
    assert all(cached(usage) > 0 for _, usage in second)


def reported_prefixes(fleet, server) -> list[str]:
    """The chunk hashes the instance reported in its last heartbeat, as the registry keeps them in Redis."""
    store = redis.Redis.from_url(fleet.redis_url)
    try:
        record = store.get(INSTANCE_KEY + instance_id(server))
    finally:
        store.close()
    return json.loads(record)["report"]["cached_prefixes"] if record else []


def test_an_instance_reports_the_prompts_it_served_and_a_similar_prompt_follows_them(fleet):
    """Without a session key: a long prompt served by one instance is in that instance's next heartbeat, and a prompt
    sharing most of it goes to the same instance (X-Pantheon-Route: prefix) through the other router."""
    story = "Once upon a time there was a little dog who liked to run in the park with his friends. " * 3
    body = {"model": MODEL, "messages": [{"role": "user", "content": story}], "max_tokens": 2}
    first = httpx.post(fleet.routers[0].url + "/v1/chat/completions", json=body, timeout=60)
    assert first.status_code == 200, first.text
    server = next(s for s in fleet.instances if instance_id(s) == first.headers["x-pantheon-instance"])
    hashes = chunk_hashes(prefix_text(body))
    wait_for(lambda: set(hashes) <= set(reported_prefixes(fleet, server)))
    body["messages"] = [{"role": "user", "content": story + "The end."}]
    second = httpx.post(fleet.routers[1].url + "/v1/chat/completions", json=body, timeout=60)
    assert (second.headers["x-pantheon-instance"], second.headers["x-pantheon-route"]) == (instance_id(server),
                                                                                           "prefix")  # fmt: skip


def export(router_url: str, session: str, token: str) -> bytes:
    """The session's file, exported through the router (which keeps it as the session's restore point)."""
    headers = {**bearer(token), "Accept": "application/octet-stream"}
    answer = httpx.post(router_url + "/admin/session/export", json={"name": MODEL, "session_id": session},
                        headers=headers, timeout=60)  # fmt: skip
    assert answer.status_code == 200, answer.text
    return answer.content


def held_stream(router_url: str, conversation: Conversation, stack) -> tuple[str, object]:
    """A streaming turn held open after its first event: (the instance, the rest of its lines)."""
    body = {"model": MODEL, "messages": conversation.messages, "max_tokens": LONG, "stream": True,
            "ignore_eos": True, "session_id": conversation.session}  # fmt: skip
    response = stack.enter_context(httpx.stream("POST", router_url + "/v1/chat/completions", json=body, timeout=60))
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith("data: "))
    return response.headers["x-pantheon-instance"], lines


def stream_end(lines) -> str:
    """How a held stream ended: "done", or "error" (its terminal event), read to its end."""
    last = [line for line in lines if line.startswith("data: ")][-1]
    return "done" if last == "data: [DONE]" else ("error" if "error" in json.loads(last[6:]) else "cut")


def test_sessions_stick_and_rehome_with_their_export_when_their_instance_dies(fleet, operator_token):  # noqa: F811
    """Runs last in this module: it leaves one instance."""
    router, other_router = fleet.routers
    conversations = [Conversation(n) for n in range(SESSIONS)]
    homes = [where for where, _ in at_once([lambda c=c: c.turn(router.url) for c in conversations])]
    assert set(homes) == {instance_id(server) for server in fleet.instances}  # spread over both
    for conversation in conversations:
        conversation.ask("Then a big dog came to play")
    second = at_once([lambda c=c: c.turn(router.url) for c in conversations])
    assert [where for where, _ in second] == homes  # each later turn where its KV lives, and warm
    assert all(cached(usage) > 0 for _, usage in second)
    assert {c.why for c in conversations} == {"session"}

    victim = next(server for server in fleet.instances if instance_id(server) == homes[0])
    survivor = next(server for server in fleet.instances if server is not victim)
    doomed = [c for c, home in zip(conversations, homes, strict=True) if home == instance_id(victim)]
    exported = {c.session: export(other_router.url, c.session, operator_token) for c in doomed[: len(doomed) // 2]}
    assert exported, "the victim holds at least two sessions"

    for conversation in conversations:
        conversation.ask("They ran home")
    with contextlib.ExitStack() as stack:
        held = [
            held_stream(router.url, c, stack) for c in (doomed[0], next(c for c in conversations if c not in doomed))
        ]
        os.kill(victim.process.pid, signal.SIGKILL)
        ends = {where: stream_end(lines) for where, lines in held}
    assert ends == {instance_id(victim): "error", instance_id(survivor): "done"}
    fleet.wait_live(router, 1)

    # The victim's sessions take the turn again on the survivor: restored from their export, or prefilled again.
    retried = at_once([lambda c=c: c.turn(router.url) for c in doomed])
    for conversation, (where, usage) in zip(doomed, retried, strict=True):
        assert (where, conversation.why) == (instance_id(survivor), "rehome")
        if conversation.session in exported:
            (covered,) = struct.unpack_from("<I", exported[conversation.session])  # the file's token count
            assert cached(usage) >= covered - 1, usage
        else:
            assert cached(usage) < usage["prompt_tokens"] // 4, usage
    for conversation in doomed:  # and stay there, warm, through either router
        conversation.ask("The end")
    for where, usage in at_once([lambda c=c: c.turn(other_router.url) for c in doomed]):
        assert where == instance_id(survivor) and cached(usage) > 0
