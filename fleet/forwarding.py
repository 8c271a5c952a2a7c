"""Forwarding one /v1 request to the live instance the routing policy picks, and its answer back as it arrives.

The body is read whole (Django has read it before a view runs, and the `model` in it picks the instances); the answer
is streamed: an SSE answer is passed on event by event as the instance sends it (whole events only, so a stream that
breaks never leaves half an event before its error), any other answer is read whole and sent with the instance's
status. The client's headers go with the request (its Authorization among them: the instance checks the client's
token), with the request's X-Request-ID, so both processes' log lines carry the same id, and the fleet token in
X-Pantheon-Fleet-Token.

Failures, never a hang:
- a connection that cannot be made (the instance died since its last heartbeat) drops the instance from the registry
  and is tried once more on another live instance; with none left, 503 no_live_instance;
- an instance that fails after the connection was made (killed, its connection broken) makes a stream end with a
  terminal error event in the instance's own format (`data: {"error": ...}`; for /v1/responses an `error` event) and
  any other request answer 502 instance_failed;
- an instance that goes silent without closing its connection is caught by the registry: while waiting on it, the
  router looks every PANTHEON_REGISTRY_HEARTBEAT_S whether it is still live, and treats it as failed once it is not.
A client that disconnects makes Django cancel the response; leaving the stream closes the connection to the instance,
which aborts the generation there (inference/api/completion_bodies.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse

from fleet import session_relay
from fleet.contract import Choice, RouteRequest
from fleet.prefix_hashes import prefix_text
from fleet.router import FleetRouter
from pantheon_site.errors import (
    InstanceFailed,
    InvalidRequest,
    ModelNotFound,
    NoLiveInstance,
    ServiceUnavailable,
    openai_error_body,
)
from pantheon_site.fleet_credential import FLEET_TOKEN_HEADER
from pantheon_site.request_ids import REQUEST_ID_HEADER

INSTANCE_HEADER = "X-Pantheon-Instance"  # on every forwarded answer: the instance id that answered
ROUTE_HEADER = "X-Pantheon-Route"  # and why the policy chose it: session, rehome, prefix or least_busy
# Neither forwarded nor passed back: they describe one connection, not the request (RFC 9110 7.6.1), or are set anew.
_NOT_PASSED = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
     "upgrade", "host", "content-length", FLEET_TOKEN_HEADER.lower(), REQUEST_ID_HEADER.lower(), "server", "date"}
)  # fmt: skip
_CACHED_TOKENS = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')
_DONE = b"data: [DONE]"


class InstanceLost(Exception):
    """The instance a forward waits on is no longer live in the registry."""


async def forward(router: FleetRouter, request, path: str) -> HttpResponse:
    """Forwards the request for /`path` (POST, a JSON body naming a model) and returns the instance's answer."""
    body = _json_body(request.body)
    route = route_request(body, request.headers)
    live = await router.live()
    model_id = route.model_id or _only_model(live)
    route.model_id = model_id
    candidates = [record for record in live if record.report.model_id == model_id]
    if not candidates:
        raise NoLiveInstance(f"no live instance serves the model {model_id!r}", retry_after=_heartbeat_s())
    for _ in range(2):  # a connection refused is tried once more, on another instance
        choice = await router.policy.choose(route, candidates)
        instance_id = choice.instance.report.instance_id
        router.policy.begin(choice)
        if choice.restore_file is not None:  # a re-homed session: its last export first (fleet/session_relay.py)
            await session_relay.restore(router, route, choice, request)
        try:
            sent = router.client.send(_upstream_request(router, request, path, choice), stream=True)
            upstream = await _watched(router, instance_id, sent)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            router.policy.end(choice)
            await router.unreachable(instance_id)
            candidates = [record for record in candidates if record.report.instance_id != instance_id]
            if not candidates:
                break
            continue
        except (httpx.HTTPError, InstanceLost) as exc:
            router.policy.end(choice)
            raise InstanceFailed(f"the instance {instance_id} failed before it answered ({_why(exc)})") from None
        except BaseException:
            router.policy.end(choice)
            raise
        return await _answer(router, route, choice, upstream, path)
    raise NoLiveInstance(f"no live instance of the model {model_id!r} could be reached", retry_after=_heartbeat_s())


def route_request(body: dict[str, Any], headers) -> RouteRequest:
    """What the routing policy is asked about a request: its model, its session key (the body's, else the
    X-Session-Id header; as the instance reads it) and its prompt as one text (for cache-aware choice)."""
    model = body.get("model")
    session = next((body[k] for k in ("session_id", "prompt_cache_key", "promptCacheKey") if body.get(k)), None)
    session = session or headers.get("X-Session-Id") or None
    return RouteRequest(
        model_id=model if isinstance(model, str) else "",
        session_key=session if isinstance(session, str) else None,
        prefix_text=prefix_text(body),
    )


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        raise InvalidRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _only_model(live) -> str:
    """A request that names no model goes to the one model the fleet serves (as one instance does with one)."""
    models = {record.report.model_id for record in live}
    if len(models) == 1:
        return models.pop()
    if not models:
        raise NoLiveInstance("no live instance serves any model", retry_after=_heartbeat_s())
    raise ModelNotFound("several models are served; name one in `model`")


