"""Loading and unloading models in a running server, through the API and through `manage.py`, with the catalogue,
the instance rows and the audit log following; unload drains generations in flight within its timeout; a client
that disconnects frees its generation at once."""

import getpass
import json
import signal
import threading

import httpx
import psutil
import pytest
from gguf import GGMLQuantizationType as Q

from inference.engine import kernels
from inference.engine.contract.params import LoadOptions
from inference.engine.demo_model import write_demo_model
from inference.models import CatalogModel, InstanceState, ModelInstance, Worker, WorkerState
from pantheon_site.models import AuditEvent
from tests.engine.test_quantized_weights import write_wide_gguf
from tests.inference.serving import bearer, free_port, run_manage, serving_env, sse_events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG_STREAM = {"messages": [{"content": "Hi"}], "temperature": 0, "max_tokens": 500, "stream": True}
# A generation of the demo model that only its length ends (its window is 2,048; neither end of sequence nor, with
# PANTHEON_REPETITION_LOOP_TOKENS=0, the loop detector), and the tokens of the stream that times a disconnect:
# started on a second model of the same worker just before the disconnect, it advances one token per worker step, as
# the abandoned stream would; fewer steps than that one has left, so if the disconnect did not abort it, the timer
# would end first. Hundreds of steps, where the disconnect takes a few: a faster step cannot make it a race.
ENDLESS = {**LONG_STREAM, "max_tokens": 2000, "ignore_eos": True}
TIMER_TOKENS = 1200


def served(api):
    return [m["id"] for m in api.get("/v1/models").json()["data"]]


def test_load_and_unload_through_the_api(api, stories_hf_dir):
    response = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "s", "ctx_cap": 128})
    assert response.status_code == 200, response.text
    row = response.json()
    assert (row["id"], row["device"], row["context_window"]) == ("s", "cpu", 128)
    assert row["compile"] is False  # the decode step runs eagerly, as asked, and says so
    assert row["graphs"] == {"mode": "eager", "buckets": [], "warmup_ms": 0.0, "fallback_reason": None}
    assert row["kernels"] == kernels.active_kernels()  # the worker inherits this process's PANTHEON_KERNELS
    assert served(api) == ["s"]
    catalogue = CatalogModel.objects.get(name="s")
    assert (catalogue.path, catalogue.format, catalogue.architecture) == (str(stories_hf_dir), "hf", "llama")
    assert catalogue.load_options.ctx_cap == 128 and catalogue.autoload
    instance = ModelInstance.objects.get()
    assert (instance.pk, instance.state, instance.device) == (row["instance_id"], InstanceState.READY, "cpu")
    assert instance.context_window == 128 and instance.memory_bytes == row["vram_bytes"]

    response = api.post("/admin/models/unload", json={"name": "s"})
    assert response.json() == {"unloaded": "s", "instance_id": row["instance_id"], "aborted": 0}
    assert served(api) == [] and not ModelInstance.objects.exists()
    assert not CatalogModel.objects.get(name="s").autoload  # an unloaded model is not brought back at start
    events = [
        (e.operation, e.outcome, e.actor_label, e.model) for e in AuditEvent.objects.exclude(operation="model_list")
    ]
    assert events == [("model_load", "accepted", "ops", "s"), ("model_unload", "accepted", "ops", "s")]


def test_a_load_that_names_fewer_options_keeps_the_catalogues_others(api, stories_hf_dir):
    first = {"path": str(stories_hf_dir), "name": "s", "ctx_cap": 128, "max_sessions": 2, "reasoning_budget": 8}
    assert api.post("/admin/models/load", json=first).status_code == 200
    api.post("/admin/models/unload", json={"name": "s"})
    again = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "s", "max_sessions": 3})
    assert again.status_code == 200, again.text
    assert again.json()["context_window"] == 128  # the saved ctx_cap, though this load did not name it
    assert CatalogModel.objects.get(name="s").load_options == LoadOptions(ctx_cap=128, max_sessions=3,
                                                                          reasoning_budget=8)  # fmt: skip
    api.post("/admin/models/unload", json={"name": "s"})
    default = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "s", "ctx_cap": 0})
    assert default.json()["context_window"] == 512  # named, the default replaces it (the model's own window)
    assert CatalogModel.objects.get(name="s").load_options.ctx_cap == 0


