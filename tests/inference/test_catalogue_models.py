"""The catalogue, worker and instance records: the constraints operators and the supervisor rely on."""

import msgspec
import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError

from inference.engine.contract.params import LoadOptions
from inference.models import CatalogModel, InstanceState, ModelFormat, ModelInstance, Worker, WorkerState

pytestmark = pytest.mark.django_db


@pytest.fixture
def stories(stories_gguf_path):
    return CatalogModel.objects.create(
        name="stories",
        path=str(stories_gguf_path),
        format=ModelFormat.GGUF,
        architecture="llama",
        size_bytes=stories_gguf_path.stat().st_size,
        load_options=LoadOptions(ctx_cap=256),
    )


def test_catalogue_row_keeps_its_load_defaults(stories, stories_gguf_path):
    row = CatalogModel.objects.get(name="stories")
    assert row.size_bytes == stories_gguf_path.stat().st_size > 0
    assert row.autoload is True
    assert row.load_options == LoadOptions(ctx_cap=256)
    assert msgspec.to_builtins(row.load_options) == {
        "ctx_cap": 256,
        "max_sessions": 0,
        "max_concurrent": 0,
        "reasoning_budget": 0,
        "quantize": False,
        "dtype": "",
        "kv_dtype": "",
        "host_cache_mb": 0,
        "pooling": "mean",
        "compile": False,
        "tensor_parallel": 1,
        "attention": "",
    }
    assert row.created_at is not None and row.updated_at is not None


def test_load_options_are_validated_by_the_contract(stories):
    stories.load_options = {"ctx_cap": -1}
    with pytest.raises(ValidationError, match="ctx_cap must be 0"), transaction.atomic():
        stories.save()
    stories.load_options = {"ctx_cap": 64, "colour": "blue"}
    with pytest.raises(ValidationError, match="colour"):
        stories.full_clean()
    stories.load_options = {"quantize": True}  # a JSON object is read as LoadOptions, missing options as defaults
    stories.save()
    assert CatalogModel.objects.get(pk=stories.pk).load_options == LoadOptions(quantize=True)


def test_a_row_stored_before_an_option_existed_reads_it_as_its_default(stories):
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {CatalogModel._meta.db_table} SET load_options = %s", ['{"ctx_cap": 128}'])
    assert CatalogModel.objects.get(pk=stories.pk).load_options == LoadOptions(ctx_cap=128)


def test_catalogue_names_are_unique(stories, stories_hf_dir):
    with pytest.raises(IntegrityError), transaction.atomic():
        CatalogModel.objects.create(name="stories", path=str(stories_hf_dir), format=ModelFormat.HF)
    assert CatalogModel.objects.count() == 1


def test_one_worker_per_device():
    Worker.objects.create(device="cpu", pid=123, state=WorkerState.READY)
    with pytest.raises(IntegrityError), transaction.atomic():
        Worker.objects.create(device="cpu")
    assert Worker.objects.get(device="cpu").pid == 123


def test_replicas_share_a_served_name_and_are_told_apart_by_id(stories):
    cpu = Worker.objects.create(device="cpu", state=WorkerState.READY)
    gpu = Worker.objects.create(device="cuda:0", state=WorkerState.READY)
    a = ModelInstance.objects.create(catalog=stories, served_name="stories", worker=cpu, device="cpu")
    b = ModelInstance.objects.create(catalog=stories, served_name="stories", worker=gpu, device="cuda:0")
    assert a.pk != b.pk
    assert a.state == InstanceState.LOADING
    assert [i.device for i in stories.instances.order_by("id")] == ["cpu", "cuda:0"]


def test_a_catalogue_row_with_instances_cannot_be_deleted(stories):
    ModelInstance.objects.create(catalog=stories, served_name="stories", device="cpu", state=InstanceState.READY)
    with pytest.raises(ProtectedError):
        stories.delete()
    assert CatalogModel.objects.filter(name="stories").exists()


def test_an_instance_outlives_its_worker_row(stories):
    worker = Worker.objects.create(device="cpu")
    instance = ModelInstance.objects.create(catalog=stories, served_name="stories", worker=worker, device="cpu")
    worker.delete()
    instance.refresh_from_db()
    assert instance.worker is None and instance.device == "cpu"
