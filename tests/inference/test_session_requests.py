"""The control plane's side of sessions, without a worker: the session key of a chat request and its checks, the
session routes' bodies and queries, the reasons' HTTP mapping, the limits a load sends, usage's session_conflict,
and the estimate's arithmetic."""

import asyncio
import base64
import json

import pytest
from django.test import override_settings

from inference.api.chat_requests import parse_chat_request
from inference.api.completion_bodies import usage_body
from inference.api.session_requests import (
    parse_estimate_query,
    parse_restore_request,
    parse_session_query,
    parse_session_target,
)
from inference.engine.contract import messages as p
from inference.engine.contract.params import LoadOptions
from inference.engine.contract.reasons import Reason
from inference.runtime.engine_client import ZmqEngineClient
from inference.runtime.generation import EngineError, Generation
from inference.runtime.router import ModelRouter
from inference.services.model_lifecycle import serving_limits
from inference.services.refusals import as_api_error
from inference.services.sessions import estimate, session_model
from pantheon_site.errors import BadSessionBlob, InvalidRequest, ModelNotFound

HELLO = [{"role": "user", "content": "hello"}]


def chat(headers=None, **fields):
    return parse_chat_request(json.dumps({"messages": HELLO, **fields}).encode(), headers)


@pytest.mark.parametrize(
    ("fields", "headers", "expected"),
    [
        ({}, None, None),
        ({}, {}, None),
        ({}, {"X-Session-Id": "h"}, "h"),
        ({"promptCacheKey": "c"}, {"X-Session-Id": "h"}, "c"),
        ({"prompt_cache_key": "o", "promptCacheKey": "c"}, {"X-Session-Id": "h"}, "o"),
        ({"session_id": "s", "prompt_cache_key": "o", "promptCacheKey": "c"}, {"X-Session-Id": "h"}, "s"),
        ({"session_id": None, "prompt_cache_key": "o"}, None, "o"),
        ({"session_id": "s"}, {"X-Session-Id": "x" * 1000}, "s"),  # an overridden header is not read
        ({"session_id": "x" * 256}, None, "x" * 256),
        ({"session_id": "ünï côdé 会话"}, None, "ünï côdé 会话"),
    ],
)
def test_the_session_key_order(fields, headers, expected):
    assert chat(headers, **fields).session_id == expected


@pytest.mark.parametrize(
    ("fields", "headers"),
    [
        ({"session_id": ""}, None),
        ({"session_id": "x" * 257}, None),
        ({"session_id": 7}, None),
        ({"session_id": True}, None),
        ({"session_id": "tab\there"}, None),
        ({"prompt_cache_key": ""}, None),
        ({"promptCacheKey": ["a"]}, None),
        ({"session_id": "ok", "promptCacheKey": ""}, None),  # every key given is checked
        ({}, {"X-Session-Id": ""}),
        ({}, {"X-Session-Id": "x" * 257}),
    ],
)
def test_a_malformed_session_key_is_invalid_request(fields, headers):
    with pytest.raises(InvalidRequest):
        chat(headers, **fields)


def test_session_targets_from_body_query_and_header():
    assert parse_session_target(b'{"session_id": "s", "name": "m"}').session_id == "s"
    assert parse_session_target(b'{"name": "m"}', {"X-Session-Id": "h"}).session_id == "h"
    assert parse_session_target(b'{"session_id": "s"}', {"X-Session-Id": "h"}).session_id == "s"
    assert parse_session_target(b'{"name": null, "session_id": "s"}').name == ""
    with pytest.raises(InvalidRequest, match="in the body\\)"):  # export: no header fallback
        parse_session_target(b'{"name": "m"}')
    for raw in (b"", b"[]", b"{", b'{"session_id": ""}', b'{"session_id": 3}', b'{"name": 3, "session_id": "s"}'):
        with pytest.raises(InvalidRequest):
            parse_session_target(raw, {})
    assert parse_session_query({"session_id": "q", "name": "m"}, {"X-Session-Id": "h"}).session_id == "q"
    assert parse_session_query({}, {"X-Session-Id": "h"}).session_id == "h"
    with pytest.raises(InvalidRequest):
        parse_session_query({}, {})


def restore_body(**fields) -> bytes:
    body = {"name": "m", "session_id": "s", "blob": base64.b64encode(b"\x00\x01blob").decode(), "tokens": [1, 2]}
    return json.dumps({k: v for k, v in {**body, **fields}.items() if v is not ...}).encode()


def test_a_restore_body():
    request = parse_restore_request(restore_body(), {})
    assert (request.name, request.session_id, request.blob, request.tokens) == ("m", "s", b"\x00\x01blob", [1, 2])
    wrapped = base64.encodebytes(b"x" * 100).decode()  # line breaks every 76 characters, as MIME writes it
    assert parse_restore_request(restore_body(blob=wrapped), {}).blob == b"x" * 100
    assert parse_restore_request(restore_body(session_id=...), {"X-Session-Id": "h"}).session_id == "h"
    malformed = [{"session_id": ...}, {"blob": ...}, {"tokens": ...}, {"tokens": []}, {"tokens": [1, -1]},
                 {"tokens": [2**31]}, {"tokens": ["1"]}, {"tokens": [False]}, {"blob": 5}, {"blob": None}]  # fmt: skip
    for fields in malformed:
        with pytest.raises(InvalidRequest):
            parse_restore_request(restore_body(**fields), {})
    for blob in ("@@@@", "QUJ", "", "\u00e9\u00e9\u00e9\u00e9", "QUJD!"):
        with pytest.raises(BadSessionBlob):
            parse_restore_request(restore_body(blob=blob), {})


