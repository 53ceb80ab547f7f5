import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpu_tasks.capacity import images_per_second, suggest_cap, suggest_fill_wait
from gpu_tasks.pipeline import LoadedModel, get_model


class Command(BaseCommand):
    help = ("Measure the served model's (or --model's) step time by batch size per menu size; suggest "
            "IMAGEGEN_BATCH_CAPS and IMAGEGEN_FILL_WAIT (a flat batch gain: cap 1, no fill wait).")

    def add_arguments(self, parser):
        parser.add_argument("--model", default="", help="a diffusers folder (default: IMAGEGEN_MODEL_PATH)")
        parser.add_argument("--steps", type=int, default=None, help="default: the model's default steps")
        parser.add_argument("--batches", default="1,2,4,8,16", help="batch sizes to try")
        parser.add_argument("--images", type=int, default=16, help="images per measurement")
        parser.add_argument("--min-gain", type=float, default=0.10, help="a doubling must gain this much")
        parser.add_argument("--sizes", default="", help="WxH,... (default: the menu)")
        parser.add_argument("--out", default="", help="also write the serving profile as JSON here")
        parser.add_argument("--model-version", default="", dest="model_version",
                            help="a served version (manage.py served_models): measure it and, with --write-serving, "
                            "keep its caps and fill wait in its serving.json, where its lane reads them")
        parser.add_argument("--write-serving", action="store_true", dest="write_serving",
                            help="merge batch_caps and fill_wait into the measured model's serving.json")
        parser.add_argument("--json", action="store_true", dest="as_json", help="also print the figures as JSON")

    def handle(self, model, steps, batches, images, min_gain, sizes, out, as_json=False, model_version="",
               write_serving=False, **options):
        from scheduling import catalogue

        if model_version:
            served = catalogue.get(model_version)
            if served is None:
                raise CommandError(f"{model_version!r} is not served here: {', '.join(catalogue.served())}")
            model, steps = str(served.path), steps or served.default_steps
        steps = steps or settings.IMAGEGEN_DEFAULT_STEPS
        loaded = LoadedModel(Path(model), settings.IMAGEGEN_DEVICE, model_version or None) if model else get_model()
        batch_sizes = [int(b) for b in batches.split(",")]
        menu = ([tuple(int(v) for v in s.split("x")) for s in sizes.split(",")] if sizes
                else settings.IMAGEGEN_SIZE_MENU)
        report = {}
        for width, height in menu:
            if width % 8 or height % 8:
                continue
            per_batch = {b: images_per_second(loaded, width, height, steps, b, max(images, b)) for b in batch_sizes}
            cap = suggest_cap(per_batch, min_gain)
            step_ms = {b: 1000.0 * b / ips / steps for b, ips in per_batch.items()}
            fill_wait = suggest_fill_wait(cap, step_ms[batch_sizes[0]] * steps / 1000.0)
            report[f"{width}x{height}"] = {"images_per_second": per_batch, "ms_per_step": step_ms,
                                           "suggested_cap": cap, "suggested_fill_wait": fill_wait}
            line = "  ".join(f"b{b}={v:.2f}/s ({step_ms[b]:.0f} ms/step)" for b, v in per_batch.items())
            self.stdout.write(f"{width}x{height} steps={steps}: {line}  -> cap {cap}, fill wait {fill_wait:.2f}s")
        caps = ",".join(f"{size}:{r['suggested_cap']}" for size, r in report.items())
        fill = max((r["suggested_fill_wait"] for r in report.values()), default=0.0)
        self.stdout.write(f"IMAGEGEN_BATCH_CAPS={caps}")
        self.stdout.write(f"IMAGEGEN_FILL_WAIT={fill:.2f}")
        family = getattr(getattr(loaded, "family", None), "name", "simulated")
        profile = {"model": str(getattr(loaded, "path", "")), "family": family, "steps": steps, "sizes": report,
                   "IMAGEGEN_BATCH_CAPS": caps, "IMAGEGEN_FILL_WAIT": round(fill, 2)}
        if out:
            Path(out).write_text(json.dumps(profile, indent=2))
        if write_serving:
            folder = Path(model) if model else Path(settings.IMAGEGEN_MODEL_PATH)
            path = folder / "serving.json"
            current = json.loads(path.read_text()) if path.exists() else {}
            current["batch_caps"] = {size: r["suggested_cap"] for size, r in report.items()}
            current["fill_wait"] = round(fill, 2)
            path.write_text(json.dumps(current, indent=2) + "\n")
            self.stdout.write(f"wrote batch_caps and fill_wait to {path}")
        if as_json:
            self.stdout.write(json.dumps(report))
