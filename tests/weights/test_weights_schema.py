"""The published response schemas (docs/schemas/millm-weights-api-v1.json and health-detailed.json) against the real
routes: one write cycle over HTTP on a real server, every body validated by schema_check.py, success bodies
against their route's data inside the success envelope and refusals against the error envelope. And the check can
fail: a body with a wrong value is refused."""

from __future__ import annotations

import base64
import copy
from pathlib import Path

import httpx
import jsonschema
import pytest

from tests.inference.serving import operator_client, wait_for
from tests.weights.schema_check import routes, validate_health_detailed, validate_weights_response
from tests.weights.weights_calls import Answer, Holder, load_attachable, new_token, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

RUN_ID = "schema"


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def server(start_server, checkpoint_dir):
    # timers long enough that nothing expires between two calls of the cycle
    return start_server(
        WEIGHTS_COMMIT_WATCHDOG_MS="30000", WEIGHTS_HOLD_TIMEOUT_S="30", PANTHEON_CHECKPOINT_DIR=str(checkpoint_dir)
    )


class Checked:
    """Validates every body as it arrives; `seen` records the routes that answered 200."""

    def __init__(self, server):
        self.server = server
        self.seen: set[str] = set()

    def __call__(self, route: str, answer: Answer, *, refused: bool = False) -> Answer:
        method, name = route.split(" ", 1)
        full = f"{method} /api/weights/{name}"
        validate_weights_response(full, answer.body)
        if refused:
            assert answer.status >= 400 and answer.body["success"] is False, answer.body
        else:
            assert answer.status == 200, answer.body
            self.seen.add(full)
        return answer

    def status(self) -> dict:
        return self("GET status", weights_call(self.server, "status", method="GET")).data

    def health(self) -> dict:
        response = httpx.get(f"{self.server.url}/api/health/detailed", timeout=30)
        assert response.status_code == 200, response.text
        validate_health_detailed(response.json())
        return response.json()


def test_one_cycle_answers_as_the_schema_says(server, api, stories_hf_dir):
    check = Checked(server)
    before = check.status()
    assert before["resident_model"] is None and before["steps_since_load"] is None
    assert check.health()["models"] == []

    holder = Holder(server, load_attachable(api, stories_hf_dir))
    check("GET status", weights_call(server, "status", method="GET"))  # resident, nothing attached
    attach = check("POST attach", weights_call(server, "attach", holder.token))
    holder.attachment_id = attach.data["attachment_id"]
    assert attach.data["storages"][0]["kind"] == "cpu_shared_file" and attach.data["parameters"]
    # the storage entry is held to its kind: a CPU file's fields are not a CUDA handle's
    relabelled = copy.deepcopy(attach.body)
    relabelled["data"]["storages"][0]["kind"] = "cuda_ipc"
    with pytest.raises(jsonschema.ValidationError):
        validate_weights_response("POST /api/weights/attach", relabelled)
    try:
        second = check("POST attach", weights_call(server, "attach", new_token("trainer", "second")), refused=True)
        assert second.error == (409, "ALREADY_ATTACHED", None)
        check("POST heartbeat", holder.call("heartbeat"))
        check("POST quiesce", holder.call("quiesce"))
        quiesced = check.status()
        assert quiesced["barrier"] == "quiesced" and quiesced["quiesced_at"] is not None
        assert check.health()["weights"]["attachment_state"] == "active"
        check("POST commit-begin", holder.call("commit-begin"))
        writing = check.status()
        assert writing["weights_state"] == "writing" and writing["commit"] is not None
        check("POST commit-end", holder.call("commit-end"))
        check("POST resume", holder.call("resume"))
        saved = check("POST save", holder.call("save", {"run_id": RUN_ID})).data
        after = check.status()
        assert after["last_save"] is not None and after["origin"] == "checkpoint"
        chain = check("GET lineage", weights_call(server, "lineage", method="GET")).data["chain"]
        assert [c["kind"] for c in chain] == ["served", "checkpoint", "model"]
        rows = check("GET checkpoints", weights_call(server, "checkpoints", method="GET")).data["checkpoints"]
        assert [r["name"] for r in rows] == [saved["name"]]
        loaded = check("POST load", weights_call(server, "load", holder.token, body={"checkpoint": saved["name"]}))
        assert loaded.data["served_name"] == saved["name"]
        check("POST detach", holder.call("detach"))
        holder.attachment_id = None
    finally:
        holder.detach()
    operator = new_token("operator", "ops-schema")
    refused = check("POST clear-stale", weights_call(server, "clear-stale", operator), refused=True)
    assert refused.error == (409, "NOT_ATTACHED", None)
    check.status()

    # every route of the schema was answered for real, except clear-stale's success: it needs a stale attachment,
    # which the next test makes on a server of its own
    assert set(routes()) - check.seen == {"POST /api/weights/clear-stale"}
    assert check.health()["weights"]["attached"] is False


