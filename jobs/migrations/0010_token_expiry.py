from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0009_image_content_sha256")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(blank=True, help_text="refused from then on; empty: never expires", null=True),
        ),
    ]
