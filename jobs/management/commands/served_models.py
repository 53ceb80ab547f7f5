"""The served model versions: what a job's `model` field may name, each one's lane and queue.

    manage.py served_models            # a table
    manage.py served_models --queues   # the GPU queues, comma-separated (for a worker's -Q)
"""

from django.core.management.base import BaseCommand

from scheduling import catalogue
from scheduling.lanes import gpu_queue, lane_of


class Command(BaseCommand):
    help = "List the served model versions with their lanes, GPU queues and serving profiles."

    def add_arguments(self, parser):
        parser.add_argument("--queues", action="store_true", help="print only the GPU queues, comma-separated")

    def handle(self, *args, **options):
        served = catalogue.served().values()
        if options["queues"]:
            self.stdout.write(",".join(gpu_queue(lane_of(m.version)) for m in served))
            return
        for m in served:
            self.stdout.write(
                f"{m.version:24s} {gpu_queue(lane_of(m.version)):36s} steps {m.default_steps:3d} (max {m.max_steps:3d}) "
                f"guidance {m.guidance_scale:g}{'  default' if m.default else ''}  {m.path}"
            )
