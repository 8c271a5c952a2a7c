"""Pantheon's settings, read from the environment and nowhere else.

With no environment at all Pantheon runs self-contained: an embedded SQLite file under PANTHEON_DATA_DIR, the
in-memory Channels layer, and a Celery broker in files there whose worker `serve` starts. DATABASE_URL (PostgreSQL
through psycopg 3) and REDIS_URL (Channels layer and Celery broker) switch to the production services. Every PANTHEON_*
setting below is also an environment variable of the same name; the defaults are the spec's.
"""

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _env_bytes_or_auto(name: str) -> int | None:
    """A byte count, or None when the variable is unset or "auto" (the engine chooses)."""
    raw = os.environ.get(name, "auto").strip().lower()
    return None if raw == "auto" else int(raw)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def _persistent_secret(path: Path) -> str:
    """A random key created once under the data folder, so token digests survive restarts without configuration.

    Written to a private temporary file and linked into place, so two processes starting at once agree on one key.
    """
    if not path.exists():
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        draft.write_text(secrets.token_urlsafe(48))
        draft.chmod(0o600)
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


# --- where Pantheon keeps its files -------------------------------------------------------------------------------

PANTHEON_DATA_DIR = Path(_env_str("PANTHEON_DATA_DIR", str(BASE_DIR / "var"))).resolve()
PANTHEON_DATA_DIR.mkdir(parents=True, exist_ok=True)
# Sockets, pid and port files of a running server (`serve` writes them, `load_model` finds the server through them).
PANTHEON_RUN_DIR = PANTHEON_DATA_DIR / "run"

# --- Django core --------------------------------------------------------------------------------------------------

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or _persistent_secret(PANTHEON_DATA_DIR / "secret_key")
# Key of the HMAC that stores access tokens; separate so that rotating SECRET_KEY need not revoke every token.
PANTHEON_TOKEN_HMAC_KEY = os.environ.get("PANTHEON_TOKEN_HMAC_KEY") or SECRET_KEY
DEBUG = _env_bool("PANTHEON_DEBUG", False)
ALLOWED_HOSTS = [h.strip() for h in _env_str("PANTHEON_ALLOWED_HOSTS", "*").split(",") if h.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "django_htmx",
    "pantheon_site",
    "inference",
    "weights",
    "batches",
    "admin_ui",
    "fleet",
]

# Sessions and auth are lazy (no query unless a view reads request.user), CSRF is checked only under /ui/ (every
# other route authenticates with a bearer token, never a cookie) and the staff check only runs there: /v1 stays free
# of database work.
MIDDLEWARE = [
    "pantheon_site.middleware.RequestIdMiddleware",
    "pantheon_site.request_metrics.RequestMetricsMiddleware",
    "pantheon_site.middleware.SecurityMiddleware",
    "admin_ui.middleware.UiSessionMiddleware",
    "admin_ui.middleware.UiCsrfMiddleware",
    "admin_ui.middleware.UiAuthenticationMiddleware",
    "pantheon_site.middleware.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "admin_ui.middleware.staff_only_middleware",
    "pantheon_site.middleware.ErrorEnvelopeMiddleware",
]

ROOT_URLCONF = "pantheon_site.urls"
ASGI_APPLICATION = "pantheon_site.asgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.csrf",
            ]
        },
    }
]

# The operator UI (admin_ui): cookie sessions for staff users, served under /ui/ with its static files.
LOGIN_URL = "/ui/login/"
LOGIN_REDIRECT_URL = "/ui/"
STATIC_URL = "/ui/static/"
STATIC_ROOT = PANTHEON_DATA_DIR / "static"
SESSION_COOKIE_PATH = "/ui/"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_PATH = "/ui/"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_bool("PANTHEON_UI_SECURE_COOKIES", False)
X_FRAME_OPTIONS = "DENY"
CSRF_FAILURE_VIEW = "pantheon_site.errors.csrf_failure"

