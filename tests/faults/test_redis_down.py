"""Redis stopped under a serving server with REDIS_URL set, then started again (docs/reliability.md).

REDIS_URL makes Redis the Channels layer and the Celery broker (pantheon_site/settings.py); no route sends to
either today, so the promise is that nothing a user or an operator does notices: every route answers as before,
the log holds no traceback, and nothing needs Redis back to recover. The day a route starts using Redis, this test
says what its outage does to it."""

from __future__ import annotations

import httpx
import pytest

from tests.faults.private_services import PrivateRedis
from tests.faults.test_database_down import ChatLoad
from tests.inference.serving import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(start_server, redis):
    return start_server(REDIS_URL=redis.url)


def test_redis_down_changes_nothing_a_client_or_an_operator_sees(server, api, redis, stories_hf_dir):
    assert api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"}).status_code == 200
    with ChatLoad(server.url) as load:
        wait_for(lambda: len(load.statuses) >= 2)
        redis.stop()
        during = len(load.statuses)
        answers = {
            "list": api.get("/admin/models"),
            "load": api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "second"}),
            "unload": api.post("/admin/models/unload", json={"name": "second"}),
            "weights": api.get("/api/weights/checkpoints"),
            "health": httpx.get(f"{server.url}/api/health/detailed", timeout=60),
        }
        wait_for(lambda: len(load.statuses) >= during + 3)
        redis.start()
        wait_for(lambda: len(load.statuses) >= during + 6)
    assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 200)
    assert set(load.statuses) == {200}
    assert "Traceback" not in server.log()
