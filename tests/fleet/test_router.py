"""The fleet's router in front of two real `manage.py serve` instances on loopback (docs/fleet.md): what a client
sees through it with the openai package, the router's /v1/models, the fleet token, two routers sharing one Redis,
a client that goes away, and an instance that dies."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import httpx
import openai
import pytest

from tests.fleet.fleet_processes import FLEET_TOKEN, MODEL, instance_id
from tests.inference.serving import bearer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = [{"role": "user", "content": "Once upon a time"}]
LONG = 480  # tokens of a stream a test holds open (ignore_eos): far more than it reads before it stops reading


@pytest.fixture(scope="module")
def fleet(start_fleet):
    return start_fleet(instances=2, routers=2)


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_the_openai_package_completes_through_the_router(fleet):
    client = client_of(fleet.routers[0].url)
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=8, extra_headers={"X-Request-ID": "fleet-request-1"}
    )
    assert reply.headers["x-pantheon-instance"] in {instance_id(server) for server in fleet.instances}
    assert reply.headers["x-request-id"] == "fleet-request-1"
    assert reply.parse().choices[0].message.content
    assert reply.parse().usage.completion_tokens == 8

    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"

    assert client.completions.create(model=MODEL, prompt="Once", max_tokens=4).choices[0].text
    assert len(client.embeddings.create(model=MODEL, input="Once").data[0].embedding) > 0


def test_the_router_lists_the_fleet_and_each_instance_its_own(fleet):
    row = fleet.routers[0].models()[MODEL]
    instance_rows = [httpx.get(server.url + "/v1/models").json()["data"][0] for server in fleet.instances]
    assert row["live"] == 2
    assert row["free_slots"] == sum(r["max_concurrent"] for r in instance_rows)  # nothing runs: every slot is free
    assert row["context_window"] == min(r["context_window"] for r in instance_rows)
    for instance_row in instance_rows:  # an instance's own listing keeps its shape: no fleet fields
        assert instance_row["id"] == MODEL and "live" not in instance_row and "free_slots" not in instance_row


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", f"Basic {FLEET_TOKEN}"])
def test_registration_needs_the_fleet_token(fleet, header):
    report = {"instance_id": "127.0.0.1:1:intruder", "model_id": "intruder", "endpoint": "http://127.0.0.1:1"}
    headers = {"Authorization": header} if header else {}
    for route in ("/registry/register", "/registry/heartbeat"):
        answer = httpx.post(fleet.routers[0].url + route, json=report, headers=headers)
        assert answer.status_code == 401
        assert answer.json()["error"]["type"] == "unauthorized"
    assert "intruder" not in fleet.routers[0].models()


def test_a_refused_connection_is_tried_on_another_instance(fleet):
    """An instance the registry still lists but that no longer listens (it died since its last heartbeat): the
    request goes to a live one, and the dead one leaves the listing at once. The dead one is as idle as the live
    ones and its id sorts first, so least-busy tries it first."""
    router = fleet.routers[0]
    fleet_auth = {"Authorization": f"Bearer {FLEET_TOKEN}"}
    dead = {"instance_id": "0-dead:1:stories", "model_id": MODEL, "endpoint": "http://127.0.0.1:1", "capacity": 8,
            "free_slots": 8, "context_window": 512}  # fmt: skip
    answer = httpx.post(router.url + "/registry/register", json=dead, headers=fleet_auth)
    assert answer.status_code == 200 and router.models()[MODEL]["live"] == 3
    reply = client_of(router.url).completions.with_raw_response.create(model=MODEL, prompt="Once", max_tokens=2)
    assert reply.headers["x-pantheon-instance"] in {instance_id(server) for server in fleet.instances}
    assert router.models()[MODEL]["live"] == 2


def test_an_unknown_model_is_503_in_the_envelope(fleet):
    with pytest.raises(openai.APIStatusError) as refused:
        client_of(fleet.routers[0].url).completions.create(model="nothing-serves-this", prompt="x", max_tokens=2)
    assert refused.value.status_code == 503
    assert refused.value.body["type"] == "no_live_instance"
    assert refused.value.response.headers["retry-after"]


def completion_tokens(server) -> float:
    """The instance's pantheon_completion_tokens_total for the model (its /metrics, open on loopback)."""
    line = re.compile(rf'^pantheon_completion_tokens_total{{model="{MODEL}"}} (\S+)$', re.M)
    return sum(float(v) for v in line.findall(httpx.get(server.url + "/metrics").text))


def running(server) -> int:
    """Sequences the instance is decoding (its /admin/models, with its local credential)."""
    rows = httpx.get(server.url + "/admin/models", headers=bearer(server.run_file()["admin_secret"])).json()["data"]
    return sum(row["live"]["running"] for row in rows)


def test_each_router_forwards_to_both_instances_and_a_client_leaving_aborts_upstream(fleet):
    """Both routers share the registry in Redis (the instances registered with the first only): each sends two
    streams held open at once to the two instances. Closing them closes the instances' streams, which abort the
    generations: fewer tokens are generated than asked for."""
    before = sum(completion_tokens(server) for server in fleet.instances)
    capacity = sum(r["max_concurrent"] for s in fleet.instances for r in httpx.get(s.url + "/v1/models").json()["data"])
    for router in fleet.routers:
        # Until both instances have reported themselves idle again, a report from while the last streams ran could
        # make the busier one look the idler.
        wait_for(lambda: router.models()[MODEL]["free_slots"] == capacity)  # noqa: B023
        client = client_of(router.url)
        with contextlib.ExitStack() as streams:
            chosen = set()
            for _ in range(2):
                response = streams.enter_context(
                    client.chat.completions.with_streaming_response.create(
                        model=MODEL, messages=CHAT, max_tokens=LONG, stream=True, extra_body={"ignore_eos": True}
                    )
                )
                next(iter(response.parse()))
                chosen.add(response.headers["x-pantheon-instance"])
            assert chosen == {instance_id(server) for server in fleet.instances}
    # Four streams of LONG tokens were asked for; each was read for one chunk and closed.
    wait_for(lambda: all(running(server) == 0 for server in fleet.instances))
    assert sum(completion_tokens(server) for server in fleet.instances) - before < 4 * LONG / 2


def test_killing_an_instance_mid_stream_ends_the_stream_and_the_other_serves(fleet):
    """Runs last in this module: it leaves one instance."""
    router = fleet.routers[0]
    client = client_of(router.url)
    long = {"model": MODEL, "messages": CHAT, "max_tokens": 480, "stream": True, "extra_body": {"ignore_eos": True}}
    with client.chat.completions.with_streaming_response.create(**long) as response:
        chosen = response.headers["x-pantheon-instance"]
        victim = next(server for server in fleet.instances if instance_id(server) == chosen)
        chunks = iter(response.parse())
        next(chunks)
        os.kill(victim.process.pid, signal.SIGKILL)
        with pytest.raises(openai.APIError) as ended:
            for _ in chunks:
                pass
    assert ended.value.body["type"] == "instance_failed"

    survivor = next(server for server in fleet.instances if server is not victim)
    assert fleet.wait_live(router, 1)["live"] == 1  # dropped once its heartbeats stopped for the timeout
    for _ in range(3):
        reply = client.completions.with_raw_response.create(model=MODEL, prompt="Once", max_tokens=2)
        assert reply.headers["x-pantheon-instance"] == instance_id(survivor)