# Every SQLite database, the embedded one or one a DATABASE_URL names: immediate transactions and a busy timeout let
# the server's request threads and a `manage.py` command take turns writing. A deferred transaction that has read
# cannot wait for another writer (SQLite refuses it at once, to avoid a deadlock), so "database is locked" would
# fail an audited request whenever another request wrote at the same moment.
_SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}
if os.environ.get("DATABASE_URL"):
    # No persistent connections: under ASGI each request may run its queries on another thread (Django docs).
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        DATABASES["default"]["OPTIONS"] = {**_SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": PANTHEON_DATA_DIR / "pantheon.sqlite3",
            # The test database is a file too (not in memory), so that a `serve` or `manage.py` subprocess started
            # by a test sees the same rows; the pid keeps concurrent test runs apart.
            "TEST": {"NAME": PANTHEON_DATA_DIR / f"test-{os.getpid()}.sqlite3"},
            "OPTIONS": _SQLITE_OPTIONS,
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
USE_I18N = False

# Chat prompts and session blobs can be large; the spec sets no limit of its own. A body over this is refused with
# 413 before the application reads it (pantheon_site/body_limit.py); Django's own check is kept at the same size.
PANTHEON_MAX_BODY_BYTES = _env_int("PANTHEON_MAX_BODY_BYTES", 64 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = PANTHEON_MAX_BODY_BYTES
# POST /session/restore with a raw application/octet-stream body (a session file: docs/api/sessions.md) has a limit
# of its own, since a session's KV outgrows any sensible limit on other bodies: the default is well above one full
# window's KV of a model served on one device (Qwen3-0.6B's 40,960 positions in float16 are 4.4 GiB).
PANTHEON_SESSION_RESTORE_MAX_BYTES = _env_int("PANTHEON_SESSION_RESTORE_MAX_BYTES", 16 * 1024**3)

# --- Channels, Celery ---------------------------------------------------------------------------------------------
# Batches and the periodic work run as Celery tasks, always in a Celery worker process and never eagerly in the
# caller: an eager task would run a whole batch inside the HTTP request that created it (docs/celery.md).

# The Celery files under the data folder: the beat schedule, and without REDIS_URL the broker's messages.
PANTHEON_CELERY_DIR = PANTHEON_DATA_DIR / "celery"
PANTHEON_CELERY_DIR.mkdir(exist_ok=True)
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
    CELERY_BROKER_URL = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # kombu's filesystem transport: one message per file under the data folder, so the embedded worker `serve`
    # starts and every process that sends a task (serve itself, a manage.py command) meet without a service. kombu
    # writes to data_folder_out and reads from data_folder_in; every process here both sends and reads with these
    # same settings, so the two are one folder. A message read is moved out and deleted (store_processed off: kept,
    # the files would pile up with nothing to prune them); the queue-to-exchange bindings live in the control folder.
    # One consumer only: more workers want Redis.
    _celery_queue_dir, _celery_control_dir = PANTHEON_CELERY_DIR / "queue", PANTHEON_CELERY_DIR / "control"
    for _folder in (_celery_queue_dir, _celery_control_dir):
        _folder.mkdir(exist_ok=True)  # kombu creates neither
    CELERY_BROKER_URL = "filesystem://localhost/"  # the host is ignored; without one kombu warns at every connection
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_celery_queue_dir),
        "data_folder_out": str(_celery_queue_dir),
        "store_processed": False,
        "control_folder": str(_celery_control_dir),
    }
    # Remote control (celery inspect/control) is a fanout: on this transport each caller's reply queue would stay
    # behind as files. The one embedded worker needs none: serve controls it with signals.
    CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_TASK_IGNORE_RESULT = True  # a batch's progress and results live in the database, not in a result backend
# A batch's task runs for as long as the batch: a worker takes a message only when a thread is free to run it, rather
# than holding messages another worker could start (and that its death would drop).
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True  # said explicitly: Celery warns at start when it is left unset
# The Celery worker's lines go through Django's LOGGING (PANTHEON_LOG_FORMAT, PANTHEON_LOG_LEVEL), like every other
# process of the platform, rather than through the root handler Celery would install.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Which tasks are due when, for the embedded beat and a production `celery beat` alike: a file under the data folder.
CELERY_BEAT_SCHEDULE_FILENAME = str(PANTHEON_CELERY_DIR / "beat-schedule")
# `serve` starts a Celery worker with embedded beat as a child process (docs/celery.md): by default exactly when
# there is no REDIS_URL, the embedded setup; with REDIS_URL operators run `celery worker` and `celery beat`.
PANTHEON_EMBEDDED_CELERY = _env_bool("PANTHEON_EMBEDDED_CELERY", not REDIS_URL)
# The embedded worker's threads: each running batch holds one for its whole run (its lines' HTTP calls wait on the
# server) and beat's short periodic tasks share them; while all are busy, new tasks wait in the queue.
PANTHEON_EMBEDDED_CELERY_CONCURRENCY = _env_int("PANTHEON_EMBEDDED_CELERY_CONCURRENCY", 4)

