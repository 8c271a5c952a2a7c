"""Settings come from the environment: embedded defaults without it, services when DATABASE_URL or REDIS_URL is set.
Celery never runs a task eagerly in its caller: without REDIS_URL its broker is a folder under the data folder, whose
worker serve starts (PANTHEON_EMBEDDED_CELERY); with it, Redis, and serve starts none."""

import json
import os
import subprocess
import sys
from pathlib import Path

from channels.layers import get_channel_layer

REPO_ROOT = Path(__file__).resolve().parent.parent
_PRINT_SETTINGS = """
import json, django
from django.conf import settings
django.setup()
print(json.dumps({
    "db": {k: str(v) for k, v in settings.DATABASES["default"].items() if k in ("ENGINE", "NAME", "HOST", "PORT")},
    "layer": settings.CHANNEL_LAYERS["default"]["BACKEND"],
    "broker": settings.CELERY_BROKER_URL,
    "eager": getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False),
    "broker_options": getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}),
    "beat_schedule_file": settings.CELERY_BEAT_SCHEDULE_FILENAME,
    "embedded_celery": settings.PANTHEON_EMBEDDED_CELERY,
    "data_dir": str(settings.PANTHEON_DATA_DIR),
    "queue_depth": settings.PANTHEON_QUEUE_DEPTH,
    "queue_wait": settings.PANTHEON_QUEUE_WAIT_S,
    "idle_ttl": settings.PANTHEON_SESSION_IDLE_TTL_S,
    "watch_grace": settings.PANTHEON_SESSION_WATCH_GRACE_S,
    "prefill_chunk": settings.PANTHEON_PREFILL_CHUNK,
    "batch_slots": settings.PANTHEON_BATCH_SLOTS,
    "client_tokens": settings.PANTHEON_REQUIRE_CLIENT_TOKENS,
    "secret_key": settings.SECRET_KEY,
}))
"""


def settings_under(env: dict) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PANTHEON_", "DATABASE_URL", "REDIS_URL"))}
    clean["DJANGO_SETTINGS_MODULE"] = "pantheon_site.settings"
    done = subprocess.run(
        [sys.executable, "-c", _PRINT_SETTINGS], cwd=REPO_ROOT, env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_environment_means_embedded_sqlite_memory_layer_and_spec_defaults(tmp_path):
    seen = settings_under({"PANTHEON_DATA_DIR": str(tmp_path)})
    assert seen["db"]["ENGINE"] == "django.db.backends.sqlite3"
    assert seen["db"]["NAME"] == str(tmp_path / "pantheon.sqlite3")
    assert seen["layer"] == "channels.layers.InMemoryChannelLayer"
    assert seen["broker"].startswith("filesystem://") and seen["eager"] is False and seen["embedded_celery"] is True
    queue = tmp_path / "celery" / "queue"
    assert seen["broker_options"]["data_folder_in"] == seen["broker_options"]["data_folder_out"] == str(queue)
    assert queue.is_dir() and Path(seen["broker_options"]["control_folder"]).is_dir()
    assert seen["beat_schedule_file"] == str(tmp_path / "celery" / "beat-schedule")
    assert (seen["queue_depth"], seen["queue_wait"], seen["prefill_chunk"], seen["batch_slots"]) == (32, 30.0, 128, 8)
    assert (seen["idle_ttl"], seen["watch_grace"], seen["client_tokens"]) == (12 * 3600.0, 45.0, False)
    # the generated secret key is stored in the data folder and reused by the next process
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0
    assert settings_under({"PANTHEON_DATA_DIR": str(tmp_path)})["secret_key"] == seen["secret_key"]


def test_service_urls_and_overrides_switch_the_backends(tmp_path):
    seen = settings_under(
        {
            "PANTHEON_DATA_DIR": str(tmp_path),
            "DATABASE_URL": "postgres://pantheon@db.example:6543/pantheon",
            "REDIS_URL": "redis://cache.example:6379/2",
            "PANTHEON_QUEUE_DEPTH": "7",
            "PANTHEON_REQUIRE_CLIENT_TOKENS": "true",
        }
    )
    assert seen["db"] == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "pantheon",
        "HOST": "db.example",
        "PORT": "6543",
    }
    assert seen["layer"] == "channels_redis.core.RedisChannelLayer"
    assert seen["broker"] == "redis://cache.example:6379/2" and seen["eager"] is False
    assert seen["embedded_celery"] is False  # operators run `celery worker` and `celery beat` themselves
    assert seen["queue_depth"] == 7 and seen["client_tokens"] is True


async def test_the_configured_channel_layer_carries_messages():
    # In-memory without REDIS_URL; the real Redis server when it is set (as in CI).
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "probe", "n": 1})
    assert await layer.receive(channel) == {"type": "probe", "n": 1}
    expected = "RedisChannelLayer" if os.environ.get("REDIS_URL") else "InMemoryChannelLayer"
    assert type(layer).__name__ == expected


_AUDIT_WHILE_ANOTHER_WRITES = """
import sqlite3, sys, threading, time, django
from django.conf import settings
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from pantheon_site.audit import record_audit_event
record_audit_event("model_list", "accepted", actor_kind="system")  # the chain head exists: the next one reads first
writer = sqlite3.connect(settings.DATABASES["default"]["NAME"], isolation_level=None, check_same_thread=False)
writer.execute("BEGIN IMMEDIATE")  # another connection holds the write lock, as a concurrent request's write does
threading.Thread(target=lambda: (time.sleep(1), writer.execute("COMMIT"))).start()
record_audit_event("model_list", "accepted", actor_kind="system")
print("recorded")
"""


def test_an_audited_write_waits_for_another_sqlite_writer(tmp_path):
    """On SQLite, named by DATABASE_URL (as tests and `serve` subprocesses name theirs) or embedded, an audit event
    written while another connection holds the write lock waits for it rather than failing "database is locked"."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PANTHEON_", "DATABASE_URL", "REDIS_URL"))}
    base = {**clean, "DJANGO_SETTINGS_MODULE": "pantheon_site.settings", "PANTHEON_DATA_DIR": str(tmp_path)}
    for env in ({"DATABASE_URL": f"sqlite:///{tmp_path / 'named.sqlite3'}"}, {}):
        done = subprocess.run(
            [sys.executable, "-c", _AUDIT_WHILE_ANOTHER_WRITES], cwd=REPO_ROOT, env={**base, **env},
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip() == "recorded", (env, done.stderr[-2000:])
