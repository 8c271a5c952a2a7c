"""The full runs of the fault tests (tests/faults/), whose results docs/reliability.md records.

Each subcommand starts `manage.py serve` (tests/inference/serving.py's PantheonServer) on a PostgreSQL cluster of its
own (tests/faults/private_services.py: never the shared one), loads stories260K, drives --clients /v1 chat
completion clients and one operator polling GET /admin/models every 100 ms for --seconds, and breaks one part in
the middle:

  postgres  the cluster stopped (pg_ctl -m immediate) for --outage seconds, then started
  redis     REDIS_URL set to a private redis-server, killed for --outage seconds, then started
  worker    the worker SIGKILLed --kills times, each while a load is in flight at it (held there by SIGSTOP)
  disk      POST /api/weights/save --saves times onto a full 4 MiB tmpfs, then once with room (needs root)

It prints one JSON object: requests sent, outcomes by status (/v1 and operator apart), p50/p99 latency, the
server's and its workers' peak resident memory, what the fault did (the statuses seen while it lasted), how long
recovery took (from the part's return to the first operator 200), and the tracebacks in the server's log.

Run: .venv/bin/python bench/faults.py postgres|redis|worker|disk [--clients 4] [--seconds 60] [--outage 15]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

from bench.memory_watch import MemoryWatch  # noqa: E402
from tests.faults.private_services import PrivatePostgres, PrivateRedis  # noqa: E402
from tests.inference.serving import PantheonServer, bearer, run_manage  # noqa: E402

MODEL = REPO.parent / "shared" / "models" / "stories260K-hf"
CHAT = {"messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 0, "max_tokens": 16}


class Traffic:
    """/v1 clients and an operator poller in threads, each request's (start, status, seconds) kept."""

    def __init__(self, url: str, token: str, clients: int):
        self.url, self.token = url, token
        self.v1: list[tuple[float, int, float]] = []
        self.operator: list[tuple[float, int, float]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        self._threads.append(threading.Thread(target=self._poller, daemon=True))

    def _timed(self, client: httpx.Client, into: list, method: str, path: str, **kwargs) -> None:
        started = time.monotonic()
        try:
            status = client.request(method, path, **kwargs).status_code
        except httpx.HTTPError:
            status = 0  # no answer at all: a hang cut by the timeout, or a dropped connection
        into.append((started, status, time.monotonic() - started))

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                self._timed(client, self.v1, "POST", "/v1/chat/completions", json=CHAT)

    def _poller(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60, headers=bearer(self.token)) as client:
            while not self._stop.is_set():
                self._timed(client, self.operator, "GET", "/admin/models")
                time.sleep(0.1)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def summary(requests: list[tuple[float, int, float]], window: tuple[float, float] | None = None) -> dict:
    chosen = [r for r in requests if window is None or window[0] <= r[0] < window[1]]
    latencies = sorted(r[2] for r in chosen)

    def pick(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 4) if latencies else None

    counts = collections.Counter(str(r[1]) for r in chosen)
    return {"sent": len(chosen), "by_status": dict(sorted(counts.items())), "p50_s": pick(0.5), "p99_s": pick(0.99)}


def first_ok_after(requests: list[tuple[float, int, float]], moment: float) -> float | None:
    """Seconds from `moment` to the end of the first 200 that started after it."""
    oks = [start + took for start, status, took in requests if start >= moment and status == 200]
    return round(min(oks) - moment, 3) if oks else None


def start_stack(root: Path, **env: str) -> tuple[PrivatePostgres, PantheonServer, str]:
    postgres = PrivatePostgres().start()
    server_env = dict(os.environ)
    server_env.update(
        DATABASE_URL=postgres.url,
        PANTHEON_DATA_DIR=str(root),
        DJANGO_SECRET_KEY=secrets.token_urlsafe(32),
        PANTHEON_TOKEN_HMAC_KEY=secrets.token_urlsafe(32),
        PANTHEON_WORKER_DEVICES="cpu",
        PANTHEON_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        **env,
    )
    for command in (["migrate", "--no-input"], ["create_token", "--role", "operator", "--label", "ops"]):
        done = run_manage(server_env, *command)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
    token = done.stdout.strip().splitlines()[-1]
    server = PantheonServer(root, server_env).start()
    loaded = httpx.post(f"{server.url}/admin/models/load", json={"path": str(MODEL), "name": "stories"},
                        headers=bearer(token), timeout=120)  # fmt: skip
    loaded.raise_for_status()
    return postgres, server, token


def run_outage(args, stop, start, **env) -> dict:
    """Traffic for --seconds; `stop()` a third of the way in, `start()` --outage seconds later."""
    root = Path(tempfile.mkdtemp(prefix="pantheon-faults-"))
    postgres, server, token = start_stack(root, **env)
    try:
        with MemoryWatch(server.process.pid) as memory, Traffic(server.url, token, args.clients) as traffic:
            began = time.monotonic()
            time.sleep(args.seconds / 3)
            down = time.monotonic()
            stop(postgres)
            time.sleep(args.outage)
            up = time.monotonic()
            start(postgres)
            time.sleep(max(0.0, began + args.seconds - time.monotonic()))
        log = server.log()
        return {
            "v1": summary(traffic.v1),
            "operator": summary(traffic.operator),
            "during_outage": {"v1": summary(traffic.v1, (down, up)), "operator": summary(traffic.operator, (down, up))},
            "outage_s": round(up - down, 3),
            "operator_recovered_after_s": first_ok_after(traffic.operator, up),
            "peak_rss_mib": round(memory.peak / 2**20, 1),
            "tracebacks_in_log": log.count("Traceback"),
            "log_lines_database_unavailable": log.count("database unavailable:"),
        }
    finally:
        server.stop()
        postgres.remove()
        shutil.rmtree(root, ignore_errors=True)


def postgres_run(args) -> dict:
    return run_outage(args, lambda pg: pg.stop("immediate"), lambda pg: pg.start())


def redis_run(args) -> dict:
    redis = PrivateRedis(Path(tempfile.mkdtemp(prefix="pantheon-redis-"))).start()
    try:
        return run_outage(args, lambda pg: redis.stop(), lambda pg: redis.start(), REDIS_URL=redis.url)
    finally:
        redis.stop()
        shutil.rmtree(redis.root, ignore_errors=True)


def worker_run(args) -> dict:
    """--kills times: the worker stopped, a load of "second" asked for, then the worker killed; the load's answer
    and how long until "stories" answers /v1 again, under the traffic."""
    root = Path(tempfile.mkdtemp(prefix="pantheon-faults-"))
    postgres, server, token = start_stack(root, PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S="300")
    kills = []
    try:
        with MemoryWatch(server.process.pid) as memory, Traffic(server.url, token, args.clients) as traffic:
            operator = httpx.Client(base_url=server.url, timeout=120, headers=bearer(token))
            for _ in range(args.kills):
                time.sleep(2)
                kills.append(kill_during_load(server, operator, traffic))
        return {
            "v1": summary(traffic.v1),
            "operator": summary(traffic.operator),
            "kills": kills,
            "peak_rss_mib": round(memory.peak / 2**20, 1),
            "tracebacks_in_log": server.log().count("Traceback"),
        }
    finally:
        server.stop()
        postgres.remove()
        shutil.rmtree(root, ignore_errors=True)


def kill_during_load(server: PantheonServer, operator: httpx.Client, traffic: Traffic) -> dict:
    [pid] = server.worker_pids()
    second = {"path": str(MODEL), "name": "second"}
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(r=operator.post("/admin/models/load", json=second)))
    os.kill(pid, signal.SIGSTOP)
    thread.start()
    deadline = time.monotonic() + 60
    while operator.post("/admin/models/unload", json={"name": "second"}).status_code != 409:  # 409: it is loading
        if time.monotonic() > deadline:
            raise RuntimeError("the load never reached the worker")
        time.sleep(0.05)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join()
    answered = time.monotonic() - killed
    # Recovered: a new worker serves "stories" again (its instance row ready), before the next kill.
    deadline = killed + 120
    while time.monotonic() < deadline:
        rows = operator.get("/admin/models").json().get("data", [])
        if [(r["id"], r.get("state")) for r in rows] == [("stories", "ready")] and first_ok_after(traffic.v1, killed):
            break
        time.sleep(0.05)
    recovered = time.monotonic()
    response = answer["r"]
    return {
        "load_status": response.status_code,
        "load_error": response.json().get("error", {}).get("type"),
        "load_answered_after_s": round(answered, 3),
        "v1_recovered_after_s": first_ok_after(traffic.v1, killed),
        "v1_from_kill_to_recovery": summary(traffic.v1, (killed, recovered))["by_status"],
    }


