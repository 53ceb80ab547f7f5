from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0008_batch_stage_runs'),
    ]

    operations = [
        migrations.AddField(
            model_name='generatedimage',
            name='content_sha256',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
    ]
