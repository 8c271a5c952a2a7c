"""Fuzzing a running Pantheon against its own OpenAPI document (GET /api/schema/) with schemathesis: every route,
requests generated from the schema (valid and invalid), each answer checked for a server error and against the
document (status, content type, headers, body). Used by tests/inference/test_fuzz_api.py (bounded, in CI) and
bench/fuzz_api.py (the full run); no Django here, so the bench script imports it as it is.

schemathesis runs as its CLI (`schemathesis run`), its documented interface; the run's NDJSON report gives the
numbers. /session/watch is left out: its answer is an event stream that stays open while the session is held, so a
fuzzer's request would never end (tests/inference/test_session_watch.py covers it).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CONFIG = Path(__file__).with_name("schemathesis.toml")
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
NOT_FUZZED = ("/session/watch",)


@dataclass
class FuzzRun:
    """What a run did: requests sent by status, the failures schemathesis found (one line each), its exit code."""

    exit_code: int
    operations: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def summary(self) -> str:
        by_status = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        return (f"{self.operations} operations, {self.requests} requests ({by_status}); "
                f"{len(self.failures)} failures")  # fmt: skip


def fuzz(base_url: str, token: str, *, max_examples: int, seed: int | None = None) -> FuzzRun:
    """Runs schemathesis against `base_url`'s /api/schema/ with `token` (an operator's, so every route is reached)
    and up to `max_examples` generated cases per operation and phase. The token travels in the environment, and the
    report, which records the requests' headers, is deleted once read."""
    with tempfile.TemporaryDirectory(prefix="pantheon-fuzz-") as report_dir:
        report = Path(report_dir) / "events.ndjson"
        env = {**os.environ, "PANTHEON_FUZZ_TOKEN": token}
        command = _command(base_url, report, max_examples, seed)  # run in the temporary folder: it keeps a cache there
        done = subprocess.run(command, cwd=report_dir, env=env, capture_output=True, text=True)
        run = FuzzRun(exit_code=done.returncode, output=done.stdout + done.stderr)
        _read_report(report, run)
    return run


def _command(base_url: str, report: Path, max_examples: int, seed: int | None) -> list[str]:
    return [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file", str(CONFIG),
        "--no-color",
        "run", f"{base_url}/api/schema/",
        "--checks", ",".join(CHECKS),
        "--max-examples", str(max_examples),
        "--request-timeout", "120",
        "--report", "ndjson", "--report-ndjson-path", str(report),
        *[arg for path in NOT_FUZZED for arg in ("--exclude-path", path)],
        *(["--seed", str(seed)] if seed is not None else []),
    ]  # fmt: skip


def _read_report(report: Path, run: FuzzRun) -> None:
    """The statuses of every response and the failures, from the NDJSON events of the run."""
    operations = set()
    for line in report.read_text().splitlines():
        event = json.loads(line)
        for body in event.values():
            recorder = body.get("recorder") if isinstance(body, dict) else None
            if not recorder:
                continue
            operations.add(recorder.get("label"))
            for interaction in (recorder.get("interactions") or {}).values():
                if (response := interaction.get("response")) is not None:
                    run.statuses[response["status_code"]] += 1
            for checks in (recorder.get("checks") or {}).values():
                for check in checks:
                    if check.get("status") == "failure":
                        failure = check.get("failure_info", {}).get("failure", {})
                        run.failures.append(f"{recorder.get('label')}: {check['name']}: {failure.get('title')}")
    run.operations = len(operations - {None})


def still_serving(base_url: str) -> bool:
    """GET / answers 200: the server outlived the run."""
    return httpx.get(f"{base_url}/", timeout=30).status_code == 200
