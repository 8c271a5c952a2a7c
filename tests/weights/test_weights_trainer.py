"""A real trainer in a separate process, with pantheon_trainer, against a real server on CPU: attach (shared-memory
handles), quiesce, commit-begin, an in-place write, commit-end, resume; requests sent during the hold are served
after it with the new weights; save; restart the platform; load the checkpoint; the output is the trained one."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.inference.serving import REPO_ROOT, operator_client, wait_for
from tests.inference.session_turns import load
from tests.weights.weights_calls import greedy, new_token, status, text, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

HELD = 4  # requests sent while the trainer holds the barrier


class Trainer:
    """The trainer subprocess and its JSON lines."""

    def __init__(self, url: str, token: str, run_id: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.weights.weights_trainer", url, token, run_id],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def next(self, event: str) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the trainer ended before {event!r}: {self.process.stderr.read()}")
        report = json.loads(line)
        assert report["event"] == event, report
        return report

    def go(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()


def test_a_trainer_process_writes_the_served_weights_and_the_checkpoint_survives_a_restart(
    start_server, tmp_path_factory, stories_hf_dir, operator_token
):
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    # long enough that the test's requests are sent and held before the watchdog or the hold timer act
    timers = {"WEIGHTS_COMMIT_WATCHDOG_MS": "30000", "WEIGHTS_HOLD_TIMEOUT_S": "30", "PANTHEON_LOG_LEVEL": "INFO"}
    server = start_server(PANTHEON_CHECKPOINT_DIR=str(checkpoints), **timers)
    trainer_token = new_token("trainer", "trainer")
    with operator_client(server, operator_token) as api:
        load(api, stories_hf_dir, "stories")
        before = greedy(server.url)
        assert before.headers["X-miLLM-Model"] == '"stories";origin=model;commits=0'

        trainer = Trainer(server.url, trainer_token, "online")
        attached = trainer.next("attached")
        assert attached["storages"] == 1 and attached["parameters"] > 0  # one arena, every parameter a view of it
        trainer.next("writing")
        with ThreadPoolExecutor(HELD) as pool:
            held = [pool.submit(greedy, server.url) for _ in range(HELD)]
            wait_for(lambda: status(server)["held_requests"] == HELD)
            assert status(server)["weights_state"] == "writing" and not any(f.done() for f in held)
            trainer.go()
            committed = trainer.next("committed")
            served = [f.result() for f in held]
        assert committed["overran"] is False and committed["steps_since_load"] == 1
        assert committed["forward_steps_during_commit"] == 0  # no forward pass between commit-begin and commit-end
        after = greedy(server.url)
        assert text(after) != text(before)
        assert after.headers["X-miLLM-Model"] == '"stories";origin=model;commits=1'
        assert [text(r) for r in served] == [text(after)] * HELD  # none lost, all on the new weights
        assert all(r.headers["X-miLLM-Model"].endswith("commits=1") for r in served)

        trainer.go()
        saved = trainer.next("saved")
        assert saved["name"] == "stories:online:step-1" and saved["step"] == 1
        trainer.next("detached")
        assert trainer.process.wait(60) == 0
        state = status(server)
        assert state["attached"] is False and state["served_name"] == "stories:online:step-1"
        assert state["exports_since_start"] == 1 and state["unsaved_commits"] == 0

    assert server.stop() == 0  # the restart; then the base model, untrained, and the checkpoint written into it
    restarted = start_server(PANTHEON_CHECKPOINT_DIR=str(checkpoints), **timers)
    with operator_client(restarted, operator_token) as api:
        load(api, stories_hf_dir, "stories")
        assert text(greedy(restarted.url)) == text(before)
        loaded = weights_call(restarted, "load", trainer_token, body={"checkpoint": "stories:online:step-1"}).data
        assert loaded["weights_state"] == "clean"
        reloaded = greedy(restarted.url)
        assert text(reloaded) == text(after)
        assert reloaded.headers["X-miLLM-Model"] == '"stories:online:step-1";origin=checkpoint;commits=0'

    for log in (server.log(), restarted.log()):  # the token never reaches a log line
        assert trainer_token not in log and operator_token not in log
