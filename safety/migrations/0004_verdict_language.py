from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("safety", "0003_verdict_classifier"),
    ]

    operations = [
        migrations.AddField(
            model_name="safetyverdict",
            name="language",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
    ]
