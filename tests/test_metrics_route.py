"""GET /metrics's door: open from loopback (no token, no database query) while PANTHEON_METRICS_OPEN_ON_LOOPBACK is
on; from elsewhere, or with it off, an operator token, refused in the error envelope otherwise. In one process (no
multi-process folder) it shows that process's own registry."""

import pytest
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.test import AsyncClient, override_settings
from prometheus_client.parser import text_string_to_metric_families

from pantheon_site.models import AuditEvent
from pantheon_site.tokens import do_create_token


class ClientAt(AsyncClient):
    """Django's async test client, its requests coming from `address` (the ASGI scope's client)."""

    def __init__(self, address: str):
        super().__init__()
        self.address = address

    def _base_scope(self, **request):
        return {**super()._base_scope(**request), "client": [self.address, 40000]}


@pytest.fixture
def loopback():
    return ClientAt("127.0.0.1")


@pytest.fixture
def elsewhere():
    return ClientAt("10.1.2.3")


@pytest.fixture
def secrets(transactional_db):
    return {role: do_create_token(role, f"{role}-1")[1] for role in ["operator", "client"]}


@pytest.fixture
async def thread_connections_closed():
    yield
    await sync_to_async(close_old_connections)()


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def scraped_requests(text: str, route: str, status: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pantheon_requests_total" and sample.labels == {"route": route, "model": "", "status": status}
    )


async def test_from_loopback_a_scrape_needs_no_token_and_reads_no_database(loopback):
    """This test has no database: a query would fail the scrape."""
    response = await loopback.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    # this process's registry: the scrape before this one is counted in the next
    first = scraped_requests(response.content.decode(), "/metrics", "200")
    again = await loopback.get("/metrics")
    assert scraped_requests(again.content.decode(), "/metrics", "200") == first + 1


async def test_from_elsewhere_it_takes_an_operator_token(elsewhere, secrets, thread_connections_closed):
    refused = await elsewhere.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Bearer"
    assert refused.json()["error"]["type"] == "unauthorized"
    wrong_role = await elsewhere.get("/metrics", headers=bearer(secrets["client"]))
    assert wrong_role.status_code == 403 and wrong_role.json()["error"]["type"] == "forbidden"
    allowed = await elsewhere.get("/metrics", headers=bearer(secrets["operator"]))
    assert allowed.status_code == 200 and b"pantheon_requests_total" in allowed.content
    refusals = [e async for e in AuditEvent.objects.order_by("id").values_list("operation", "outcome", "reason")]
    assert refusals == [("metrics_scrape", "refused", "token_missing"), ("metrics_scrape", "refused", "role_client")]


@override_settings(PANTHEON_METRICS_OPEN_ON_LOOPBACK=False)
async def test_with_the_setting_off_loopback_takes_a_token_too(loopback, secrets, thread_connections_closed):
    assert (await loopback.get("/metrics")).status_code == 401
    allowed = await loopback.get("/metrics", headers=bearer(secrets["operator"]))
    assert allowed.status_code == 200


async def test_only_get(loopback):
    assert (await loopback.post("/metrics")).status_code == 404