def test_unload_by_instance_id(api, stories_hf_dir, stories_gguf_path):
    api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "a"})
    b = api.post("/admin/models/load", json={"path": str(stories_gguf_path), "name": "b"}).json()
    assert api.post("/admin/models/unload", json={"id": b["instance_id"]}).json()["unloaded"] == "b"
    assert served(api) == ["a"]


def test_manage_py_acts_on_the_running_server(api, server, stories_gguf_path):
    loaded = server.manage("load_model", str(stories_gguf_path), "--name", "cli", "--ctx-cap", "64")
    assert loaded.returncode == 0, loaded.stderr
    assert "Loaded 'cli'" in loaded.stdout and server.url in loaded.stdout
    assert api.get("/v1/models").json()["data"][0]["context_window"] == 64
    unloaded = server.manage("unload_model", "cli")
    assert unloaded.returncode == 0, unloaded.stderr
    assert "Unloaded 'cli'" in unloaded.stdout
    assert served(api) == []
    refused = server.manage("load_model", "/nonexistent/model.gguf")
    assert refused.returncode == 1 and "no such file" in refused.stderr
    # One event per action, written by the server and attributed to the operator's OS account.
    events = [(e.operation, e.outcome, e.actor_kind, e.actor_label, e.model) for e in AuditEvent.objects.all()]
    user = getpass.getuser()
    assert events == [
        ("model_load", "accepted", "cli", user, "cli"),
        ("model_unload", "accepted", "cli", user, "cli"),
        ("model_load", "refused", "cli", user, "/nonexistent/model.gguf"),
    ]


def test_the_run_file_is_private_to_the_server_user(server):
    info = server.run_file()
    assert info["url"] == server.url and info["pid"] == server.process.pid
    assert (server.data_dir / "run" / "server.json").stat().st_mode & 0o077 == 0


def test_a_second_serve_on_the_same_data_folder_refuses_to_start(server):
    second = server.manage("serve", "--port", str(free_port()))
    assert second.returncode == 1 and f"already running at {server.url}" in second.stderr


def test_without_a_server_the_commands_change_the_catalogue(server, stories_hf_dir, tmp_path):
    env = serving_env(tmp_path)  # another data folder: no run file, so no server to talk to
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "server.json").write_text(json.dumps({"pid": 2**22 + 1, "url": server.url,
                                                              "admin_secret": "pthl_stale"}))  # fmt: skip
    loaded = run_manage(env, "load_model", str(stories_hf_dir), "--name", "later")
    assert loaded.returncode == 0 and "No server is running" in loaded.stdout
    assert CatalogModel.objects.get(name="later").autoload
    unloaded = run_manage(env, "unload_model", "later")
    assert unloaded.returncode == 0 and "will not load it" in unloaded.stdout
    assert not CatalogModel.objects.get(name="later").autoload
    assert [(e.operation, e.actor_kind) for e in AuditEvent.objects.all()] == [("model_load", "cli"),
                                                                              ("model_unload", "cli")]  # fmt: skip
    assert not ModelInstance.objects.exists()


