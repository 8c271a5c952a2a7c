"""The weights API beside other served models, as `./scripts/serve` runs it (docs/weights.md, "Which model a call is
for"): with one attachable model beside `demo` it is the default; with two, every call names its model, status lists
each, and docs/weights.md's example runs as written. A restart serves the checkpoint the model served, and a save
after it continues the checkpoint's step numbers. Hostile field types are 400 in the weights envelope."""

from __future__ import annotations

import os
import re
import signal

import httpx
import pytest
import torch

from inference.models import CatalogModel
from pantheon_trainer.client import WeightsClient
from tests.inference.serving import REPO_ROOT, bearer, operator_client, wait_for
from tests.inference.session_turns import load
from tests.weights.weights_calls import Holder, greedy, load_attachable, new_token, status, text, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

# long enough that nothing expires between two calls of a test
TIMERS = {"WEIGHTS_COMMIT_WATCHDOG_MS": "30000", "WEIGHTS_HOLD_TIMEOUT_S": "30"}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    return start_server(PANTHEON_CHECKPOINT_DIR=str(tmp_path_factory.mktemp("checkpoints")), **TIMERS)


def model_status(server, model: str) -> dict:
    return weights_call(server, f"status?model={model}", method="GET").data


def docs_example() -> str:
    """The trainer of docs/weights.md's example ("In one example"), exactly as the page shows it."""
    page = (REPO_ROOT / "docs" / "weights.md").read_text()
    return re.search(r"```python\n(from pantheon_trainer\.client import WeightsClient\n.*?)```", page, re.S).group(1)


def test_one_attachable_model_beside_demo_is_the_default(server, api, demo_dir, stories_hf_dir):
    load(api, demo_dir, "demo")  # before any trainer token: not attachable, as ./scripts/serve's first start
    secret = load_attachable(api, stories_hf_dir)
    overview = status(server)
    assert overview["model"] == "stories" and overview["served_name"] == "stories"
    listed = {m["model"]: m for m in overview["models"]}
    assert listed.keys() == {"demo", "stories"}
    assert listed["demo"]["not_attachable_reason"] == "allocator" and listed["stories"]["attachable"] is True

    with WeightsClient(server.url, secret) as client:  # names no model: the default
        assert client.attached["model"]["name"] == "stories"
        with client.write() as tensors:
            tensors["model.norm.weight"].mul_(1.0)
        assert status(server)["unsaved_commits"] == 1  # the default's own counters, not nulls
        assert client.lineage()[0]["name"] == "stories"
    assert model_status(server, "demo")["commits"] == 0  # named: that model's status
    answer = weights_call(server, "status?model=nothing", method="GET")
    assert answer.error == (400, "MODEL_NOT_LOADED", None) and answer.body["error"]["details"]["served"] == [
        "demo",
        "stories",
    ]


