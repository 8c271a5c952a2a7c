"""How long the audit page's first page takes to render on a long log: median and p95 milliseconds of GET /ui/audit/
as a signed-in staff user (Django's test Client, so the whole middleware stack, the session and the template, but no
HTTP), over a fresh database of 200,000 events.

Cases: no filter; a filter by one operation (about 1% of the events); a text search in reason that about 2% of the
events match; and a text search that matches none, which reads the whole log (no index serves a substring). The
target is a first page under 300 ms. It also times one walk of the hash chain (the page's verification box, loaded
apart from the list).

The database is never the developer's: the embedded SQLite lives in a temporary PANTHEON_DATA_DIR, and with
DATABASE_URL set the bench creates a database of its own on that server (pantheon_audit_bench_<pid>) and drops it
afterwards. Results go in docs/performance.md. Run:

    .venv/bin/python bench/audit_list_bench.py [--events 200000] [--requests 30]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/audit_list_bench.py
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OPERATIONS = ["chat_completion"] * 60 + ["model_list"] * 25 + ["model_load", "model_unload"] * 5 + ["token_revoke"]
ACTORS = [("token", f"ci-{n}") for n in range(12)] + [("user", "ops-admin"), ("cli", "root"), ("system", "")]
MODELS = ["stories260K", "llama-3-8b", "qwen-2.5-7b", "mistral-7b"]
REASONS = ["", "", "", "queue full", "prompt too long", "token expired", "model not loaded", "checkpoint missing"]
RARE_REASON = "worker ran out of GPU memory"  # about 2% of the events
BATCH = 5000


def build_log(count: int) -> None:
    """`count` events over the last 30 days, oldest first, written in batches (bulk_create chains their hashes)."""
    from pantheon_site.models import AuditEvent

    rng = random.Random(0)
    start = datetime.now(UTC) - timedelta(days=30)
    step = timedelta(days=30) / count
    for first in range(0, count, BATCH):
        batch = []
        for i in range(first, min(first + BATCH, count)):
            kind, label = rng.choice(ACTORS)
            refused = rng.random() < 0.1
            reason = RARE_REASON if rng.random() < 0.02 else (rng.choice(REASONS) if refused else "")
            batch.append(
                AuditEvent(
                    occurred_at=start + step * i,
                    operation=rng.choice(OPERATIONS),
                    outcome="refused" if refused else "accepted",
                    error_type="invalid_request_error" if refused else "",
                    reason=reason,
                    actor_kind=kind,
                    actor_label=label,
                    model=rng.choice(MODELS),
                    request_id=f"req-{i:08x}",
                    client_address="10.0.0.7",
                    duration_ms=rng.uniform(0.5, 40.0),
                    details={"batch": first // BATCH},
                )
            )
        AuditEvent.objects.bulk_create(batch)


def time_page(client, query: dict, requests: int) -> list[float]:
    """Milliseconds per render of the first page under `query`, after one render to warm caches."""
    response = client.get("/ui/audit/", query)
    assert response.status_code == 200 and b'class="notice error"' not in response.content, response.content[:500]
    timings = []
    for _ in range(requests):
        started = time.perf_counter()
        client.get("/ui/audit/", query)
        timings.append((time.perf_counter() - started) * 1000.0)
    return timings


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def run(events: int, requests: int) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from pantheon_site.audit import verify_audit_log

    started = time.perf_counter()
    build_log(events)
    print(f"{connection.vendor}: wrote {events} events in {time.perf_counter() - started:.1f} s")
    if connection.vendor == "postgresql":
        # What autovacuum would have done by the time a log is this long: the planner's statistics.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    client = Client()
    client.force_login(get_user_model().objects.create_user("bench-admin", is_staff=True))
    cases = [
        ("unfiltered", {}),
        ("operation=token_revoke", {"operation": "token_revoke"}),
        ("text search (2% match)", {"q": "gpu memory"}),
        ("text search (no match)", {"q": "no such words anywhere"}),
    ]
    print(f"first page of /ui/audit/, {requests} renders each:")
    for name, query in cases:
        timings = time_page(client, query, requests)
        print(f"  {name:<26} median {statistics.median(timings):7.1f} ms   p95 {p95(timings):7.1f} ms")
    started = time.perf_counter()
    report = verify_audit_log()
    print(f"chain verification: {report.describe()} in {time.perf_counter() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events in the log (default 200000)")
    parser.add_argument("--requests", type=int, default=30, help="timed renders per case (default 30)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data_dir:
        # Before Django reads its settings: the SQLite file, the secret key and the static root all land here.
        os.environ["PANTHEON_DATA_DIR"] = data_dir
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")
        import django

        django.setup()
        from django.db import connection
        from django.test.utils import setup_databases, teardown_databases

        # A name of its own: Django's default test_<name> may be a test run's database at this very moment.
        connection.settings_dict["TEST"]["NAME"] = (
            f"pantheon_audit_bench_{os.getpid()}"
            if connection.vendor == "postgresql"
            else str(Path(data_dir) / "bench.sqlite3")
        )
        databases = setup_databases(verbosity=0, interactive=False)
        try:
            run(args.events, args.requests)
        finally:
            teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
