"""Compare model versions side by side, and promote or roll back by moving queued jobs.

    manage.py rollout status
    manage.py rollout move --from shapes-v1 --to shapes-v2    # promote (then serve v2 as stable)
    manage.py rollout move --from shapes-v2 --to shapes-v1    # roll a canary back

Promotion: start workers of the new version on gpu.<name>, set IMAGEGEN_MODEL_VERSION to it
(and IMAGEGEN_CANARY_SHARE=0), then move the old version's queued jobs. Nothing queued is lost:
moved jobs keep their admission time and so their place in line.
"""

from django.core.management.base import BaseCommand
from django.db.models import Avg, Count, Q, Sum

from jobs.actions import move_queued
from jobs.models import Batch, GenerationJob
from scheduling.lanes import lane_of


class Command(BaseCommand):
    help = "Model versions side by side; move queued jobs between versions (promote / roll back)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("status")
        move = sub.add_parser("move")
        move.add_argument("--from", dest="from_version", required=True)
        move.add_argument("--to", dest="to_version", required=True)

    def handle(self, action, **options):
        if action == "move":
            moved = move_queued(options["from_version"], options["to_version"])
            self.stdout.write(f"moved {moved} queued job(s) from {options['from_version']} to "
                              f"{options['to_version']} (lane {lane_of(options['to_version'])})")
            return
        rows = GenerationJob.objects.values("model_version").annotate(
            jobs=Count("id"),
            done=Count("id", filter=Q(status="done")),
            failed=Count("id", filter=Q(status="failed")),
            blocked_image=Count("id", filter=Q(status="blocked", blocked_stage="image")),
            queued=Count("id", filter=Q(status="queued")),
        )
        cost = {
            r["model_version"]: r for r in Batch.objects.values("model_version").annotate(
                seconds=Sum("gpu_seconds"), images=Sum("size"), fill=Avg("size"))
        }
        self.stdout.write(f"{'version':24s} {'lane':28s} {'jobs':>6s} {'done':>6s} {'failed':>6s} "
                          f"{'img-blocked':>11s} {'queued':>6s} {'GPU-s/img':>9s}")
        for r in rows:
            c = cost.get(r["model_version"], {})
            per_image = (c.get("seconds") or 0) / c["images"] if c.get("images") else float("nan")
            self.stdout.write(f"{r['model_version']:24s} {lane_of(r['model_version']):28s} {r['jobs']:6d} {r['done']:6d} "
                              f"{r['failed']:6d} {r['blocked_image']:11d} {r['queued']:6d} {per_image:9.4f}")
