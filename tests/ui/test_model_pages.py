"""The models page without a running engine: the catalogue's register, edit and remove (audited as the user), a
load's refusal in words, and how a running load's progress is drawn."""

import pytest
from django.template.loader import render_to_string
from django.urls import reverse

from inference.models import CatalogModel
from pantheon_site.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_register_edit_and_remove_a_catalogue_entry(operator, stories_gguf_path):
    page = operator.post(reverse("ui:catalogue-save"), {"path": str(stories_gguf_path), "name": "tiny"})
    assert "Saved tiny in the catalogue." in page.content.decode()
    assert CatalogModel.objects.get(name="tiny").load_options.ctx_cap == 0
    operator.post(
        reverse("ui:catalogue-save"),
        {"path": str(stories_gguf_path), "name": "tiny", "ctx_cap": "128", "quantize": "on"},
    )
    options = CatalogModel.objects.get(name="tiny").load_options
    assert (options.ctx_cap, options.quantize) == (128, True)
    assert 'name="ctx_cap" value="128"' in operator.get(reverse("ui:models")).content.decode()
    page = operator.post(reverse("ui:catalogue-remove"), {"name": "tiny"}).content.decode()
    assert "Removed tiny" in page and not CatalogModel.objects.filter(name="tiny").exists()
    events = AuditEvent.objects.filter(actor_label="olga").order_by("id")
    assert [(e.operation, e.outcome, e.model) for e in events] == [
        ("catalogue_save", "accepted", "tiny"),
        ("catalogue_save", "accepted", "tiny"),
        ("catalogue_remove", "accepted", "tiny"),
    ]


def test_a_bad_path_or_option_is_refused_in_words_and_changes_nothing(operator, tmp_path, stories_gguf_path):
    page = operator.post(reverse("ui:catalogue-save"), {"path": str(tmp_path / "nothing.gguf")}).content.decode()
    assert "nothing.gguf: no such file or directory" in page and "notice error" in page
    page = operator.post(reverse("ui:catalogue-save"), {"path": str(stories_gguf_path), "ctx_cap": "many"})
    assert "ctx_cap" in page.content.decode() and "notice error" in page.content.decode()
    assert not CatalogModel.objects.exists()
    assert AuditEvent.objects.filter(operation="catalogue_save", outcome="refused").count() == 2


def test_a_load_without_an_engine_says_why(operator, stories_gguf_path):
    page = operator.post(reverse("ui:model-load"), {"path": str(stories_gguf_path)}).content.decode()
    assert "The load failed: the inference engine is not running in this process" in page
    event = AuditEvent.objects.get(operation="model_load")
    assert (event.outcome, event.actor_kind, event.actor_label) == ("refused", "user", "olga")


def test_a_running_load_is_drawn_with_its_tensors_and_bytes():
    progress = {"tensors_read": 3, "tensors_total": 12, "bytes_read": 2**20, "bytes_total": 4 * 2**20}
    row = {"id": "big", "state": "loading", "path": "/m/big.gguf", "device": "cpu", "max_sessions": 0}
    row["load_progress"] = progress
    html = render_to_string("admin_ui/models_live.html", {"instances": [row]})
    assert "3/12 tensors, 1.0\xa0MB of 4.0\xa0MB" in html
    assert 'style="width: 25%"' in html


def test_the_prefix_cache_is_drawn_with_its_size_and_hit_rate():
    row = {"id": "m", "state": "ready", "path": "/m", "device": "cpu", "max_sessions": 0}
    row["prefix_cache"] = {"bytes": 4 * 2**30}
    row["live"] = {"sessions": 0, "prefix_cache": {"lookup_tokens": 400, "hit_tokens": 300, "hit_rate": 0.75}}
    html = render_to_string("admin_ui/models_live.html", {"instances": [row]})
    assert "4.0\xa0GB," in html and ">75%<" in html and "300 of 400 prompt tokens" in html


def test_replicas_are_drawn_one_row_each_with_an_unload_of_their_own():
    """Two replicas of one model (docs/replicas.md): one row each, the second marked with its placement, and each
    row's Unload names its instance, so it leaves the other serving."""
    rows = [{"id": "s", "placement": key, "instance_id": pk, "state": "ready", "path": "/m/s.gguf", "device": "cpu",
             "max_sessions": 0} for key, pk in (("s", 7), ("s#2", 8))]  # fmt: skip
    html = render_to_string("admin_ui/models_live.html", {"instances": rows, "unload_button": True})
    assert html.count('data-model="s"') == 2 and html.count(">s#2</span>") == 1
    assert 'name="instance_id" value="7"' in html and 'name="instance_id" value="8"' in html
