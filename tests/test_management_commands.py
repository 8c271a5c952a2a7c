"""manage.py commands as an operator uses them: output, effects, and a real `python manage.py` subprocess."""

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from inference.models import CatalogModel, InstanceState, ModelFormat, ModelInstance
from pantheon_site.models import AuditEvent
from pantheon_site.tokens import authenticate_token

REPO_ROOT = Path(__file__).resolve().parent.parent


def run(name, *args, **options) -> list[str]:
    out = StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue().splitlines()


def database_url_of(settings_dict: dict) -> str:
    """A DATABASE_URL naming the database this test process uses, for a subprocess that must see the same rows."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(settings_dict['NAME']).resolve()}"
    auth = settings_dict["USER"] + (f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else "")
    return f"postgres://{auth}@{settings_dict['HOST']}:{settings_dict['PORT']}/{settings_dict['NAME']}"


@pytest.mark.django_db
def test_create_token_prints_a_working_secret_last():
    lines = run("create_token", role="operator", label="ops")
    assert "operator" in lines[0] and "ops" in lines[0]
    assert authenticate_token(lines[-1]).label == "ops"


@pytest.mark.django_db
def test_create_token_with_expiry():
    lines = run("create_token", role="client", label="temp", expires_in_days=2)
    assert "expires" in lines[0]
    assert authenticate_token(lines[-1]).expires_at is not None


@pytest.mark.django_db
def test_create_token_installs_a_bootstrap_secret_from_the_environment_once(monkeypatch):
    """A deployment's setup job runs this on every upgrade: the secret in its store becomes an operator token, is
    never printed, and a second run keeps it; another secret under the same label is refused."""
    secret = "pth_" + "b" * 43
    monkeypatch.setenv("BOOTSTRAP_OPERATOR_TOKEN", secret)
    options = {"role": "operator", "label": "bootstrap", "secret_from_env": "BOOTSTRAP_OPERATOR_TOKEN"}
    first, again = run("create_token", **options), run("create_token", **options)
    assert first[0].startswith("Created") and again[0].startswith("Kept")
    assert secret not in "\n".join(first + again)
    assert authenticate_token(secret).role == "operator"
    monkeypatch.setenv("BOOTSTRAP_OPERATOR_TOKEN", "pth_" + "c" * 43)
    with pytest.raises(CommandError, match="already exists"):
        run("create_token", **options)
    monkeypatch.setenv("BOOTSTRAP_OPERATOR_TOKEN", "pth_short")
    with pytest.raises(CommandError, match="43"):
        run("create_token", **{**options, "label": "other"})


@pytest.mark.django_db
def test_list_tokens_shows_state_without_secrets():
    run("create_token", role="operator", label="ops")
    run("create_token", role="trainer", label="trainer-a")
    run("revoke_token", "trainer-a")
    table = run("list_tokens")
    assert table[0].split()[:4] == ["LABEL", "ROLE", "PREFIX", "STATE"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert rows["ops"][1:4:2] == ["operator", "active"]
    assert rows["trainer-a"][1:4:2] == ["trainer", "revoked"]


@pytest.mark.django_db
def test_audit_filters_and_json():
    run("create_token", role="operator", label="ops")
    with pytest.raises(CommandError):
        run("revoke_token", "ghost")
    everything = json.loads("\n".join(run("audit", json=True)))
    assert [e["operation"] for e in everything] == ["token_create", "token_revoke"]
    refused = json.loads("\n".join(run("audit", json=True, outcome="refused")))
    assert [(e["operation"], e["error_type"]) for e in refused] == [("token_revoke", "not_found")]
    only_creates = json.loads("\n".join(run("audit", json=True, operation="token_create")))
    assert len(only_creates) == 1 and only_creates[0]["actor_kind"] == "cli"
    assert json.loads("\n".join(run("audit", json=True, since="1h"))) == everything
    assert json.loads("\n".join(run("audit", json=True, since="2999-01-01"))) == []
    assert json.loads("\n".join(run("audit", json=True, actor="cli"))) == everything
    assert json.loads("\n".join(run("audit", json=True, limit=1))) == everything[-1:]
    table = run("audit", operation="token_revoke")
    assert "token_revoke" in table[1] and "refused" in table[1] and "not_found" in table[1]
    with pytest.raises(CommandError, match="--since"):
        run("audit", since="last tuesday")


@pytest.mark.django_db
def test_list_models_shows_catalogue_and_instance_state(stories_gguf_path, stories_hf_dir):
    assert "empty" in run("list_models")[0]
    gguf = CatalogModel.objects.create(
        name="stories", path=str(stories_gguf_path), format=ModelFormat.GGUF, size_bytes=2 * 2**20
    )
    CatalogModel.objects.create(name="stories-hf", path=str(stories_hf_dir), format=ModelFormat.HF, autoload=False)
    ModelInstance.objects.create(catalog=gguf, served_name="stories", device="cpu", state=InstanceState.READY)
    failed = ModelInstance.objects.create(
        catalog=gguf, served_name="stories", device="cuda:0", state=InstanceState.FAILED, last_error="out of memory"
    )
    table = run("list_models")
    assert table[0].split()[:2] == ["NAME", "FORMAT"]
    stories_row = next(line for line in table if line.startswith("stories "))
    assert "gguf" in stories_row and "2.0 MiB" in stories_row
    assert "stories@cpu ready" in stories_row
    assert f"stories@cuda:0 failed #{failed.pk} (out of memory)" in stories_row
    hf_row = next(line for line in table if line.startswith("stories-hf"))
    assert "not loaded" in hf_row and " no " in hf_row


def test_devices_lists_the_cpu_with_its_memory():
    import psutil
    import torch

    table = run("devices")
    assert table[0].split() == ["DEVICE", "DESCRIPTION", "TOTAL", "USED", "FREE"]
    cpu = next(line for line in table if line.startswith("cpu"))
    assert f"{psutil.virtual_memory().total / 2**30:.1f} GiB" in cpu
    assert len(table) == 2 + torch.cuda.device_count()


@pytest.mark.django_db(transaction=True)
def test_manage_py_subprocess_prints_the_secret_as_its_last_line():
    env = {**os.environ, "DATABASE_URL": database_url_of(connection.settings_dict)}
    done = subprocess.run(
        [sys.executable, "manage.py", "create_token", "--role", "operator", "--label", "from-shell"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    secret = done.stdout.splitlines()[-1]
    assert authenticate_token(secret).label == "from-shell"
    assert secret not in done.stderr
    assert AuditEvent.objects.get(operation="token_create").actor_kind == "cli"