def test_with_two_attachable_models_each_call_names_one_and_the_docs_example_runs(
    server, api, demo_dir, stories_hf_dir
):
    secret = new_token("trainer", "forge")  # before both loads, as after a restart of ./scripts/serve
    load(api, demo_dir, "demo")
    load(api, stories_hf_dir, "stories")
    assert weights_call(server, "attach", secret).error == (400, "MODEL_NOT_LOADED", None)
    assert weights_call(server, "lineage", method="GET").error == (400, "MODEL_NOT_LOADED", None)
    overview = status(server)
    assert overview["model"] is None and overview["resident_model"] is None
    assert {(m["model"], m["attachable"], m["unsaved_commits"]) for m in overview["models"]} == {
        ("demo", True, 0),
        ("stories", True, 0),
    }

    updates = []

    def compute_update(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        updates.append(weights["model.norm.weight"].sum().item())
        return {"model.norm.weight": torch.full_like(weights["model.norm.weight"], 1e-3)}

    trainer = docs_example().replace("http://127.0.0.1:8000", server.url)
    exec(trainer, {"SECRET": secret, "compute_update": compute_update})
    assert len(updates) == 100 and updates[-1] > updates[0]  # each step saw the previous one's write

    stories = model_status(server, "stories")
    assert stories["served_name"] == "stories:forge-1:step-100" and stories["attached"] is False
    assert (stories["commits"], stories["unsaved_commits"], stories["steps_since_load"]) == (0, 0, 100)
    assert model_status(server, "demo")["steps_since_load"] == 0  # the other model was not touched
    chain = weights_call(server, "lineage?model=stories", method="GET").data["chain"]
    assert [(c["kind"], c["name"]) for c in chain[1:]] == [
        ("checkpoint", "stories:forge-1:step-100"),
        ("model", "stories"),
    ]
    with WeightsClient(server.url, secret, model="stories") as client:
        assert client.load("stories:forge-1:step-100")["served_name"] == "stories:forge-1:step-100"
        assert client.status()["model"] == "stories"
    assert greedy(server.url).headers["X-miLLM-Model"] == '"stories:forge-1:step-100";origin=checkpoint;commits=0'


def test_a_restart_serves_the_checkpoint_the_model_served_and_a_save_continues_its_steps(
    start_server, operator_token, stories_hf_dir, tmp_path_factory
):
    env = {"PANTHEON_CHECKPOINT_DIR": str(tmp_path_factory.mktemp("restart-checkpoints")), **TIMERS}
    secret = new_token("trainer", "trainer")
    first = start_server(**env)
    # Not operator_client: it unloads on leaving, and an unloaded model is not brought back at start.
    with httpx.Client(base_url=first.url, timeout=60, headers=bearer(operator_token)) as api:
        load(api, stories_hf_dir, "stories")
        base = text(greedy(first.url))
        with WeightsClient(first.url, secret, model="stories") as client:
            with client.write() as tensors:
                tensors["model.norm.weight"].mul_(-1.0)  # negated logits: another greedy text
            saved = client.save("restart")
        trained = text(greedy(first.url))
        assert trained != base and saved["name"] == "stories:restart:step-1"
        # the base weights by POST /api/weights/load, then the checkpoint: the last load is what a restart serves
        row = CatalogModel.objects.get(name="stories")
        assert weights_call(first, "load", secret, body={"model": "stories", "model_id": row.pk}).data
        assert text(greedy(first.url)) == base
        assert weights_call(first, "load", secret, body={"model": "stories", "checkpoint": saved["name"]}).data
    assert first.stop() == 0

    second = start_server(**env)  # a new platform on the same database: the catalogue loads "stories" again
    with httpx.Client(base_url=second.url, timeout=60, headers=bearer(operator_token)) as api:
        wait_for(lambda: [m["id"] for m in api.get("/v1/models").json()["data"]] == ["stories"], timeout=60)
        answer = greedy(second.url)
        assert text(answer) == trained
        assert answer.headers["X-miLLM-Model"] == '"stories:restart:step-1";origin=checkpoint;commits=0'
        (row,) = api.get("/admin/models").json()["data"]
        assert row["path"] == saved["path"]
        assert row["served_weights"] == {
            "name": "stories:restart:step-1",
            "origin": "checkpoint",
            "commits": 0,
            "unsaved_commits": 0,
        }
        with WeightsClient(second.url, secret, model="stories") as client:
            with client.write() as tensors:
                tensors["model.norm.weight"].mul_(-1.0)  # back to the base model's greedy text
            again = client.save("restart")  # the default step continues the checkpoint's: 2, not 1 (409)
        assert (again["name"], again["parent"]) == ("stories:restart:step-2", "stories:restart:step-1")
    assert second.stop() == 0

    third = start_server(**env)  # and a save is what the next start serves
    with operator_client(third, operator_token) as api:
        wait_for(lambda: [m["id"] for m in api.get("/v1/models").json()["data"]] == ["stories"], timeout=60)
        answer = greedy(third.url)
        assert answer.headers["X-miLLM-Model"] == '"stories:restart:step-2";origin=checkpoint;commits=0'
        assert text(answer) == base


def test_a_worker_restarted_after_a_crash_serves_the_checkpoint_again(server, api, stories_hf_dir):
    secret = load_attachable(api, stories_hf_dir)
    with WeightsClient(server.url, secret, model="stories") as client:
        with client.write() as tensors:
            tensors["model.norm.weight"].mul_(-1.0)
        saved = client.save("crash")
    trained = text(greedy(server.url))
    (pid,) = server.worker_pids()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: [p for p in server.worker_pids() if p != pid], timeout=30)
    wait_for(lambda: weights_call(server, "status?model=stories", method="GET").status == 200, timeout=60)
    answer = greedy(server.url)
    assert answer.headers["X-miLLM-Model"] == f'"{saved["name"]}";origin=checkpoint;commits=0'
    assert text(answer) == trained


HOSTILE_NAMES = [["stories"], {"name": "stories"}, 7, True, "x" * 5000]
HOLDER_ROUTES = ["detach", "heartbeat", "quiesce", "resume", "commit-begin", "commit-end", "save"]
HOSTILE_FIELDS = [
    ("save", "step", [-1, 2**31, 10**30, "1", 1.5, True, [1], {"n": 1}]),
    ("save", "run_id", [[], {}, 5, "", "../up", "a" * 101]),
    ("load", "checkpoint", [[], {}, True, 1.5, 10**30, "9" * 500, "a" * 300, "/tmp/" + "a" * 300 + "/b", "x\0y"]),
    ("load", "model_id", [[], {}, "1", True, 1.5, -5, 10**30]),
]


def test_hostile_field_types_are_refused_in_the_weights_envelope_and_change_nothing(server, api, stories_hf_dir):
    holder = Holder(server, load_attachable(api, stories_hf_dir))
    # nothing attached yet: an attach gets as far as choosing its model
    refusals = [weights_call(server, "attach", holder.token, body={"model": value}) for value in HOSTILE_NAMES]
    holder.attach()
    operator = new_token("operator", "ops-hostile")
    before = status(server)
    for value in HOSTILE_NAMES:
        refusals.append(weights_call(server, "load", holder.token, body={"model": value, "checkpoint": 1}))
        refusals.append(weights_call(server, "clear-stale", operator, body={"model": value}))
        refusals += [holder.call(route, {"model": value}) for route in HOLDER_ROUTES]
    for route in ("status", "lineage"):
        refusals.append(weights_call(server, f"{route}?model={'x' * 5000}", method="GET"))
    assert {r.error for r in refusals} == {(400, "INVALID_REQUEST", None)}
    for route, field, values in HOSTILE_FIELDS:
        for value in values:
            answer = holder.call(route, {field: value})
            assert 400 <= answer.status < 500 and answer.body["success"] is False, (route, field, value, answer.body)
    after = status(server)
    assert (after["attached"], after["weights_state"], after["barrier"], after["served_name"]) == (
        True,
        "clean",
        "serving",
        "stories",
    )
    assert after["steps_since_load"] == before["steps_since_load"] == 0
    assert weights_call(server, "checkpoints", method="GET").data["checkpoints"] == []
    holder.detach()