def test_clear_stale_answers_as_the_schema_says(start_server, operator_token, stories_hf_dir):
    # a heartbeat timeout short enough to wait for: the holder below never sends one
    stale_soon = start_server(WEIGHTS_HEARTBEAT_TIMEOUT_S="1", WEIGHTS_HEARTBEAT_INTERVAL_HINT_S="0.5")
    check = Checked(stale_soon)
    with operator_client(stale_soon, operator_token) as api:
        holder = Holder(stale_soon, load_attachable(api, stories_hf_dir))
        holder.attach()
        wait_for(lambda: check.status()["attachment"]["state"] == "stale")
        cleared = check("POST clear-stale", weights_call(stale_soon, "clear-stale", operator_token)).data
        assert cleared["cleared"]["label"] == "trainer" and cleared["cleared"]["stale_since"] is not None
        assert check.status()["attached"] is False
    assert check.seen == {"GET /api/weights/status", "POST /api/weights/clear-stale"}


GOOD_STATUS = {
    "success": True,
    "data": {
        "attached": False,
        "attachment": None,
        "barrier": "serving",
        "quiesced_at": None,
        "held_requests": None,
        "weights_state": "clean",
        "resident_model": None,
        "steps_since_load": None,
        "last_save": None,
        "commit": None,
        "commit_overran": None,
        "last_hold_timeout_at": None,
        "last_overrun": None,
        "pause_unavailable": None,
        "adapter": {"applied": False, "name": None},
        "cuda_memory": None,
        "exports_since_start": 0,
        "model": None,
        **dict.fromkeys(
            (
                "served_name",
                "origin",
                "commits",
                "unsaved_commits",
                "transition",
                "attachable",
                "not_attachable_reason",
                "layout",
                "forward_steps",
            )
        ),
    },
    "error": None,
}


GOOD_QUIESCE = {
    "success": True,
    "data": {
        "held_requests": 0,
        "held_batch_chunks": 0,
        "weights_state": "clean",
        "quiesced_at": "2026-10-17T00:00:00.500000+00:00",
        "hold_deadline": "2026-10-17T00:00:30.500000+00:00",
    },
    "error": None,
}
RESIDENT = {
    "model": "stories",
    "resident_model": {"model_id": 1, "name": "stories", "manifest_hash": None},
    "served_name": "stories",
    "origin": "model",
    "commits": 0,
    "steps_since_load": 0,
    "unsaved_commits": 0,
    "transition": None,
    "attachable": True,
    "not_attachable_reason": None,
    "layout": "views",
    "forward_steps": 0,
}
GOOD_RESIDENT_STATUS = {**GOOD_STATUS, "data": {**GOOD_STATUS["data"], **RESIDENT}}
GOOD_OVERVIEW = {**GOOD_STATUS, "data": {**GOOD_STATUS["data"], "models": [GOOD_RESIDENT_STATUS["data"]]}}


