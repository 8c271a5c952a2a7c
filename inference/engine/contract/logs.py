"""How both sides log: one line format (plain text or JSON), and the HTTP request id on every line.

The control plane sets `request_id_var` for the life of each HTTP request (pantheon_site/request_ids.py), so any
logger called in that request's task or a thread it hands work to (asgiref copies the context) carries the id without
being told. A worker serves many requests in one loop, so its lines about a sequence pass the id explicitly
(`extra={"request_id": ...}`, from `Submit.http_request_id`; engine/sequence_log.py). `RequestIdFilter` fills the
record's `request_id` from the context only when the call did not. Django-free and torch-free: settings.LOGGING is
`logging_config(...)` and Django applies it with `configure` (LOGGING_CONFIG), as the worker process does
(`configure_worker_logging`). Python's warnings (a library's deprecation, say) go through the same handler, so with
JSON every line of the output is an object.

JSON lines are python-json-logger's formatter: one object per line with `time`, `level`, `logger`, `message`,
`request_id`, and whatever `extra` fields a call adds, except Django's `request` (an object, whose text would be the
full path with its query string).
"""

from __future__ import annotations

import logging
import logging.config
from contextvars import ContextVar

from pythonjsonlogger.core import RESERVED_ATTRS

LOG_FORMATS = ("plain", "json")
NO_REQUEST = "-"  # the request id of a line logged outside any request

request_id_var: ContextVar[str | None] = ContextVar("pantheon_request_id", default=None)

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s"
JSON_RENAMED = {"asctime": "time", "levelname": "level", "name": "logger"}
JSON_LEFT_OUT = [*RESERVED_ATTRS, "request"]


class RequestIdFilter(logging.Filter):
    """Gives every record a `request_id`: the one its call passed, else the current request's, else "-"."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get() or NO_REQUEST
        return True


def formatter_config(log_format: str) -> dict:
    """The `formatters` entry of a logging dictConfig for `log_format` ("plain" or "json")."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"the log format must be one of {LOG_FORMATS}, not {log_format!r}")
    if log_format == "json":
        return {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": JSON_FIELDS,
            "rename_fields": JSON_RENAMED,
            "reserved_attrs": JSON_LEFT_OUT,
        }
    return {"format": PLAIN_FORMAT}


def logging_config(log_format: str, level: str) -> dict:
    """A dictConfig: one stream (stderr) in `log_format`, every record carrying its request id."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"line": formatter_config(log_format)},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line", "filters": ["request_id"]}},
        "root": {"handlers": ["console"], "level": level},
    }


def configure(config: dict) -> None:
    """Applies a logging dictConfig and sends Python's warnings through it (settings.LOGGING_CONFIG names this)."""
    logging.config.dictConfig(config)
    logging.captureWarnings(True)


def configure_worker_logging(log_format: str, level: str) -> None:
    """A worker process's logging: the control plane's format and level (the supervisor passes them), on the
    stderr that `serve` shares, so `serve`'s output is one stream of one format."""
    configure(logging_config(log_format, level))
