from pathlib import Path

from django.core.management.base import BaseCommand

from gpu_tasks.tiny_pipeline import write_tiny_pipeline


class Command(BaseCommand):
    help = "Write a tiny, randomly initialised text-to-image pipeline (diffusers layout) to PATH."

    def add_arguments(self, parser):
        parser.add_argument("path")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--force", action="store_true", help="overwrite an existing pipeline")

    def handle(self, path, seed, force, **options):
        out = Path(path)
        if (out / "model_index.json").exists() and not force:
            self.stdout.write(f"{out} already holds a pipeline")
            return
        write_tiny_pipeline(out, seed=seed)
        self.stdout.write(f"wrote a tiny random pipeline to {out}")