@pytest.mark.parametrize(
    ("route", "body", "breaks"),
    [
        ("GET /api/weights/status", GOOD_STATUS, lambda b: b["data"].update(weights_state="dirty")),
        ("GET /api/weights/status", GOOD_STATUS, lambda b: b["data"].update(barrier="paused")),
        ("GET /api/weights/status", GOOD_STATUS, lambda b: b["data"].update(quiesced_at=1792000000.5)),
        ("GET /api/weights/status", GOOD_STATUS, lambda b: b["data"].pop("exports_since_start")),
        ("GET /api/weights/status", GOOD_STATUS, lambda b: b.update(error={})),
        ("GET /api/weights/status", GOOD_RESIDENT_STATUS, lambda b: b["data"].pop("served_name")),
        ("GET /api/weights/status", GOOD_RESIDENT_STATUS, lambda b: b["data"].update(steps_since_load=None)),
        ("GET /api/weights/status", GOOD_RESIDENT_STATUS, lambda b: b["data"].update(origin="lora")),
        ("GET /api/weights/status", GOOD_OVERVIEW, lambda b: b["data"]["models"][0].update(model=None)),
        ("GET /api/weights/status", GOOD_OVERVIEW, lambda b: b["data"]["models"][0].pop("unsaved_commits")),
        (
            "POST /api/weights/quiesce",
            GOOD_QUIESCE,
            lambda b: b["data"].update(quiesced_at=1792000000.5),
        ),
        (
            "POST /api/weights/clear-stale",
            {
                "success": False,
                "data": None,
                "error": {"code": "NOT_ATTACHED", "message": "m", "reason": None, "details": {}},
            },
            lambda b: b["error"].update(reason=7),
        ),
    ],
    ids=[
        "weights_state",
        "barrier",
        "epoch_in_status",
        "missing_field",
        "error_not_null",
        "resident_without_served_name",
        "resident_steps_null",
        "origin",
        "a_listed_model_without_its_name",
        "a_listed_model_without_unsaved_commits",
        "epoch_in_quiesce",
        "error_reason_type",
    ],
)
def test_the_schema_refuses_a_wrong_body(route, body, breaks):
    validate_weights_response(route, body)
    wrong = copy.deepcopy(body)
    breaks(wrong)
    with pytest.raises(jsonschema.ValidationError):
        validate_weights_response(route, wrong)


def _cuda_entry(**changes) -> dict:
    """A storage entry as handles.py `_cuda_entry` builds it (this host has no GPU to export one for real)."""
    entry = {
        "kind": "cuda_ipc",
        "device": "cuda:0",
        "device_index": 0,
        "device_uuid": "5c8e6a1e-3f4b-2d1c-9a8b-7c6d5e4f3a2b",
        "handle": base64.b64encode(bytes(range(64))).decode("ascii"),
        "storage_size_bytes": 268435456,
        "storage_offset_bytes": 0,
        "ref_counter_handle": base64.b64encode(b"/torch_1234_5678_0").decode("ascii"),
        "ref_counter_offset": 3,
        "event_handle": base64.b64encode(bytes(64)).decode("ascii"),
        "event_sync_required": True,
    }
    return entry | changes


def _attach_with(storage: dict) -> dict:
    return {
        "success": True,
        "error": None,
        "data": {
            "attachment_id": "x" * 32,
            "model": {"model_id": 1, "name": "m", "manifest_hash": None},
            "weights_state": "torn",
            "steps_since_load": 0,
            "heartbeat": {"timeout_s": 30.0, "interval_hint_s": 5.0},
            "producer": {"torch": "2.13.0+cu130", "cuda": "13.0", "driver": None},
            "storages": [storage],
            "parameters": [
                {
                    "name": "w",
                    "storage": 0,
                    "dtype": "bfloat16",
                    "shape": [4, 2],
                    "stride": [2, 1],
                    "storage_offset": 0,
                    "requires_grad": True,
                }
            ],
            "release": {"pinned_bytes": storage["storage_size_bytes"], "contract": "c"},
            "config": None,
            "layout": None,
        },
    }


def test_a_cuda_storage_entry_fits_and_its_byte_fields_must_be_base64():
    validate_weights_response("POST /api/weights/attach", _attach_with(_cuda_entry()))
    empty = _cuda_entry(handle=None, ref_counter_handle=None, event_handle=None, event_sync_required=None)
    validate_weights_response("POST /api/weights/attach", _attach_with(empty))  # an empty storage, as torch sends it
    for wrong in (
        _cuda_entry(handle="not base64!"),
        _cuda_entry(device_index=None),
        _cuda_entry(device="cpu"),
        {k: v for k, v in _cuda_entry().items() if k != "device_uuid"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_weights_response("POST /api/weights/attach", _attach_with(wrong))


def test_an_unknown_route_is_a_key_error():
    with pytest.raises(KeyError):
        validate_weights_response("POST /api/weights/nope", GOOD_STATUS)


def test_the_health_schema_refuses_a_wrong_summary():
    body = {
        "service": "pantheon",
        "status": "ok",
        "backend": "cpu",
        "build": "unknown",
        "accelerator": False,
        "dies_visible": 0,
        "models": [{"name": "stories", "state": "ready"}],
        "weights": {"weights_state": "clean", "barrier": "serving", "attached": False, "attachment_state": None},
    }
    validate_health_detailed(body)
    validate_health_detailed({**body, "weights": {"error": "RuntimeError: no router"}})
    with pytest.raises(jsonschema.ValidationError):
        validate_health_detailed({**body, "weights": {**body["weights"], "attachment_state": "gone"}})
