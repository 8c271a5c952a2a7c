"""The log lines both sides write (inference/engine/contract/logs.py), as a worker process configures them: in a
fresh interpreter, to its stderr. Each line carries the request id of the request it was logged in (the context),
or the one the call passed (a worker's line about a sequence), or "-"; plain or JSON as asked, Python's warnings
included."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, sys, warnings
from inference.engine.contract.logs import configure_worker_logging, request_id_var

configure_worker_logging(sys.argv[1], "INFO")
log = logging.getLogger("pantheon.test")
log.info("outside any request")
request_id_var.set("rid-context")
log.info("in a request")
log.info("about a sequence", extra={"request_id": "rid-explicit", "sequence": "chatcmpl-1"})
log.debug("below the level")
warnings.warn("a library's warning")
"""


def log_lines(log_format: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", SCRIPT, log_format], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_plain_lines_carry_the_request_id_in_brackets():
    lines = log_lines("plain")
    assert [line.split(" ", 2)[2] for line in lines if line][:3] == [
        "INFO pantheon.test [-]: outside any request",
        "INFO pantheon.test [rid-context]: in a request",
        "INFO pantheon.test [rid-explicit]: about a sequence",
    ]
    assert lines[3].split(" ", 2)[2].startswith("WARNING py.warnings [rid-context]: ")
    assert lines[3].endswith("UserWarning: a library's warning")


def test_json_lines_are_one_object_each_with_the_request_id_and_the_calls_fields():
    records = [json.loads(line) for line in log_lines("json")]
    assert [(r["level"], r["logger"], r["message"], r["request_id"]) for r in records[:3]] == [
        ("INFO", "pantheon.test", "outside any request", "-"),
        ("INFO", "pantheon.test", "in a request", "rid-context"),
        ("INFO", "pantheon.test", "about a sequence", "rid-explicit"),
    ]
    [warning] = records[3:]  # a warning is one JSON line too
    assert (warning["level"], warning["logger"], warning["request_id"]) == ("WARNING", "py.warnings", "rid-context")
    assert "UserWarning: a library's warning" in warning["message"]
    assert records[2]["sequence"] == "chatcmpl-1" and "time" in records[0]


def test_an_unknown_format_is_refused():
    with pytest.raises(subprocess.CalledProcessError) as refused:
        subprocess.run([sys.executable, "-c", SCRIPT, "xml"], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=60, check=True)  # fmt: skip
    assert "the log format must be one of ('plain', 'json'), not 'xml'" in refused.value.stderr