def _heartbeat_s() -> float:
    return settings.PANTHEON_REGISTRY_HEARTBEAT_S


def _why(exc: BaseException) -> str:
    return "it is no longer live" if isinstance(exc, InstanceLost) else (str(exc) or type(exc).__name__)


def _upstream_request(router: FleetRouter, request, path: str, choice: Choice) -> httpx.Request:
    headers = {name: value for name, value in request.headers.items() if name.lower() not in _NOT_PASSED}
    headers[REQUEST_ID_HEADER] = request.request_id
    if settings.PANTHEON_FLEET_TOKEN:
        headers[FLEET_TOKEN_HEADER] = settings.PANTHEON_FLEET_TOKEN
    if client := request.META.get("REMOTE_ADDR"):
        earlier = headers.pop("X-Forwarded-For", "")  # a proxy in front of the router: this hop is appended
        headers["X-Forwarded-For"] = f"{earlier}, {client}" if earlier else client
    url = f"{choice.instance.report.endpoint}/{path}"
    return router.client.build_request(request.method, url, params=request.GET, content=request.body, headers=headers)


async def _watched(router: FleetRouter, instance_id: str, awaitable: Awaitable):
    """Awaits `awaitable` (a send or a read from the instance), raising InstanceLost should the instance stop being
    live meanwhile: a connection that went silent without closing never holds a client forever."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_heartbeat_s())
            if done:
                return task.result()
            try:
                alive = await router.is_live(instance_id)
            except ServiceUnavailable:  # the registry cannot say: the connection still tells of a death
                alive = True
            if not alive:
                raise InstanceLost(instance_id)
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


def _passed_headers(upstream: httpx.Response, choice: Choice) -> dict[str, str]:
    headers = {name: value for name, value in upstream.headers.items() if name.lower() not in _NOT_PASSED}
    headers[INSTANCE_HEADER] = choice.instance.report.instance_id
    headers[ROUTE_HEADER] = choice.why
    return headers


async def _answer(router: FleetRouter, route: RouteRequest, choice: Choice, upstream: httpx.Response, path: str):
    """The instance answered (its status and headers are in): an SSE answer is relayed as it comes, any other read
    whole (a failure then is still a status of its own, 502)."""
    headers = _passed_headers(upstream, choice)
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        events = _relay(router, route, choice, upstream, responses=path.startswith("v1/responses"))
        return StreamingHttpResponse(events, status=upstream.status_code, headers=headers)
    instance_id = choice.instance.report.instance_id
    try:
        content = await _watched(router, instance_id, _read_all(upstream))
    except (httpx.HTTPError, InstanceLost) as exc:
        raise InstanceFailed(f"the instance {instance_id} failed while answering ({_why(exc)})") from None
    finally:
        await upstream.aclose()
        router.policy.end(choice)
    await router.policy.served(route, choice, cached_tokens=_cached_tokens(content))
    return HttpResponse(content, status=upstream.status_code, headers=headers)


async def _read_all(upstream: httpx.Response) -> bytes:
    return b"".join([chunk async for chunk in upstream.aiter_raw()])


async def _relay(router: FleetRouter, route: RouteRequest, choice: Choice, upstream: httpx.Response, *,
                 responses: bool) -> AsyncIterator[bytes]:  # fmt: skip
    """The instance's events as they arrive, each whole; a failure ends the stream with one error event."""
    instance_id = choice.instance.report.instance_id
    chunks = upstream.aiter_raw()
    pending, last, events = b"", b"", 0
    try:
        while True:
            try:
                chunk = await _watched(router, instance_id, anext(chunks, None))
            except (httpx.HTTPError, InstanceLost) as exc:
                if _DONE not in last:
                    error = InstanceFailed(f"the instance {instance_id} failed during the stream ({_why(exc)})")
                    yield _error_event(error, responses=responses, sequence_number=events)
                return
            if chunk is None:
                break
            pending += chunk
            cut = pending.rfind(b"\n\n") + 2
            if cut > 1:
                last, pending = pending[:cut], pending[cut:]
                events += last.count(b"\n\n")
                yield last
        if pending:
            yield pending
    finally:
        await upstream.aclose()
        router.policy.end(choice)
    await router.policy.served(route, choice, cached_tokens=_cached_tokens(last))


def _error_event(error: InstanceFailed, *, responses: bool, sequence_number: int) -> bytes:
    """The terminal event of a stream the instance broke, as the instance itself sends one for a failed stream
    (inference/api/completion_bodies.py error_event; inference/api/responses.py's `error` event)."""
    if responses:
        data = {"type": "error", "sequence_number": sequence_number, "code": error.type, "message": error.message,
                "param": None}  # fmt: skip
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    return b"data: " + json.dumps(openai_error_body(error, streaming=True)).encode() + b"\n\n"


def _cached_tokens(content: bytes) -> int | None:
    """The answer's usage.prompt_tokens_details.cached_tokens (the last one a stream's final events carry)."""
    found = _CACHED_TOKENS.findall(content)
    return int(found[-1]) if found else None
