"""Sending one batch line to the server and saying what its answer means for the batch: a result to record, or a
"wait" (the server cannot run it now, and says or implies when to try again; nothing is recorded).

No database here: the runner (batches/runner.py) counts the attempt before calling `send_line` and records what it
returns. Each line goes to the batch's endpoint as its own request, with the headers that make it batch work:
`X-Pantheon-Priority: batch` (interactive requests go first), `X-miLLM-Load-Policy: refuse` (a batch never loads a
model) and an `X-Request-ID` that names the batch, the line and the attempt."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from batches.line_records import MILLM_MODEL_HEADER, answer_line, error_line
from batches.server_target import ServerTarget

PRIORITY_HEADER = "X-Pantheon-Priority"
LOAD_POLICY_HEADER = "X-miLLM-Load-Policy"
REQUEST_ID_HEADER = "X-Request-ID"

# The error types of answers that mean "not now" rather than "this line failed", and the batch's waiting_reason for
# each. no_models_loaded is one: a server that just restarted has loaded nothing yet, and a batch waits for the
# operator's load rather than failing every line.
WAIT_REASONS = {
    (503, "weights_torn"): "weights_torn",
    (503, "weights_held"): "weights_held",
    (503, "model_reloading"): "model_reloading",
    (503, "no_models_loaded"): "no_models_loaded",
    (503, "service_unavailable"): "server_unavailable",
    (503, "server_shutting_down"): "server_unavailable",
    (503, "server_memory_constrained"): "server_unavailable",
    (429, "server_busy"): "server_busy",
}
SERVER_UNAVAILABLE = "server_unavailable"
UNAUTHORIZED = "server_refused_credential"


@dataclass(frozen=True, slots=True)
class LineResult:
    """An answer (or a refusal of the line itself) to record: `succeeded` puts it in the output file."""

    result: dict
    succeeded: bool


@dataclass(frozen=True, slots=True)
class Wait:
    """Not now: the batch's waiting_reason, how long the server asked to wait (None: it did not say), and whether
    the server must be looked up again (it stopped answering, or refused the credential of an older run)."""

    reason: str
    retry_after: float | None
    find_server_again: bool = False


def line_body(custom_id: str, raw: bytes) -> dict | LineResult:
    """The request body of an input line (its `body` object), or the line's error when it has none usable."""
    try:
        line = json.loads(raw)
    except ValueError:
        line = None
    body = line.get("body") if isinstance(line, dict) else None
    if not isinstance(body, dict):
        return LineResult(error_line(custom_id, "invalid_body", "the line's body is not a JSON object"), False)
    return body


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["Retry-After"]))
    except (KeyError, ValueError):
        return None


def _error_type(body) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("type", "")) if isinstance(error, dict) else ""


async def send_line(
    client: httpx.AsyncClient, server: ServerTarget, endpoint: str, custom_id: str, body: dict, request_id: str
) -> LineResult | Wait:
    """POSTs one line's body to `server`'s `endpoint`; the result to record, or a Wait."""
    headers = {PRIORITY_HEADER: "batch", LOAD_POLICY_HEADER: "refuse", REQUEST_ID_HEADER: request_id}
    if server.token:
        headers["Authorization"] = f"Bearer {server.token}"
    try:
        # a batch line's answer is one JSON object: a line asking to stream is answered whole
        body = {**body, "stream": False} if body.get("stream") else body
        response = await client.post(server.url + endpoint, json=body, headers=headers)
    except httpx.TransportError:  # refused, reset, timed out: no answer to record; the server is looked up again
        return Wait(SERVER_UNAVAILABLE, None, find_server_again=True)
    try:
        answer = response.json()
    except ValueError:
        answer = {"error": {"message": response.text[:1000], "type": "server_error", "code": None}}
    if response.status_code == 401:
        return Wait(UNAUTHORIZED, None, find_server_again=True)
    reason = WAIT_REASONS.get((response.status_code, _error_type(answer)))
    if reason is not None:
        return Wait(reason, _retry_after(response))
    result = answer_line(custom_id, response.status_code, response.headers.get(REQUEST_ID_HEADER, request_id),
                         response.headers.get(MILLM_MODEL_HEADER), answer)  # fmt: skip
    return LineResult(result, 200 <= response.status_code < 300)