# --- Django REST framework: used for body validation, never for auth on /v1 ------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "pantheon_site.errors.drf_exception_handler",
}

# --- Pantheon: serving ------------------------------------------------------------------------------------------------

# Batched decode slots per model, and the FIFO queue in front of them (spec: 8 slots, depth 32, 30 s wait).
PANTHEON_BATCH_SLOTS = _env_int("PANTHEON_BATCH_SLOTS", 8)
PANTHEON_QUEUE_DEPTH = _env_int("PANTHEON_QUEUE_DEPTH", 32)
PANTHEON_QUEUE_WAIT_S = _env_float("PANTHEON_QUEUE_WAIT_S", 30.0)
# Prompt tokens per prefill chunk, so decode steps of other requests interleave with a long prefill.
PANTHEON_PREFILL_CHUNK = _env_int("PANTHEON_PREFILL_CHUNK", 128)
# A decode whose last this many tokens are one period repeated at least four times ends as repetition_loop (0: off).
PANTHEON_REPETITION_LOOP_TOKENS = _env_int("PANTHEON_REPETITION_LOOP_TOKENS", 256)
# Below this much free device memory a new generation is refused (503 server_memory_constrained); a load keeps it
# free too, lowering the context window when the configured one would not fit next to the weights.
PANTHEON_MIN_FREE_MEMORY_BYTES = _env_int("PANTHEON_MIN_FREE_MEMORY_BYTES", 256 * 1024 * 1024)
# On SIGTERM: how long generations in flight may run on (new requests get 503 server_shutting_down) before the
# workers stop.
PANTHEON_SHUTDOWN_DRAIN_TIMEOUT_S = _env_float("PANTHEON_SHUTDOWN_DRAIN_TIMEOUT_S", 30.0)
# The KV cache is a pool of blocks of this many positions per model: room for max_concurrent sequences at the full
# context window, always, plus the prefix cache, where finished prompts' KV stays for reuse: PANTHEON_PREFIX_CACHE_BYTES
# per model ("auto", the default: the smaller of 4 GiB and a quarter of the device's memory left free after the
# weights, the windows and PANTHEON_MIN_FREE_MEMORY_BYTES; 0: none beyond the windows; never more than fits).
PANTHEON_KV_BLOCK_SIZE = _env_int("PANTHEON_KV_BLOCK_SIZE", 16)
PANTHEON_PREFIX_CACHE_BYTES = _env_bytes_or_auto("PANTHEON_PREFIX_CACHE_BYTES")
if "PANTHEON_KV_POOL_TOKENS" in os.environ:
    raise ImproperlyConfigured(
        "PANTHEON_KV_POOL_TOKENS is gone: the prefix cache is sized in bytes by PANTHEON_PREFIX_CACHE_BYTES"
    )
# Sessions (`session_id` on a chat request) keep a conversation's KV between turns, up to max_sessions ids per model
# (the load's max_sessions, else its max_concurrent). Off: no model keeps sessions, a session key is ignored and the
# session routes answer session_caching_disabled.
PANTHEON_SESSIONS = _env_bool("PANTHEON_SESSIONS", True)
# Sessions: reaped after this long idle (12 h); released this long after their last watch closes (45 s).
PANTHEON_SESSION_IDLE_TTL_S = _env_float("PANTHEON_SESSION_IDLE_TTL_S", 12 * 3600.0)
PANTHEON_SESSION_WATCH_GRACE_S = _env_float("PANTHEON_SESSION_WATCH_GRACE_S", 45.0)
# GET /session/watch sends a keep-alive comment this often, so proxies and clients do not time the hold out.
PANTHEON_SESSION_WATCH_KEEPALIVE_S = _env_float("PANTHEON_SESSION_WATCH_KEEPALIVE_S", 15.0)
# At most this many watches are held at once (each is an open connection); one more is 503 watch_unavailable.
PANTHEON_SESSION_MAX_WATCHES = _env_int("PANTHEON_SESSION_MAX_WATCHES", 1024)
# How long an unload waits for generations in flight before it gives up with unload_failed.
PANTHEON_UNLOAD_DRAIN_TIMEOUT_S = _env_float("PANTHEON_UNLOAD_DRAIN_TIMEOUT_S", 60.0)
# /v1 is open unless this is set; then a client, trainer or operator token is required.
PANTHEON_REQUIRE_CLIENT_TOKENS = _env_bool("PANTHEON_REQUIRE_CLIENT_TOKENS", False)
# Which requests with tools are grammar-constrained: "" (default) tool_choice "required" and named functions, "1"
# also "auto" once a call opens, "0" none (spec: PANTHEON_TOOL_GRAMMAR).
PANTHEON_TOOL_GRAMMAR = _env_str("PANTHEON_TOOL_GRAMMAR", "").strip()
# A request without enable_thinking gets enable_thinking false when this is set, else its template's default.
PANTHEON_NO_THINK = _env_bool("PANTHEON_NO_THINK", False)