def test_without_a_server_a_load_does_not_repoint_a_name_unless_told(tmp_path, stories_hf_dir, stories_gguf_path):
    env = serving_env(tmp_path)
    first = run_manage(env, "load_model", str(stories_hf_dir), "--name", "stories", "--ctx-cap", "64")
    assert first.returncode == 0, first.stderr
    elsewhere = run_manage(env, "load_model", str(stories_gguf_path), "--name", "stories")
    assert elsewhere.returncode == 1 and "--replace" in elsewhere.stderr
    assert CatalogModel.objects.get(name="stories").path == str(stories_hf_dir)
    same = run_manage(env, "load_model", str(stories_hf_dir), "--name", "stories", "--max-sessions", "2")
    assert same.returncode == 0, same.stderr  # the same path: its options change, the others stay
    assert CatalogModel.objects.get(name="stories").load_options == LoadOptions(ctx_cap=64, max_sessions=2)
    replaced = run_manage(env, "load_model", str(stories_gguf_path), "--name", "stories", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert CatalogModel.objects.get(name="stories").path == str(stories_gguf_path)


def stream_then_unload(server, api, name, body=LONG_STREAM):
    """Starts a long greedy stream, and once its first token arrived, unloads the model. Returns the stream's
    events, the unload's response, and how many of those events the stream had received when the unload returned."""
    events, result = [], {}

    def unload():
        result["unload"] = api.post("/admin/models/unload", json={"name": name})
        result["seen"] = len(events)

    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json={**body, "model": name}) as stream:
            lines = stream.iter_lines()
            while not next(lines).startswith('data: {"id"'):
                pass
            thread = threading.Thread(target=unload)
            thread.start()
            for line in lines:
                if line:
                    events.append(json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]")
    thread.join()
    return events, result["unload"], result["seen"]


def test_unload_drains_a_generation_in_flight(api, server, stories_hf_dir):
    api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "busy"})
    events, unload, seen = stream_then_unload(server, api, "busy")
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # ran to the window: nothing was cut short
    assert unload.status_code == 200 and unload.json()["aborted"] == 0
    # The unload returned only once the generation was done: by then the stream had (nearly) all of its events,
    # where an unload that answered at once would have found only the first few.
    assert seen > len(events) / 2, (seen, len(events))
    assert served(api) == []


def test_unload_ends_what_is_still_running_at_the_drain_timeout(start_server, tmp_path, operator_token):
    # A generation that cannot end before the timeout, however fast the worker steps: 2,000 tokens of the demo
    # model's window, with neither end of sequence nor the loop detector to end them early, are thousands of steps
    # where the drain timeout is a few.
    model = write_demo_model(tmp_path / "demo")
    server = start_server(PANTHEON_UNLOAD_DRAIN_TIMEOUT_S="0.05", PANTHEON_REPETITION_LOOP_TOKENS="0")
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(operator_token)) as api:
        api.post("/admin/models/load", json={"path": str(model), "name": "slow"})
        events, unload, _ = stream_then_unload(server, api, "slow", ENDLESS)
        assert unload.status_code == 200 and unload.json()["aborted"] == 1
        assert "[DONE]" not in events
        # Ended by the unload at its drain timeout (far shorter than the generation), not run to its end.
        assert events[-1]["error"]["type"] == "server_error" and "unloaded" in events[-1]["error"]["message"]
        assert served(api) == []


def test_a_client_that_disconnects_frees_its_generation(start_server, tmp_path, operator_token):
    model = write_demo_model(tmp_path / "demo")
    server = start_server(PANTHEON_REPETITION_LOOP_TOKENS="0")
    api = httpx.Client(base_url=server.url, timeout=60, headers=bearer(operator_token))
    client = httpx.Client(base_url=server.url, timeout=60)

    def running():
        """Running generations by model, from one status of the worker."""
        return {row["id"]: row["live"]["running"] for row in api.get("/admin/models").json()["data"]}

    def d_or_timer_done():
        now = running()
        return now if now["d"] == 0 or now["timer"] == 0 else None

    with api, client:
        api.post("/admin/models/load", json={"path": str(model), "name": "d"})
        api.post("/admin/models/load", json={"path": str(model), "name": "timer"})
        with client.stream("POST", "/v1/chat/completions", json={**ENDLESS, "model": "d"}) as stream:
            lines = stream.iter_lines()
            for _ in range(3):
                next(lines)
            assert running()["d"] == 1
            timing = {**ENDLESS, "model": "timer", "max_tokens": TIMER_TOKENS}
            with client.stream("POST", "/v1/chat/completions", json=timing) as timer:  # returns once it is running
                stream.close()
                now = wait_for(d_or_timer_done, interval=0.01)
                assert now["d"] == 0
                assert now["timer"] == 1  # freed long before the generation could have finished by itself
                events = sse_events(timer)
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_streams_of_loaded_models_follow_the_spec_order(api, server, stories_hf_dir):
    api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "order"})
    with httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"messages": [{"content": "Hi"}], "max_tokens": 5, "stream": True, "logprobs": True, "top_logprobs": 2}
        with client.stream("POST", "/v1/chat/completions", json=body) as stream:
            assert stream.headers["access-control-allow-origin"] == "*"
            events = sse_events(stream)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    content = [e for e in events[1:-2] if e["choices"][0]["delta"].get("content") is not None]
    assert content and all(e["object"] == "chat.completion.chunk" for e in content)
    tokens = [t for e in content for t in e["choices"][0]["logprobs"]["content"]]
    assert len(tokens) == 5 and all(len(t["top_logprobs"]) == 2 for t in tokens)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_cleanly_with_its_workers(start_server, stories_hf_dir, operator_token, sig):
    server = start_server()
    httpx.post(server.url + "/admin/models/load", json={"path": str(stories_hf_dir)}, headers=bearer(operator_token))
    workers = [psutil.Process(pid) for pid in server.worker_pids()]
    assert workers
    server.process.send_signal(sig)
    assert server.process.wait(30) == 0
    assert "Pantheon stopped." in server.log()
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert not (server.data_dir / "run" / "server.json").exists()
    assert not ModelInstance.objects.exists()
    # Other servers of this module share the "cpu" row and keep writing it: judge only this server's workers.
    mine = Worker.objects.filter(pid__in=[w.pid for w in workers])
    assert set(mine.values_list("state", flat=True)) <= {WorkerState.STOPPED}


