import json

from django.conf import settings
from django.core.management.base import BaseCommand

from gpu_tasks.capacity import images_per_second, suggest_cap
from gpu_tasks.pipeline import get_model


class Command(BaseCommand):
    help = "Measure images/s of the served model per menu size and batch size; suggest IMAGEGEN_BATCH_CAPS."

    def add_arguments(self, parser):
        parser.add_argument("--steps", type=int, default=settings.IMAGEGEN_DEFAULT_STEPS)
        parser.add_argument("--batches", default="1,2,4,8,16", help="batch sizes to try")
        parser.add_argument("--images", type=int, default=16, help="images per measurement")
        parser.add_argument("--min-gain", type=float, default=0.10, help="a doubling must gain this much")
        parser.add_argument("--json", action="store_true", dest="as_json", help="also print the figures as JSON")

    def handle(self, steps, batches, images, min_gain, as_json=False, **options):
        model = get_model()
        sizes = [int(b) for b in batches.split(",")]
        report = {}
        for width, height in settings.IMAGEGEN_SIZE_MENU:
            if width % 8 or height % 8:
                continue
            per_batch = {b: images_per_second(model, width, height, steps, b, max(images, b)) for b in sizes}
            cap = suggest_cap(per_batch, min_gain)
            report[f"{width}x{height}"] = {"images_per_second": per_batch, "suggested_cap": cap}
            line = "  ".join(f"b{b}={v:.2f}/s" for b, v in per_batch.items())
            self.stdout.write(f"{width}x{height} steps={steps}: {line}  -> cap {cap}")
        caps = ",".join(f"{size}:{r['suggested_cap']}" for size, r in report.items())
        self.stdout.write(f"IMAGEGEN_BATCH_CAPS={caps}")
        if as_json:
            self.stdout.write(json.dumps(report))