# --- Pantheon: worker processes ---------------------------------------------------------------------------------------

# Devices that get a worker: a comma-separated list such as "cpu,cuda:0"; empty means cpu plus every visible GPU.
PANTHEON_WORKER_DEVICES = [d.strip() for d in _env_str("PANTHEON_WORKER_DEVICES", "").split(",") if d.strip()]
# A dead worker is restarted after a backoff that doubles from the first value up to the second.
PANTHEON_WORKER_RESTART_BACKOFF_S = _env_float("PANTHEON_WORKER_RESTART_BACKOFF_S", 0.5)
PANTHEON_WORKER_RESTART_BACKOFF_MAX_S = _env_float("PANTHEON_WORKER_RESTART_BACKOFF_MAX_S", 30.0)
# How long a starting worker may take to report ready, and how long without a heartbeat before it counts as dead.
PANTHEON_WORKER_START_TIMEOUT_S = _env_float("PANTHEON_WORKER_START_TIMEOUT_S", 60.0)
PANTHEON_WORKER_HEARTBEAT_INTERVAL_S = _env_float("PANTHEON_WORKER_HEARTBEAT_INTERVAL_S", 1.0)
PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S = _env_float("PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S", 10.0)
# Retry-After seconds of each retryable refusal: queue full, queue wait over, memory pressure, shutting down, a model
# being reloaded after its worker crashed (the spec's values where it gives one).
PANTHEON_RETRY_AFTER_BUSY_S = _env_float("PANTHEON_RETRY_AFTER_BUSY_S", 5.0)
PANTHEON_RETRY_AFTER_QUEUE_TIMEOUT_S = _env_float("PANTHEON_RETRY_AFTER_QUEUE_TIMEOUT_S", 2.0)
PANTHEON_RETRY_AFTER_MEMORY_S = _env_float("PANTHEON_RETRY_AFTER_MEMORY_S", 5.0)
PANTHEON_RETRY_AFTER_SHUTDOWN_S = _env_float("PANTHEON_RETRY_AFTER_SHUTDOWN_S", 1.0)
PANTHEON_RETRY_AFTER_RELOAD_S = _env_float("PANTHEON_RETRY_AFTER_RELOAD_S", 5.0)
# ... and of a new session id refused because every session slot of the model is taken (spec: 30).
PANTHEON_RETRY_AFTER_SESSION_S = _env_float("PANTHEON_RETRY_AFTER_SESSION_S", 30.0)
# How long a load may take in the worker before the control plane reports load_failed.
PANTHEON_LOAD_TIMEOUT_S = _env_float("PANTHEON_LOAD_TIMEOUT_S", 600.0)

