"""The catalogue's six load-option columns become one `load_options` value (LoadOptions), as on ModelInstance."""

import msgspec
from django.db import migrations

import inference.models

OPTION_COLUMNS = ("ctx_cap", "max_sessions", "max_concurrent", "reasoning_budget", "quantize", "dtype")


def columns_to_options(apps, schema_editor):
    CatalogModel = apps.get_model("inference", "CatalogModel")
    for row in CatalogModel.objects.all():
        row.load_options = {column: getattr(row, column) for column in OPTION_COLUMNS}
        row.save(update_fields=["load_options"])


def options_to_columns(apps, schema_editor):
    CatalogModel = apps.get_model("inference", "CatalogModel")
    for row in CatalogModel.objects.all():
        options = msgspec.to_builtins(row.load_options)
        for column in OPTION_COLUMNS:
            setattr(row, column, options[column])
        row.save(update_fields=list(OPTION_COLUMNS))


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="catalogmodel",
            name="load_options",
            field=inference.models.LoadOptionsField(),
        ),
        migrations.RunPython(columns_to_options, options_to_columns),
        migrations.RemoveField(model_name="catalogmodel", name="ctx_cap"),
        migrations.RemoveField(model_name="catalogmodel", name="max_sessions"),
        migrations.RemoveField(model_name="catalogmodel", name="max_concurrent"),
        migrations.RemoveField(model_name="catalogmodel", name="reasoning_budget"),
        migrations.RemoveField(model_name="catalogmodel", name="quantize"),
        migrations.RemoveField(model_name="catalogmodel", name="dtype"),
        migrations.AlterField(
            model_name="modelinstance",
            name="load_options",
            field=inference.models.LoadOptionsField(),
        ),
    ]
