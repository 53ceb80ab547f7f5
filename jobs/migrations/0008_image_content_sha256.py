from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0007_fair_webhooks'),
    ]

    operations = [
        migrations.AddField(
            model_name='generatedimage',
            name='content_sha256',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
    ]