# The weights barrier (spec: "Weights: attachment and the step barrier", Timers; names kept from the spec): a quiesce
# left open resumes after WEIGHTS_HOLD_TIMEOUT_S; a commit open longer than WEIGHTS_COMMIT_WATCHDOG_MS tears the set;
# an attachment without a heartbeat for WEIGHTS_HEARTBEAT_TIMEOUT_S is stale; quiesce waits up to
# WEIGHTS_QUIESCE_DRAIN_TIMEOUT_S for running requests; attach suggests a heartbeat every
# WEIGHTS_HEARTBEAT_INTERVAL_HINT_S.
WEIGHTS_HOLD_TIMEOUT_S = _env_float("WEIGHTS_HOLD_TIMEOUT_S", 5.0)
WEIGHTS_COMMIT_WATCHDOG_MS = _env_float("WEIGHTS_COMMIT_WATCHDOG_MS", 800.0)
WEIGHTS_HEARTBEAT_TIMEOUT_S = _env_float("WEIGHTS_HEARTBEAT_TIMEOUT_S", 30.0)
WEIGHTS_QUIESCE_DRAIN_TIMEOUT_S = _env_float("WEIGHTS_QUIESCE_DRAIN_TIMEOUT_S", 60.0)
WEIGHTS_HEARTBEAT_INTERVAL_HINT_S = _env_float("WEIGHTS_HEARTBEAT_INTERVAL_HINT_S", 5.0)
# Where POST /api/weights/save writes checkpoints (<run_id>/step-<N>/).
PANTHEON_CHECKPOINT_DIR = Path(_env_str("PANTHEON_CHECKPOINT_DIR", str(PANTHEON_DATA_DIR / "checkpoints"))).resolve()
# How many /v1/responses responses the control plane keeps in memory for previous_response_id and GET (the most
# recently stored or used).
PANTHEON_RESPONSES_STORED = _env_int("PANTHEON_RESPONSES_STORED", 1024)

# --- security: rate limit per token ---------------------------------------------------------------------------------

# Calls per minute one access token may make (every route that takes a token: /v1 with client tokens, /admin,
# /session, /api/weights); over it, 429 rate_limited with Retry-After. 0 (default): no limit, as vLLM, llama.cpp's
# server and Ollama have none; counted in each serve process's memory (pantheon_site/rate_limit.py).
PANTHEON_RATE_LIMIT_PER_MINUTE = _env_int("PANTHEON_RATE_LIMIT_PER_MINUTE", 0)

# --- request ids and logs ---------------------------------------------------------------------------------------------
# One console stream (stderr, shared with the workers, which log in the same format and level), every line carrying
# its request's X-Request-ID (docs/logging.md). PANTHEON_LOG_FORMAT: "plain" lines or "json" objects, one per line.
# Tokens never reach a log line; prompt text (a generation's body) and a trainer's attachment id only with
# PANTHEON_LOG_SENSITIVE, a debug setting.
from inference.engine.contract.logs import logging_config  # noqa: E402 (Django-free: the workers configure with it too)

PANTHEON_LOG_LEVEL = _env_str("PANTHEON_LOG_LEVEL", "INFO").upper()
PANTHEON_LOG_FORMAT = _env_str("PANTHEON_LOG_FORMAT", "plain").lower()
PANTHEON_LOG_SENSITIVE = _env_bool("PANTHEON_LOG_SENSITIVE", False)
LOGGING = logging_config(PANTHEON_LOG_FORMAT, PANTHEON_LOG_LEVEL)
LOGGING_CONFIG = "inference.engine.contract.logs.configure"  # dictConfig, and Python's warnings through it

# --- Metrics ---------------------------------------------------------------------------------------------------------

# GET /metrics answers a scrape from a loopback address without a token (and without a database query); from any
# other address it needs an operator token, as it always does with this off (turn it off behind a local reverse proxy,
# which makes every client look local). docs/metrics.md
PANTHEON_METRICS_OPEN_ON_LOOPBACK = _env_bool("PANTHEON_METRICS_OPEN_ON_LOOPBACK", True)

# --- dashboard charts ---------------------------------------------------------------------------------------------

# How often `serve` samples its metrics into the dashboard's 15-minute history (inference/runtime/metrics_history.py);
# the charts' resolution, and how often the dashboard polls them.
PANTHEON_METRICS_HISTORY_INTERVAL_S = _env_float("PANTHEON_METRICS_HISTORY_INTERVAL_S", 5.0)

