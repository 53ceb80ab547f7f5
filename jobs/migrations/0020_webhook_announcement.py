# A job announces each terminal status it reaches, the same one again after another included
# (blocked, an appeal overturned, blocked again): the outbox's uniqueness moves from
# (job, status) to (job, announcement). Existing rows are numbered per job in the order written.

from django.db import migrations, models


def number_existing(apps, schema_editor):
    delivery = apps.get_model("jobs", "WebhookDelivery")
    seen: dict = {}
    changed = []
    for row in delivery.objects.order_by("job_id", "created_at", "id").only("id", "job_id"):
        row.announcement = seen.get(row.job_id, 0)
        seen[row.job_id] = row.announcement + 1
        if row.announcement:
            changed.append(row)
    delivery.objects.bulk_update(changed, ["announcement"], batch_size=500)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0019_job_joins'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='webhookdelivery',
            name='one_webhook_per_job_status',
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='announcement',
            field=models.PositiveSmallIntegerField(default=0, help_text="the job's nth terminal status (0 the first)"),
        ),
        migrations.RunPython(number_existing, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='webhookdelivery',
            constraint=models.UniqueConstraint(fields=('job', 'announcement'), name='one_webhook_per_job_announcement'),
        ),
    ]
