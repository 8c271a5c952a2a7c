"""The catalogue's write path (inference/services/catalogue.py): a path that is not a checkpoint is refused with the
load route's statuses, and a model catalogued by an operator's load or by `manage.py load_model` without a server
is the same row, options included (one LoadOptions schema from the body and the flags to the row)."""

import json
from io import StringIO

import msgspec
import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import close_old_connections

from inference.api.serializers import parse_body
from inference.engine.contract.checkpoint import NotACheckpoint, inspect_checkpoint
from inference.engine.contract.params import LoadOptions
from inference.management.commands import load_model as load_model_command
from inference.models import CatalogModel
from inference.runtime.in_process_client import InProcessEngineClient
from inference.runtime.router import ModelRouter
from inference.services.catalogue import checkpoint_at
from inference.services.load_body import LoadModelSerializer
from inference.services.model_lifecycle import LoadRequest, do_load_model
from pantheon_site.errors import LoadFailed

ROW_FIELDS = ("path", "format", "architecture", "size_bytes", "load_options", "device", "autoload")


@pytest.mark.parametrize(
    ("name", "status", "reason"),
    [
        ("absent.gguf", 404, "not_found"),
        ("notes.txt", 400, "not_a_checkpoint"),
        (".", 400, "not_a_checkpoint"),
        ("x" * 300 + ".gguf", 400, "unreadable"),
    ],
)
def test_a_path_that_is_not_a_checkpoint_is_refused(tmp_path, name, status, reason):
    (tmp_path / "notes.txt").write_text("Once upon a time")
    with pytest.raises(LoadFailed) as refused:
        checkpoint_at(str(tmp_path / name))
    assert (refused.value.status, refused.value.reason) == (status, reason)
    with pytest.raises(NotACheckpoint) as sniffed:  # the worker's words too (tests/engine/test_checkpoint.py)
        inspect_checkpoint(tmp_path / name)
    assert refused.value.message == str(sniffed.value)


def test_every_load_option_is_a_body_field_and_a_command_flag():
    fields = LoadModelSerializer().fields
    parser = load_model_command.Command().create_parser("manage.py", "load_model")
    flags = {action.dest: action for action in parser._actions}
    for option in msgspec.structs.fields(LoadOptions):
        assert not fields[option.name].required  # left out: the catalogue entry's saved value
        assert flags[option.name].help  # from the struct's description
    assert parser.parse_args(["/m", "--dtype", "bfloat16", "--quantize"]).dtype == "bfloat16"


@pytest.mark.django_db(transaction=True)  # the load records its rows from another thread
async def test_an_operators_load_and_the_command_without_a_server_write_the_same_row(stories_hf_dir, monkeypatch):
    options = {"ctx_cap": 64, "max_sessions": 2, "reasoning_budget": 16, "quantize": True}
    client = InProcessEngineClient()
    await client.start()
    try:
        body = parse_body(
            LoadModelSerializer, json.dumps({"path": str(stories_hf_dir), "name": "by-route", **options}).encode()
        )
        row = await do_load_model(ModelRouter(client), LoadRequest.from_body(body))
        assert row["context_window"] == 64 and row["quantize"] is True
        await client.unload("by-route")
    finally:
        await client.close()

    monkeypatch.setattr(load_model_command, "running_server", lambda: None)
    flags = ["--ctx-cap", "64", "--max-sessions", "2", "--reasoning-budget", "16", "--quantize"]
    await sync_to_async(call_command)(
        "load_model", str(stories_hf_dir), "--name", "by-command", *flags, stdout=StringIO()
    )

    def rows():
        found = {m.name: {f: getattr(m, f) for f in ROW_FIELDS} for m in CatalogModel.objects.all()}
        close_old_connections()
        return found

    catalogue = await sync_to_async(rows)()
    assert catalogue["by-route"] == catalogue["by-command"]
    assert catalogue["by-route"]["load_options"] == LoadOptions(**options)
    assert catalogue["by-route"]["architecture"] == "llama" and catalogue["by-route"]["autoload"]
