"""A running load's progress reaches the control plane (LOAD_PROGRESS), the operator's model row and
`manage.py load_model`'s bar, and is gone once the model is loaded."""

import pytest

from inference.engine import kernels
from inference.engine.contract import messages as p
from inference.management.load_progress_bar import progress_line
from inference.runtime.in_process_client import InProcessEngineClient
from inference.services.model_rows import admin_model_row
from tests.inference.engine_calls import load


class WatchingClient(InProcessEngineClient):
    """The in-process client, keeping each LOAD_PROGRESS it received and the row its placement showed then."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[p.LoadProgress, dict]] = []

    def _dispatch(self, identity, message):
        super()._dispatch(identity, message)
        if isinstance(message, p.LoadProgress):
            self.seen.append((message, admin_model_row(self.models()[message.name])))


@pytest.mark.asyncio
async def test_a_load_reports_its_progress_while_it_runs_and_not_after(stories_gguf_path):
    client = WatchingClient()
    await client.start()
    try:
        await load(client, "stories", str(stories_gguf_path))
        assert client.seen, "no LOAD_PROGRESS arrived"
        for message, row in client.seen:
            assert row["state"] == "loading"
            assert row["load_progress"] == {
                "tensors_read": message.tensors_read, "tensors_total": message.tensors_total,
                "bytes_read": message.bytes_read, "bytes_total": message.bytes_total,
            }  # fmt: skip
            assert message.tensors_read <= message.tensors_total > 0 and message.bytes_read <= message.bytes_total
        row = admin_model_row(client.models()["stories"])
        assert "load_progress" not in row
        assert row["kernels"] == kernels.active_kernels()  # the worker's, here the same process's
    finally:
        await client.close()


def test_the_command_draws_the_bytes_read_as_a_bar():
    line = progress_line({"tensors_read": 3, "tensors_total": 12, "bytes_read": 2**20, "bytes_total": 4 * 2**20})
    assert line == "[" + "#" * 7 + "." * 23 + "] 3/12 tensors, 1.0/4.0 MiB"
