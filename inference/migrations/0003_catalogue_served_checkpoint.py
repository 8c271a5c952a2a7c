"""A catalogue row records the trainer checkpoint its model serves, so a restart loads that one."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0002_catalogue_load_options"),
    ]

    operations = [
        migrations.AddField(
            model_name="catalogmodel",
            name="served_checkpoint",
            field=models.CharField(blank=True, max_length=1024),
        ),
    ]
