"""A worker crash whose reload fails: the model is no longer served, its instance row says why, and /v1 answers
for it as for a catalogued model that cannot be loaded; the next load of the checkpoint serves again."""

import os
import shutil
import signal

import httpx
import pytest

from inference.models import InstanceState, ModelInstance
from tests.inference.serving import bearer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "doomed", "messages": [{"content": "Hi"}], "max_tokens": 3, "temperature": 0}


def test_a_model_whose_reload_fails_is_recorded_failed_and_no_longer_served(
    server, operator_token, tmp_path, models_dir
):
    stories_hf_dir = models_dir / "stories260K-hf"
    checkpoint = shutil.copytree(stories_hf_dir, tmp_path / "doomed")
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(operator_token)) as api:
        loaded = api.post("/admin/models/load", json={"path": str(checkpoint), "name": "doomed"})
        assert loaded.status_code == 200, loaded.text
        instance_id = loaded.json()["instance_id"]
        assert api.post("/v1/chat/completions", json=CHAT).status_code == 200

        shutil.rmtree(checkpoint)  # the reload after the crash cannot read it any more
        [pid] = server.worker_pids()
        os.kill(pid, signal.SIGKILL)

        instance = wait_for(
            lambda: ModelInstance.objects.filter(pk=instance_id, state=InstanceState.FAILED).first(), timeout=60
        )
        assert "reload" in instance.last_error
        wait_for(lambda: not api.get("/admin/models").json()["data"], timeout=30)
        assert api.get("/v1/models").json()["data"] == []
        # The name is catalogued, so /v1 tries to load it on demand, and says why that fails.
        refused = api.post("/v1/chat/completions", json=CHAT)
        assert (refused.status_code, refused.json()["error"]["type"]) == (404, "load_failed")
        assert "no such file or directory" in refused.json()["error"]["message"]

        shutil.copytree(stories_hf_dir, checkpoint)
        again = api.post("/admin/models/load", json={"path": str(checkpoint), "name": "doomed"})
        assert again.status_code == 200, again.text
        assert api.post("/v1/chat/completions", json=CHAT).status_code == 200
