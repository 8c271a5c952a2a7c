"""The checkpoint directory's disk full during POST /api/weights/save (docs/reliability.md): a real full
filesystem (a small tmpfs mounted over the checkpoint directory), a clear refusal, nothing left behind that a load
would accept, and the same save going through once there is room."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.weights.weights_calls import Holder, load_attachable, status, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

DISK_BYTES = 4 << 20


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A 4 MiB tmpfs: a real filesystem that fills up (mounting needs root, which the CI runs as)."""
    folder = tmp_path_factory.mktemp("small-disk")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(folder)], check=True)
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)


@pytest.fixture(scope="module")
def server(start_server, checkpoint_dir):
    return start_server(PANTHEON_CHECKPOINT_DIR=str(checkpoint_dir), WEIGHTS_HOLD_TIMEOUT_S="30")


def fill(folder: Path, leave: int) -> Path:
    """A file that takes all the disk's free space but `leave` bytes."""
    filler = folder / "filler"
    free = shutil.disk_usage(folder).free
    with filler.open("wb") as file:
        file.write(b"\0" * max(0, free - leave))
    return filler


def test_a_save_onto_a_full_disk_is_refused_clearly_and_leaves_nothing_a_load_accepts(
    server, api, stories_hf_dir, checkpoint_dir
):
    holder = Holder(server, load_attachable(api, stories_hf_dir))
    holder.attach()
    filler = fill(checkpoint_dir, leave=64 << 10)  # stories260K's weights take about 1 MiB

    refused = holder.call("save", {"run_id": "run"})
    assert refused.error == (500, "SAVE_FAILED", "disk_full")
    assert "no space left" in refused.body["error"]["message"].lower()
    assert sorted(p.name for p in (checkpoint_dir / "run").iterdir()) == []  # no step, no temporary folder
    assert status(server)["weights_state"] == "clean"
    load = weights_call(server, "load", holder.token, body={"checkpoint": str(checkpoint_dir / "run" / "step-0")})
    assert load.error[:2] == (404, "CHECKPOINT_NOT_FOUND")

    os.unlink(filler)
    saved = holder.call("save", {"run_id": "run"}).data
    assert Path(saved["path"]) == checkpoint_dir / "run" / "step-0"
    loaded = weights_call(server, "load", holder.token, body={"checkpoint": saved["name"]}).data
    assert loaded["served_name"] == saved["name"]
    holder.detach()
