"""PANTHEON_RATE_LIMIT_PER_MINUTE: each token may make that many calls a minute, then gets 429 with Retry-After in
its route's envelope, while other tokens go on; without the setting nothing is limited."""

from __future__ import annotations

import httpx
import pytest

from pantheon_site.models import AuditEvent
from pantheon_site.rate_limit import TokenBuckets
from pantheon_site.tokens import do_create_token
from tests.inference.conftest import serving_db, start_server  # noqa: F401  (the fixtures)
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)

# Two calls a minute: the bucket refills one call in 30 s, far longer than a test's few calls take.
PER_MINUTE = 2


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_admits_a_minutes_calls_at_once_then_refills_at_the_steady_rate():
    clock = Clock()
    buckets = TokenBuckets(clock)
    assert [buckets.take("a", 60) for _ in range(60)] == [0.0] * 60
    assert buckets.take("a", 60) == pytest.approx(1.0)  # one call a second: the next in 1 s
    assert buckets.take("b", 60) == 0.0  # another token has its own bucket
    clock.now += 0.5
    assert buckets.take("a", 60) == pytest.approx(0.5)
    clock.now += 0.5
    assert buckets.take("a", 60) == 0.0
    assert buckets.take("a", 60) == pytest.approx(1.0)
    clock.now += 3600  # a long idle time refills a minute's calls, no more
    assert [buckets.take("a", 60) for _ in range(61)][-2:] == [0.0, pytest.approx(1.0)]


@pytest.fixture(scope="module")
def server(start_server):  # noqa: F811
    return start_server(PANTHEON_REQUIRE_CLIENT_TOKENS="true", PANTHEON_RATE_LIMIT_PER_MINUTE=str(PER_MINUTE))


def secret(role: str, label: str) -> str:
    return do_create_token(role, label)[1]


def assert_limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert 1 <= int(response.headers["retry-after"]) <= 60 // PER_MINUTE


def test_v1_admin_and_session_routes_answer_429_with_retry_after_in_the_openai_envelope(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for path, role in [("/v1/models", "client"), ("/admin/models", "operator"), ("/session/estimate", "client")]:
            token = secret(role, f"{role}-{path}")
            answered = [http.get(path, params={"tokens": 16}, headers=bearer(token)) for _ in range(PER_MINUTE + 1)]
            assert [r.status_code for r in answered[:PER_MINUTE]] == [200] * PER_MINUTE, path
            assert_limited(answered[-1])
            assert answered[-1].json()["error"] == {
                "message": "this token's rate limit is reached; retry after Retry-After",
                "type": "rate_limited",
                "code": "rate_limit_exceeded",
            }
        assert http.get("/v1/models", headers=bearer(secret("client", "other"))).status_code == 200
    assert AuditEvent.objects.filter(outcome="refused", reason="rate_limit").count() == 3


def test_weights_routes_answer_429_in_the_management_envelope(server):
    trainer = secret("trainer", "trainer-1")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answered = [http.post("/api/weights/heartbeat", headers=bearer(trainer)) for _ in range(PER_MINUTE + 1)]
    assert 429 not in [r.status_code for r in answered[:PER_MINUTE]]  # answered for what they are (nothing attached)
    assert_limited(answered[-1])
    body = answered[-1].json()
    assert body["success"] is False and body["error"]["code"] == "RATE_LIMITED"


def test_a_refused_call_counts_too(server):
    client = secret("client", "nosy")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        refused = [http.get("/admin/models", headers=bearer(client)) for _ in range(PER_MINUTE)]
        assert [r.status_code for r in refused] == [403] * PER_MINUTE
        assert_limited(http.get("/v1/models", headers=bearer(client)))


def test_without_the_setting_nothing_is_limited(start_server):  # noqa: F811
    unlimited = start_server(PANTHEON_REQUIRE_CLIENT_TOKENS="true")
    client = secret("client", "app")
    with httpx.Client(base_url=unlimited.url, timeout=30) as http:
        answered = [http.get("/v1/models", headers=bearer(client)).status_code for _ in range(20)]
    assert answered == [200] * 20
