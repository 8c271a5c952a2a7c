"""The append-only trigger lets through retention's DELETE (rows up to the id the transaction-local setting
`pantheon.audit_prune_through` names) and still refuses every other DELETE and every UPDATE
(pantheon_site/audit_chain.py, pantheon_site/audit_retention.py)."""

from django.db import migrations

from pantheon_site.audit_chain import install_trigger


def prunable_trigger(apps, schema_editor):
    install_trigger(schema_editor.connection, prunable=True)


def strict_trigger(apps, schema_editor):
    install_trigger(schema_editor.connection, prunable=False)


class Migration(migrations.Migration):
    dependencies = [("pantheon_site", "0002_audit_chain")]

    operations = [migrations.RunPython(prunable_trigger, strict_trigger)]