def test_estimate_queries():
    assert parse_estimate_query({"tokens": "10"}) == {"tokens": 10, "name": ""}
    full = parse_estimate_query({"tokens": "10", "name": "m", "blob_bytes": "5", "upload_bps": "2.5"})
    assert full == {"tokens": 10, "name": "m", "blob_bytes": 5, "upload_bps": 2.5}
    malformed = [{}, {"tokens": "0"}, {"tokens": "-1"}, {"tokens": "1.5"}, {"tokens": "x"},
                 {"tokens": "1", "blob_bytes": "0"}, {"tokens": "1", "upload_bps": "0"},
                 {"tokens": "1", "upload_bps": "nan"}]  # fmt: skip
    for query in malformed:
        with pytest.raises(InvalidRequest):
            parse_estimate_query(query)


@pytest.mark.parametrize(
    ("reason", "status", "type_", "retry_after"),
    [
        (Reason.SESSION_CAPACITY, 429, "model_at_session_capacity", "30"),
        (Reason.SESSIONS_DISABLED, 400, "session_caching_disabled", None),
        (Reason.SESSION_NOT_FOUND, 404, "session_not_found", None),
        (Reason.SESSION_BUSY, 429, "session_busy", None),
        (Reason.BAD_SESSION_BLOB, 400, "bad_session_blob", None),
        (Reason.WEIGHTS_VERSION_MISMATCH, 409, "weights_version_mismatch", None),
    ],
)
def test_session_reasons_as_the_client_sees_them(reason, status, type_, retry_after):
    error = as_api_error(EngineError("the worker's words", reason))
    assert (error.status, error.type, error.message) == (status, type_, "the worker's words")
    assert error.headers.get("Retry-After") == retry_after


def test_the_session_retry_after_is_a_setting():
    with override_settings(PANTHEON_RETRY_AFTER_SESSION_S=7):
        assert as_api_error(EngineError("full", Reason.SESSION_CAPACITY)).headers["Retry-After"] == "7"


def test_every_reason_has_a_refusal():
    for reason in Reason:
        assert as_api_error(EngineError("x", reason)).status >= 400


def test_serving_limits_from_the_options_and_settings():
    limits = serving_limits(LoadOptions())
    assert (limits.max_concurrent, limits.max_sessions, limits.block_size) == (8, 8, 16)
    assert limits.prefix_cache_bytes is None  # automatic: the worker sizes it from its free memory
    assert (limits.session_idle_ttl, limits.watch_grace) == (12 * 3600.0, 45.0)
    assert serving_limits(LoadOptions(max_sessions=3)).max_sessions == 3
    assert serving_limits(LoadOptions(max_sessions=3)).max_concurrent == 3
    assert serving_limits(LoadOptions(max_concurrent=2)).max_sessions == 2
    assert serving_limits(LoadOptions(max_concurrent=2, max_sessions=5)).max_sessions == 5
    with override_settings(PANTHEON_SESSIONS=False, PANTHEON_KV_BLOCK_SIZE=32, PANTHEON_PREFIX_CACHE_BYTES=2**20,
                           PANTHEON_SESSION_IDLE_TTL_S=60.0, PANTHEON_SESSION_WATCH_GRACE_S=5.0):  # fmt: skip
        limits = serving_limits(LoadOptions(max_sessions=3))
        assert (limits.max_sessions, limits.block_size, limits.prefix_cache_bytes) == (0, 32, 2**20)
        assert (limits.session_idle_ttl, limits.watch_grace, limits.max_concurrent) == (60.0, 5.0, 3)


def finished(**fields) -> Generation:
    generation = Generation("r", p.Started(request_id="r", prompt_tokens=5, cached_tokens=0, kv_cap=64), None, None)
    generation.finished = p.Finished(request_id="r", finish_reason="stop", prompt_tokens=5, completion_tokens=2,
                                     cached_tokens=3, kv_used=7, kv_cap=64, **fields)  # fmt: skip
    return generation


def test_usage_says_session_conflict_only_when_a_choice_had_one():
    assert "session_conflict" not in usage_body([finished()])
    assert usage_body([finished(), finished(session_conflict=True)])["session_conflict"] is True
    assert usage_body([finished()])["prompt_tokens_details"] == {"cached_tokens": 3}


def test_the_estimate_without_a_model_is_the_specs_example():
    router = ModelRouter(ZmqEngineClient("inproc://nothing-listens"))
    with pytest.raises(ModelNotFound):
        session_model(router, "")
    with pytest.raises(ModelNotFound):
        session_model(router, "m")
    result = asyncio.run(estimate(router, tokens=4096, name="m"))
    assert result == {"model": "", "tokens": 4096, "prefill_tok_per_s": 17.0, "cold_reprefill_s": 240.94,
                      "warm_restore_s": 5.391, "blob_bytes_est": 67108864}  # fmt: skip
    result = asyncio.run(estimate(router, tokens=10, blob_bytes=25_000_000, upload_bps=12.5e6))
    assert (result["blob_bytes_est"], result["warm_restore_s"], result["cold_reprefill_s"]) == (25_000_000, 2.008, 0.59)