def test_admin_models_shows_each_loads_in_memory_weights(api, tmp_path, stories_gguf_path):
    """A GGUF file's quantized layers stay quantized with dtype automatic, next to a float16 KV cache unless the
    load asks for another; they expand with dtype float32, and the KV follows the weights."""
    path = write_wide_gguf(tmp_path, Q.Q8_0, tokenizer=stories_gguf_path)
    loads = (("kept", "", ""), ("expanded", "float32", ""), ("wide_kv", "", "float32"))
    for name, dtype, kv_dtype in loads:
        body = {"path": str(path), "name": name, "dtype": dtype, "kv_dtype": kv_dtype}
        response = api.post("/admin/models/load", json=body)
        assert response.status_code == 200, response.text
    rows = {row["id"]: row for row in api.get("/admin/models").json()["data"]}
    assert rows["kept"]["weights_in_memory"]["linear_formats"] == {"q8_0": 5}
    assert rows["expanded"]["weights_in_memory"]["linear_formats"] == {"float32": 5}
    assert rows["kept"]["weights_in_memory"]["bytes"] < 0.6 * rows["expanded"]["weights_in_memory"]["bytes"]
    kv = {name: (row["kv_cache"]["dtype"], row["kv_cache"]["bytes"]) for name, row in rows.items()}
    assert kv["kept"][0] == "float16" and kv["expanded"][0] == kv["wide_kv"][0] == "float32"
    assert kv["kept"][1] * 2 == kv["wide_kv"][1]


def test_a_16_bit_kv_cache_holds_the_same_window_in_half_the_bytes_and_serves(api, stories_hf_dir):
    for name, kv_dtype in (("wide", ""), ("narrow", "float16")):
        body = {"path": str(stories_hf_dir), "name": name, "kv_dtype": kv_dtype, "ctx_cap": 128}
        response = api.post("/admin/models/load", json=body)
        assert response.status_code == 200, response.text
    rows = {row["id"]: row for row in api.get("/admin/models").json()["data"]}
    assert rows["wide"]["kv_cache"]["dtype"] == "float32" and rows["narrow"]["kv_cache"]["dtype"] == "float16"
    assert rows["narrow"]["context_window"] == rows["wide"]["context_window"]
    assert rows["narrow"]["kv_cache"]["bytes"] * 2 == rows["wide"]["kv_cache"]["bytes"]
    texts = []
    for name in ("wide", "narrow"):
        body = {"model": name, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
        response = api.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]
    response = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "bad", "kv_dtype": "int3"})
    assert response.status_code == 400 and "kv_dtype" in response.text