def disk_run(args) -> dict:
    """--saves saves onto a full tmpfs (each refused, nothing left behind), then one with room that loads."""
    root = Path(tempfile.mkdtemp(prefix="pantheon-faults-"))
    disk = root / "checkpoints"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    postgres = server = None
    try:
        postgres, server, token = start_stack(root, PANTHEON_CHECKPOINT_DIR=str(disk))
        return disk_saves(args, server, disk)
    finally:
        if server is not None:
            server.stop()
        if postgres is not None:
            postgres.remove()
        subprocess.run(["umount", "--lazy", str(disk)], check=True)
        shutil.rmtree(root, ignore_errors=True)


def disk_saves(args, server: PantheonServer, disk: Path) -> dict:
    trainer = run_manage(server.env, "create_token", "--role", "trainer", "--label", "bench-trainer")
    secret = trainer.stdout.strip().splitlines()[-1]
    # A load made now is attachable (a trainer token exists).
    with httpx.Client(base_url=server.url, timeout=120, headers=bearer(secret)) as client:
        ops = run_manage(server.env, "create_token", "--role", "operator", "--label", "bench-ops")
        operator = bearer(ops.stdout.strip().splitlines()[-1])
        client.post("/admin/models/unload", json={"name": "stories"}, headers=operator).raise_for_status()
        client.post("/admin/models/load", json={"path": str(MODEL), "name": "stories"}, headers=operator)
        attachment = client.post("/api/weights/attach", json={}).json()["data"]["attachment_id"]
        client.headers["X-miLLM-Attachment"] = attachment
        filler = disk / "filler"
        filler.write_bytes(b"\0" * max(0, shutil.disk_usage(disk).free - (64 << 10)))
        refusals = collections.Counter()
        took = []
        for _ in range(args.saves):
            started = time.monotonic()
            body = client.post("/api/weights/save", json={"run_id": "run"}).json()
            took.append(time.monotonic() - started)
            error = body["error"] or {}
            refusals[f"{error.get('code')}/{error.get('reason')}"] += 1
        left_behind = sorted(p.name for p in (disk / "run").iterdir())
        filler.unlink()
        saved = client.post("/api/weights/save", json={"run_id": "run"}).json()
        loaded = client.post("/api/weights/load", json={"checkpoint": saved["data"]["name"]}).json()
        took.sort()
        return {
            "saves_on_full_disk": args.saves,
            "refusals": dict(refusals),
            "refusal_p99_s": round(took[min(len(took) - 1, int(0.99 * len(took)))], 4),
            "left_behind": left_behind,
            "message": body["error"]["message"] if body["error"] else None,
            "save_with_room": saved["success"],
            "load_of_it": loaded["success"],
            "tracebacks_in_log": server.log().count("Traceback"),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fault", choices=["postgres", "redis", "worker", "disk"])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--outage", type=float, default=15.0)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--saves", type=int, default=20)
    args = parser.parse_args()
    run = {"postgres": postgres_run, "redis": redis_run, "worker": worker_run, "disk": disk_run}[args.fault]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    result = run(args)
    print(json.dumps({"fault": args.fault, "started": started, "args": vars(args), **result}, indent=2))


if __name__ == "__main__":
    main()
