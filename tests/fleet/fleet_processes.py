"""A fleet on loopback, for tests: `manage.py router` processes and `manage.py serve` instances registered with them,
each with its own data folder and port, the routers sharing one Redis database (docs/fleet.md).

`Fleet` starts and stops them; `tests/fleet/conftest.py` makes one per module (`start_fleet`). The instances share
the test run's database, as a fleet shares PostgreSQL; each loads the stories260K GGUF under one served name through
its own local credential, and the fleet waits until every router shows every instance live.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path

import httpx
import redis

from tests.inference.serving import START_TIMEOUT_S, PantheonServer, bearer, serving_env

FLEET_TOKEN = "test-fleet-token"
MODEL = "stories"
# The routers' registry: this suite's Redis database (override with PANTHEON_TEST_FLEET_REDIS_URL).
FLEET_REDIS_URL = os.environ.get("PANTHEON_TEST_FLEET_REDIS_URL", "redis://127.0.0.1:6379/10")
# Short, so an instance killed in a test is dropped soon; the heartbeat well inside the timeout.
FLEET_TIMINGS = {"PANTHEON_REGISTRY_HEARTBEAT_S": "0.3", "PANTHEON_REGISTRY_TIMEOUT_S": "3"}


class RouterProcess(PantheonServer):
    """One `manage.py router` subprocess on `port` (else a free one)."""

    command_name = "router"
    ready_path = "/health"

    def models(self) -> dict[str, dict]:
        """The router's /v1/models rows by model id."""
        return {row["id"]: row for row in httpx.get(self.url + "/v1/models", timeout=10).json()["data"]}


def router_env(data_dir: Path, redis_url: str, **overrides: str) -> dict[str, str]:
    return serving_env(data_dir, PANTHEON_FLEET_TOKEN=FLEET_TOKEN, PANTHEON_FLEET_REDIS_URL=redis_url,
                       PANTHEON_LOG_LEVEL="INFO", **{**FLEET_TIMINGS, **overrides})  # fmt: skip


def instance_env(data_dir: Path, registry_url: str, **overrides: str) -> dict[str, str]:
    return serving_env(data_dir, PANTHEON_FLEET_TOKEN=FLEET_TOKEN, PANTHEON_REGISTRY_URL=registry_url,
                       **{**FLEET_TIMINGS, **overrides})  # fmt: skip


def clear_registry(redis_url: str) -> None:
    """Forgets every instance an earlier run left in the registry (only the fleet's keys of that database)."""
    store = redis.Redis.from_url(redis_url)
    try:
        keys = list(store.scan_iter(match="pantheon:fleet:*"))
        if keys:
            store.delete(*keys)
    finally:
        store.close()


def load_model(server: PantheonServer, gguf: Path, name: str = MODEL, options: dict | None = None) -> None:
    """Loads the GGUF on `server` (with the load's `options`, e.g. max_sessions) as `manage.py load_model` does, with
    the run file's local credential, and returns once it serves it. The instances share the catalogue: one that
    starts after another's load catalogued the model (with those options) autoloads it, and then this load is refused
    as already loading (or loaded), which is as good."""
    secret = server.run_file()["admin_secret"]
    answer = httpx.post(server.url + "/admin/models/load", json={"path": str(gguf), "name": name, **(options or {})},
                        headers=bearer(secret), timeout=120)  # fmt: skip
    assert answer.status_code == 200 or "already" in answer.json()["error"]["message"], answer.text
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if name in {row["id"] for row in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]}:
            return
        time.sleep(0.05)
    raise AssertionError(f"{server.url} does not serve {name} {START_TIMEOUT_S} s after its load:\n{server.log()}")


class Fleet:
    """Routers and instances started for a test module; `stop()` ends them all (SIGTERM, SIGKILL after a wait)."""

    def __init__(self, tmp_path_factory, gguf: Path, redis_url: str = FLEET_REDIS_URL):
        self.tmp_path_factory = tmp_path_factory
        self.gguf = gguf
        self.redis_url = redis_url
        self.routers: list[RouterProcess] = []
        self.instances: list[PantheonServer] = []
        clear_registry(redis_url)

    def start_router(self, port: int | None = None, **env: str) -> RouterProcess:
        data_dir = self.tmp_path_factory.mktemp("fleet-router")
        router = RouterProcess(data_dir, router_env(data_dir, self.redis_url, **env), port=port)
        self.routers.append(router)
        return router.start()

    def start_instances(self, count: int, registry: RouterProcess | str, *, model: str = MODEL,
                        load_options: dict | None = None, **env: str):  # fmt: skip
        """Starts `count` instances at once, registering with `registry` (a router, or its URL), each serving the
        GGUF as `model` (loaded with `load_options`)."""
        url = registry if isinstance(registry, str) else registry.url
        servers = []
        for _ in range(count):
            data_dir = self.tmp_path_factory.mktemp("fleet-instance")
            servers.append(PantheonServer(data_dir, instance_env(data_dir, url, **env)))
        self.instances += servers
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            list(pool.map(lambda server: load_model(server.start(), self.gguf, model, load_options), servers))
        return servers

    def wait_live(self, router: RouterProcess, count: int, model: str = MODEL, timeout: float = 60.0) -> dict:
        """Waits until `router` shows `count` live instances of `model`; returns its row. Fails with what the router
        shows and the ends of the processes' logs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = router.models().get(model, {"live": 0})
            if row["live"] == count:
                return row
            time.sleep(0.05)
        logs = "\n".join(f"--- {p.log_path}:\n{p.log()[-2000:]}" for p in [*self.routers, *self.instances])
        raise AssertionError(f"{router.url} shows {router.models()} after {timeout} s, not {count} of {model}\n{logs}")

    def stop(self) -> None:
        for process in [*self.instances, *self.routers]:
            process.stop()
        clear_registry(self.redis_url)


def instance_id(server: PantheonServer, model: str = MODEL) -> str:
    """The instance id `server` registers `model` under (host:port:model)."""
    return f"127.0.0.1:{server.port}:{model}"
