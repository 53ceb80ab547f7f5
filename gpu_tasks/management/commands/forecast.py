import json
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from scheduling.forecast import Inputs, forecast


class Command(BaseCommand):
    help = "Pre-launch cost forecast from the measured (or given) per-step time of the served model."

    def add_arguments(self, parser):
        parser.add_argument("--images-per-day", type=float, required=True)
        parser.add_argument("--gpu-hour-price", type=float, required=True, help="dollars per GPU-hour")
        parser.add_argument("--steps", type=int, default=settings.IMAGEGEN_DEFAULT_STEPS)
        parser.add_argument("--size", default="", help="WxH (default: the first menu size)")
        parser.add_argument("--utilization", type=float, default=0.5)
        parser.add_argument("--cache-hit-rate", type=float, default=0.0)
        parser.add_argument("--step-ms", type=float, default=None, help="skip measuring: ms per image-step at batch 1")
        parser.add_argument("--batches", default="1,2,4,8", help="batch sizes to measure")
        parser.add_argument("--peak-factor", type=float, default=3.0, help="peak over mean submit rate")
        parser.add_argument("--rewrite-ms", type=float, default=None,
                            help="skip measuring the prompt rewriter: ms per prompt at its batch (0: no rewriter)")
        parser.add_argument("--rewrite-share", type=float, default=1.0, help="share of jobs the rewriter rewrites")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print only the JSON")

    def handle(self, *args, **o):
        if not 0 < o["utilization"] <= 1 or not 0 <= o["cache_hit_rate"] < 1:
            raise CommandError("--utilization must be in (0, 1] and --cache-hit-rate in [0, 1)")
        width, height = (int(v) for v in o["size"].lower().split("x")) if o["size"] else settings.IMAGEGEN_SIZE_MENU[0]
        measured = {}
        if o["step_ms"] is not None:
            step1 = best = o["step_ms"] / 1000
            best_batch = 1
            bytes_per_image = width * height * 1.5  # PNG of a generated image: about half the raw bytes
        else:
            step1, best, best_batch, bytes_per_image, measured = self._measure(width, height, o["steps"], o["batches"])
        result = forecast(Inputs(
            images_per_day=o["images_per_day"], gpu_hour_price=o["gpu_hour_price"], steps=o["steps"],
            step_seconds_batch1=step1, step_seconds_best=best, best_batch=best_batch,
            utilization=o["utilization"], cache_hit_rate=o["cache_hit_rate"], bytes_per_image=bytes_per_image,
            peak_factor=o["peak_factor"], rewrite_seconds_per_prompt=self._rewrite_seconds(o),
            rewrite_share=o["rewrite_share"],
        ))
        result["size"] = f"{width}x{height}"
        result["measured"] = measured
        result["models"] = self._per_model(o, width, height, step1, best, best_batch, bytes_per_image)
        if not o["as_json"]:
            self._table(result)
            self._models_table(result["models"])
        self.stdout.write(json.dumps(result, indent=None if o["as_json"] else 2))

    def _rewrite_seconds(self, o) -> float:
        """Seconds per prompt of the configured rewriter at IMAGEGEN_REWRITE_BATCH free-form
        prompts (best of three passes); 0 without a rewriter."""
        if o["rewrite_ms"] is not None:
            return o["rewrite_ms"] / 1000
        if not settings.IMAGEGEN_REWRITER_PATH:
            return 0.0
        from gpu_tasks.rewrite_stage import rewriter

        model = rewriter()
        prompts = [f"a vermilion pebble number {i} against a cerulean sky" for i in range(settings.IMAGEGEN_REWRITE_BATCH)]
        model.rewrite(prompts)  # warm-up
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            model.rewrite(prompts)
            best = min(best, time.perf_counter() - started)
        return best / len(prompts)

    def _per_model(self, o, width, height, step1, best, best_batch, bytes_per_image) -> list[dict]:
        """Each served version at its own default steps: GPU-seconds and price per image. The
        default version reuses the figures above; another is measured on its own pipeline
        (with --step-ms, the same per-step time is assumed for every version)."""
        from scheduling import catalogue

        rows = []
        for served in catalogue.served().values():
            steps = o["steps"] if served.default else served.default_steps
            s1, sb, bb = step1, best, best_batch
            if not served.default and o["step_ms"] is None:
                s1, sb, bb, _, _ = self._measure(width, height, steps, o["batches"], served.version, served.guidance_scale)
            r = forecast(Inputs(
                images_per_day=o["images_per_day"], gpu_hour_price=o["gpu_hour_price"], steps=steps,
                step_seconds_batch1=s1, step_seconds_best=sb, best_batch=bb, utilization=o["utilization"],
                cache_hit_rate=o["cache_hit_rate"], bytes_per_image=bytes_per_image, peak_factor=o["peak_factor"],
            ))
            rows.append({
                "version": served.version, "default": served.default, "steps": steps,
                "gpu_seconds_per_image": r["best_batch"]["gpu_seconds_per_image"],
                "cost_per_image": r["best_batch"]["cost_per_image"],
                "fleet_cost_per_image": r["best_batch"]["fleet_cost_per_image"],
                "fleet_gpus": r["best_batch"]["fleet_gpus"], "best_batch": bb,
            })
        return rows

    def _models_table(self, rows: list[dict]) -> None:
        self.stdout.write("")
        self.stdout.write(f"{'model version':24s} {'steps':>5s} {'GPU-s/image':>12s} {'$/image':>10s} {'$/image (fleet)':>16s}")
        for r in rows:
            self.stdout.write(f"{r['version'] + (' (default)' if r['default'] else ''):24s} {r['steps']:5d} "
                              f"{r['gpu_seconds_per_image']:12.4g} {r['cost_per_image']:10.6f} {r['fleet_cost_per_image']:16.6f}")

    def _measure(self, width, height, steps, batches, version=None, guidance=None):
        from gpu_tasks.pipeline import Row, get_model
        from jobs.media.encoding import encode

        model = get_model(version)
        per_step = {}
        image = None
        for b in (int(x) for x in batches.split(",")):
            rows = [Row("forecast", i, f"a red circle on a blue background {i}", "", i) for i in range(b)]
            model.generate(rows, width, height, 2, guidance if guidance is not None else settings.IMAGEGEN_DEFAULT_GUIDANCE)  # warm-up
            started = time.perf_counter()
            images = model.generate(rows, width, height, steps, guidance if guidance is not None else settings.IMAGEGEN_DEFAULT_GUIDANCE)
            per_step[b] = (time.perf_counter() - started) / (b * steps)
            image = images[0]
        best_batch = min(per_step, key=per_step.get)
        return per_step[1] if 1 in per_step else per_step[min(per_step)], per_step[best_batch], best_batch, \
            len(encode(image).data), {"device": settings.IMAGEGEN_DEVICE, "seconds_per_image_step": per_step}

    def _table(self, r):
        i = r["inputs"]
        rows = [
            ("size, steps", f"{r['size']}, {i['steps']}"),
            ("GPU-s per image, batch 1", f"{r['batch_1']['gpu_seconds_per_image']:.4g}"),
            (f"GPU-s per image, batch {r['best_batch']['batch']}", f"{r['best_batch']['gpu_seconds_per_image']:.4g}"),
            ("busy GPUs (batch 1)", f"{r['batch_1']['busy_gpus']:,.1f}"),
            (f"fleet at {i['utilization']:.0%} utilisation", f"{r['batch_1']['fleet_gpus']:,.1f}"),
            ("cost per image (its GPU time)", f"${r['batch_1']['cost_per_image']:.6f}"),
            (f"cost per image with the idle fleet at {i['utilization']:.0%}", f"${r['batch_1']['fleet_cost_per_image']:.6f}"),
            ("cost per month (fleet)", f"${r['batch_1']['cost_per_month']:,.0f}"),
            ("GPU-s per image with the rewriter", f"{r['rewrite']['with']:.4g} (rewriter "
             f"{r['rewrite']['seconds_per_prompt'] * 1000:.2f} ms/prompt, {i['rewrite_share']:.0%} of jobs)"),
            ("storage per day", f"{r['storage_bytes_per_day'] / 1e9:,.2f} GB"),
            ("peak submits per second", f"{r['peak_submits_per_second']:,.1f}"),
            ("what if steps halved: fleet", f"{r['what_if']['steps_halved']['fleet_gpus']:,.1f}"),
            (f"what if best batch ({r['best_batch']['batch']}): fleet", f"{r['best_batch']['fleet_gpus']:,.1f}"),
            (f"what if cache hit rate {i['cache_hit_rate']:.0%}: fleet", f"{r['what_if']['cache_hit_rate']['fleet_gpus']:,.1f}"),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            self.stdout.write(f"{k.ljust(width)}  {v}")
