"""The audit log becomes tamper-evident: hash columns chained over every existing row, the chain head, indexes for
the audit page's filters, and the append-only trigger (pantheon_site/audit_chain.py)."""

from django.db import migrations, models

from pantheon_site.audit_chain import GENESIS, chain_hash, install_trigger, remove_trigger


def chain_existing_rows(apps, schema_editor):
    """Hash the rows written before this migration, in id order, and start the head at the newest."""
    AuditEvent = apps.get_model("pantheon_site", "AuditEvent")
    AuditChainHead = apps.get_model("pantheon_site", "AuditChainHead")
    db = schema_editor.connection.alias
    previous = GENESIS
    for event in AuditEvent.objects.using(db).order_by("id").iterator(chunk_size=2000):
        row_hash = chain_hash(previous, event)
        AuditEvent.objects.using(db).filter(pk=event.pk).update(previous_hash=previous, row_hash=row_hash)
        previous = row_hash
    AuditChainHead.objects.using(db).create(pk=1, last_hash=previous)


def add_trigger(apps, schema_editor):
    install_trigger(schema_editor.connection)


def drop_trigger(apps, schema_editor):
    remove_trigger(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("pantheon_site", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="auditevent",
            name="actor_kind",
            field=models.CharField(help_text="token, user, anonymous, cli or system", max_length=16),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="previous_hash",
            field=models.CharField(blank=True, help_text="row_hash of the event written before", max_length=64),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="row_hash",
            field=models.CharField(
                blank=True, help_text="sha256 of previous_hash and this row's content", max_length=64
            ),
        ),
        migrations.CreateModel(
            name="AuditChainHead",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("last_hash", models.CharField(default=GENESIS, max_length=64)),
            ],
        ),
        *[
            migrations.AddIndex(
                model_name="auditevent", index=models.Index(fields=[name, "-id"], name=f"audit_{name}_id")
            )
            for name in ("operation", "outcome", "actor_kind", "actor_label", "model", "error_type")
        ],
        migrations.RunPython(chain_existing_rows, migrations.RunPython.noop),
        migrations.RunPython(add_trigger, drop_trigger),
    ]