# --- OpenAPI schema (drf-spectacular; pantheon_site/openapi.py) ---
# The routes are plain async views: pantheon_site/openapi.py enumerates them from the URL conf and each app's
# openapi.py describes them. GET /api/schema/ serves the document, open like vLLM's /openapi.json (it is the
# contract a client may read, and docs/api/openapi.yaml holds the same text).
INSTALLED_APPS.append("drf_spectacular")
REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] = "drf_spectacular.openapi.AutoSchema"
SPECTACULAR_SETTINGS = {
    "TITLE": "Pantheon HTTP API",
    "DESCRIPTION": "The OpenAI-compatible routes (/v1), the operator routes (/admin), the session routes (/session), "
    "health (/), and the weights management routes (/api/weights). Generated from the code by drf-spectacular; "
    "docs/api/ explains the choices.",
    "VERSION": "1",
    "DEFAULT_GENERATOR_CLASS": "pantheon_site.openapi.RouteSchemaGenerator",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SORT_OPERATIONS": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
    "ENUM_NAME_OVERRIDES": {"TensorDtypeEnum": ["bfloat16", "float16", "float32"]},  # dtype and kv_dtype share it
    "APPEND_COMPONENTS": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "A Pantheon token"}}
    },
}

# --- faults survived (docs/reliability.md) ---
# Retry-After seconds of a 503 service_unavailable: a route that needs the database while it cannot be reached.
PANTHEON_RETRY_AFTER_UNAVAILABLE_S = _env_float("PANTHEON_RETRY_AFTER_UNAVAILABLE_S", 5.0)

# --- Files and Batch API (docs/api/batches.md) ---
# Where uploaded files and batches' output files are kept, one file per id (batches/files.py).
PANTHEON_FILES_DIR = Path(_env_str("PANTHEON_FILES_DIR", str(PANTHEON_DATA_DIR / "files"))).resolve()
# The largest file POST /v1/files takes, in bytes: OpenAI's batch input limit (200 MB). A multipart upload to /v1/files
# is let through the body limit up to this much (plus room for the form's other fields) instead of
# PANTHEON_MAX_BODY_BYTES (pantheon_site/body_limit.py).
PANTHEON_FILE_MAX_BYTES = _env_int("PANTHEON_FILE_MAX_BYTES", 200 * 1024 * 1024)
# The most requests (non-empty lines) one batch's input file may hold: OpenAI's limit. A larger file makes the batch
# fail with too_many_tasks.
PANTHEON_BATCH_MAX_LINES = _env_int("PANTHEON_BATCH_MAX_LINES", 50_000)

# --- periodic work on Celery beat (docs/periodic.md) ---
# How often each periodic task runs, in seconds. Token expiry: how late a token_expired event may be written.
PANTHEON_TOKEN_EXPIRY_INTERVAL_S = _env_float("PANTHEON_TOKEN_EXPIRY_INTERVAL_S", 60.0)
# Stale workers: how often worker rows a dead serve left are looked for.
PANTHEON_STALE_WORKER_INTERVAL_S = _env_float("PANTHEON_STALE_WORKER_INTERVAL_S", 30.0)
# A starting or ready worker row no running serve rewrote for this long is marked dead. A running serve rewrites
# its rows every 10 s (inference/runtime/control_plane.py), so this must exceed 11 s; the margin covers a serve
# briefly unable to reach the database.
PANTHEON_WORKER_STALE_AFTER_S = _env_float("PANTHEON_WORKER_STALE_AFTER_S", 120.0)
# Expired files: how often they are pruned (row and content).
PANTHEON_FILE_PRUNE_INTERVAL_S = _env_float("PANTHEON_FILE_PRUNE_INTERVAL_S", 600.0)
# A file under PANTHEON_FILES_DIR that no row names is removed by the prune once nothing has written it for this long
# (what a crash left); the grace spares an upload or a batch's files being written at that moment.
PANTHEON_FILE_ORPHAN_GRACE_S = _env_float("PANTHEON_FILE_ORPHAN_GRACE_S", 3600.0)
# A batch's output and error files expire this many days after they are written, as OpenAI's do (0: kept).
PANTHEON_BATCH_OUTPUT_RETENTION_DAYS = _env_float("PANTHEON_BATCH_OUTPUT_RETENTION_DAYS", 30.0)
# Audit events older than this many days are pruned, the pruning itself audited (0: never delete any).
PANTHEON_AUDIT_RETENTION_DAYS = _env_float("PANTHEON_AUDIT_RETENTION_DAYS", 0.0)
# Audit retention: how often the prune runs (it does nothing while the retention is 0).
PANTHEON_AUDIT_PRUNE_INTERVAL_S = _env_float("PANTHEON_AUDIT_PRUNE_INTERVAL_S", 3600.0)
# Batches (batches/tasks.py, the runner's): how often a batch whose Celery task is gone is started again (a task that
# died holds its lease at most PANTHEON_BATCH_LEASE_S), and how often batches past their window are ended.
PANTHEON_BATCH_RESUME_INTERVAL_S = _env_float("PANTHEON_BATCH_RESUME_INTERVAL_S", 30.0)
PANTHEON_BATCH_EXPIRE_INTERVAL_S = _env_float("PANTHEON_BATCH_EXPIRE_INTERVAL_S", 60.0)
# Each run expires after one interval: runs missed while no Celery worker was up are not all replayed at once.
CELERY_BEAT_SCHEDULE = {
    name: {"task": task, "schedule": every, "options": {"expires": every}}
    for name, task, every in [
        ("record-expired-tokens", "pantheon_site.record_expired_tokens", PANTHEON_TOKEN_EXPIRY_INTERVAL_S),
        ("mark-stale-workers", "inference.mark_stale_workers", PANTHEON_STALE_WORKER_INTERVAL_S),
        ("prune-expired-files", "batches.prune_expired_files", PANTHEON_FILE_PRUNE_INTERVAL_S),
        ("prune-audit-log", "pantheon_site.prune_audit_log", PANTHEON_AUDIT_PRUNE_INTERVAL_S),
        ("resume-batches", "batches.resume_batches", PANTHEON_BATCH_RESUME_INTERVAL_S),
        ("expire-batches", "batches.expire_batches", PANTHEON_BATCH_EXPIRE_INTERVAL_S),
    ]
}

