"""Replicas of one served model in one server (docs/replicas.md): a name loaded twice is two placements that clients
see as one model id and operators as two rows; concurrent requests spread over them; a session's later turns go to
the replica that holds its KV; unload by instance id leaves the other serving; a worker crash brings both back; and
the trainer's weights attach refuses a replicated model. Two replicas share the CPU worker here."""

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from inference.models import ModelInstance
from pantheon_site.tokens import do_create_token
from tests.inference.serving import wait_for
from tests.inference.session_turns import assistant_message, chat, load
from tests.weights.weights_calls import weights_call

pytestmark = pytest.mark.django_db(transaction=True)

# Four choices that only their length ends, near stories260K's 512-token window: hundreds of decode steps, so the
# requests sent at once are in flight together, and each is routed while the others run.
LONG = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 480, "ignore_eos": True, "n": 4}
CONCURRENT = 6


def load_two(api, path) -> tuple[dict, dict]:
    return load(api, path, "s"), load(api, path, "s")


def rows(api) -> list[dict]:
    return api.get("/admin/models").json()["data"]


def looked_up(api) -> dict[str, int]:
    """Prompt tokens each replica has looked up in its prefix cache since its load: one lookup per request it ran."""
    return {row["placement"]: row["live"]["prefix_cache"]["lookup_tokens"] for row in rows(api)}


def test_a_name_loaded_twice_is_one_model_id_and_two_operator_rows(api, stories_gguf_path):
    first, second = load_two(api, stories_gguf_path)
    assert (first["id"], first["placement"], second["id"], second["placement"]) == ("s", "s", "s", "s#2")
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["s"]
    listed = rows(api)
    assert [(row["id"], row["placement"], row["state"]) for row in listed] == [
        ("s", "s", "ready"),
        ("s", "s#2", "ready"),
    ]
    ids = [row["instance_id"] for row in listed]
    assert len(set(ids)) == 2
    assert sorted(ModelInstance.objects.values_list("pk", "served_name")) == sorted((i, "s") for i in ids)

    unloaded = api.post("/admin/models/unload", json={"name": "s"}).json()  # by name: every replica
    assert (unloaded["unloaded"], sorted(unloaded["instance_ids"])) == ("s", sorted(ids))
    assert rows(api) == [] and not ModelInstance.objects.exists()


def test_concurrent_requests_spread_over_both_replicas(api, server, stories_gguf_path):
    load_two(api, stories_gguf_path)
    with httpx.Client(base_url=server.url, timeout=120) as client, ThreadPoolExecutor(CONCURRENT) as pool:
        answers = list(pool.map(lambda _: client.post("/v1/chat/completions", json=LONG), range(CONCURRENT)))
    assert [a.status_code for a in answers] == [200] * CONCURRENT
    assert {a.json()["model"] for a in answers} == {"s"}  # the served name, whichever replica answered
    counts = looked_up(api)
    assert set(counts) == {"s", "s#2"} and all(counts.values()), counts


def test_a_session_stays_on_its_replica_and_unload_by_id_leaves_the_other(api, server, stories_gguf_path):
    first, second = load_two(api, stories_gguf_path)
    # Unload the first replica by its id: the second serves on, alone.
    unloaded = api.post("/admin/models/unload", json={"id": first["instance_id"]}).json()
    assert (unloaded["unloaded"], unloaded["instance_id"]) == ("s", first["instance_id"])
    assert [(row["placement"], row["instance_id"]) for row in rows(api)] == [("s#2", second["instance_id"])]
    messages = [{"role": "user", "content": "Tell me about a cat named Tom."}]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        turn = chat(client, "s", messages, session_id="tom")  # on s#2, the one replica
        # A new first replica: idle and lowest in key order, where a request without a session goes.
        assert load(api, stories_gguf_path, "s")["placement"] == "s"
        messages += [assistant_message(turn), {"role": "user", "content": "What did Tom eat?"}]
        usage = chat(client, "s", messages, session_id="tom")["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # the session's KV, on s#2
    sessions = api.get("/admin/sessions", params={"name": "s"}).json()["data"]
    assert [(s["session_id"], s["placement"]) for s in sessions] == [("tom", "s#2")]
    exported = api.post("/admin/session/export", json={"name": "s", "session_id": "tom"})
    assert exported.status_code == 200, exported.text


def test_a_worker_crash_reloads_every_replica(api, server, stories_gguf_path):
    load_two(api, stories_gguf_path)
    [pid] = server.worker_pids()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: server.worker_pids() not in ([], [pid]))
    wait_for(lambda: [(r["placement"], r["state"]) for r in rows(api)] == [("s", "ready"), ("s#2", "ready")])
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["s"]


def test_weights_attach_refuses_a_replicated_model(api, server, stories_hf_dir):
    load(api, stories_hf_dir, "s")
    load(api, stories_hf_dir, "s")
    trainer = do_create_token("trainer", "t")[1]
    refused = weights_call(server, "attach", trainer, body={"model": "s"})
    assert refused.error == (400, "NOT_ATTACHABLE", "replicated")
