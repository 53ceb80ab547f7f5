from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        """Who hears of a status change (jobs/actions/notify.py): the webhook outbox inside the
        transaction, the event streams after it commits."""
        from celery.signals import worker_ready

        from jobs.actions import notify
        from jobs.realtime import events
        from jobs.webhooks import delivery
        from scheduling import liveness

        notify.status_changed.connect(delivery.record_terminal, dispatch_uid="webhook-outbox")
        notify.status_committed.connect(events.publish_status, dispatch_uid="status-events")
        # Every worker's heartbeat with its queues (scheduling/liveness.py), whatever its process type.
        worker_ready.connect(liveness.start_for_worker, dispatch_uid="worker-liveness", weak=False)