# --- batch priority (the Batch API's lines yield to interactive requests; docs/batch-priority.md) ---
# The share of a model's slots (max_concurrent) that requests sent with X-Pantheon-Priority: batch may hold at once,
# rounded down but at least one slot: the rest stay free for interactive requests, whatever a batch queues.
PANTHEON_BATCH_SLOT_SHARE = _env_float("PANTHEON_BATCH_SLOT_SHARE", 0.5)
if not 0 < PANTHEON_BATCH_SLOT_SHARE <= 1:
    raise ImproperlyConfigured(
        f"PANTHEON_BATCH_SLOT_SHARE must be in (0, 1], a share of a model's slots; got {PANTHEON_BATCH_SLOT_SHARE}"
    )

# --- batch execution (docs/batches.md) ---
# Seconds a batch's lease lasts unless renewed: a batch whose Celery worker died is taken over this long after.
PANTHEON_BATCH_LEASE_S = _env_float("PANTHEON_BATCH_LEASE_S", 60.0)
# Lines of one batch sent to the server at once, so the engine can batch them.
PANTHEON_BATCH_LINES_IN_FLIGHT = _env_int("PANTHEON_BATCH_LINES_IN_FLIGHT", 4)
# The longest a batch waits after a "wait" answer before trying again, whatever Retry-After says.
PANTHEON_BATCH_WAIT_MAX_S = _env_float("PANTHEON_BATCH_WAIT_MAX_S", 30.0)
# Seconds one line may take on the server before it is given up and sent again.
PANTHEON_BATCH_LINE_TIMEOUT_S = _env_float("PANTHEON_BATCH_LINE_TIMEOUT_S", 600.0)
# The server a Celery worker on another host sends lines to, and the token it presents; unset, the worker finds
# the server of its own host through the run file and presents the run's local credential.
PANTHEON_SERVER_URL = _env_str("PANTHEON_SERVER_URL", "").rstrip("/")
PANTHEON_SERVER_TOKEN = _env_str("PANTHEON_SERVER_TOKEN", "")
# A batch's task runs for hours: its message is acknowledged when it ends (a worker that dies mid-batch leaves it to
# be delivered again), and a worker process killed under a task requeues it (one message at a time and retrying the
# broker at start: the Celery block above).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A running batch needs no broker, so losing it does not cancel the batch's task (its lease, not the message, says
# who runs a batch).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False

# --- the fleet: registration with a router, and the router (docs/fleet.md) ---
# The router a `serve` registers its models with and heartbeats to; unset, serve registers nowhere (unchanged).
PANTHEON_REGISTRY_URL = _env_str("PANTHEON_REGISTRY_URL", "").strip().rstrip("/")
# What an instance reports of where it runs: its node and transport (hints for the router, shown by it).
PANTHEON_NODE_ID = _env_str("PANTHEON_NODE_ID", "node0")
PANTHEON_REGISTRY_TRANSPORT = _env_str("PANTHEON_REGISTRY_TRANSPORT", "local")
# How often an instance reports its live load; a router drops an instance it has not heard from for the timeout.
PANTHEON_REGISTRY_HEARTBEAT_S = _env_float("PANTHEON_REGISTRY_HEARTBEAT_S", 5.0)
PANTHEON_REGISTRY_TIMEOUT_S = _env_float("PANTHEON_REGISTRY_TIMEOUT_S", 15.0)
if not 0 < PANTHEON_REGISTRY_HEARTBEAT_S < PANTHEON_REGISTRY_TIMEOUT_S:
    raise ImproperlyConfigured(
        "PANTHEON_REGISTRY_HEARTBEAT_S must be above 0 and below PANTHEON_REGISTRY_TIMEOUT_S, or every instance would "
        f"be dropped between heartbeats; got {PANTHEON_REGISTRY_HEARTBEAT_S} and {PANTHEON_REGISTRY_TIMEOUT_S}"
    )
# The secret router and instances present to each other (compared in constant time, never logged). Empty: the
# router refuses every registration, and instances take no request as the router's.
PANTHEON_FLEET_TOKEN = _env_str("PANTHEON_FLEET_TOKEN", "")
# Where routers keep the registry so that several agree (default REDIS_URL); empty: in the router's memory (one
# router only).
PANTHEON_FLEET_REDIS_URL = _env_str("PANTHEON_FLEET_REDIS_URL", REDIS_URL).strip()
# The endpoint an instance advertises (default: http://host:port of serve), for a router that reaches it elsewhere.
PANTHEON_PUBLIC_URL = _env_str("PANTHEON_PUBLIC_URL", "").strip().rstrip("/")

# --- the router's routing policy: session affinity and cache-aware routing (fleet/routing.py; docs/fleet.md) ---
# cache_aware (the longest cached prefix, balanced against load) or least_busy (load alone). Sessions stick either way.
PANTHEON_ROUTER_POLICY = _env_str("PANTHEON_ROUTER_POLICY", "cache_aware")
if PANTHEON_ROUTER_POLICY not in ("cache_aware", "least_busy"):
    raise ImproperlyConfigured(
        f"PANTHEON_ROUTER_POLICY must be cache_aware or least_busy; got {PANTHEON_ROUTER_POLICY}"
    )
# The share of a prompt an instance must hold as a prefix for cache-aware routing to prefer it over the least busy.
PANTHEON_ROUTER_PREFIX_THRESHOLD = _env_float("PANTHEON_ROUTER_PREFIX_THRESHOLD", 0.3)
# Load is imbalanced, and cache-aware routing sends to the least busy, when the busiest instance has more than this
# many requests over the idlest AND more than PANTHEON_ROUTER_BALANCE_RATIO times as many.
PANTHEON_ROUTER_BALANCE_ABS = _env_int("PANTHEON_ROUTER_BALANCE_ABS", 64)
PANTHEON_ROUTER_BALANCE_RATIO = _env_float("PANTHEON_ROUTER_BALANCE_RATIO", 1.5)
# Prompt chunk hashes a router keeps per instance of what it routed there (least recently routed dropped first).
PANTHEON_ROUTER_PREFIX_CAPACITY = _env_int("PANTHEON_ROUTER_PREFIX_CAPACITY", 65536)
# How long a router keeps a session's instance and its last export after its last turn: by default as long as an
# instance keeps an idle session.
PANTHEON_ROUTER_SESSION_TTL_S = _env_float("PANTHEON_ROUTER_SESSION_TTL_S", PANTHEON_SESSION_IDLE_TTL_S)
# The largest session file a router keeps from an export that passes through it, to restore the session elsewhere.
PANTHEON_ROUTER_EXPORT_MAX_BYTES = _env_int("PANTHEON_ROUTER_EXPORT_MAX_BYTES", 256 * 1024**2)
# A serve instance that registers with a router reports this many chunk hashes of the prompts it served (0: none).
PANTHEON_FLEET_PREFIX_REPORT = _env_int("PANTHEON_FLEET_PREFIX_REPORT", 2048)
