from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gpu_tasks.tiny_pipeline import FAMILIES, write_tiny_family


class Command(BaseCommand):
    help = ("Write a tiny, randomly initialised text-to-image pipeline (diffusers layout) of a family "
            "(sd15, sdxl, sd3, flux, pixart) to --out (or PATH). No downloads: configs and local tokenizers.")

    def add_arguments(self, parser):
        parser.add_argument("path", nargs="?", default="")
        parser.add_argument("--out", default="", help="the folder to write (same as PATH)")
        parser.add_argument("--family", default="sd15", choices=FAMILIES)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--force", action="store_true", help="overwrite an existing pipeline")

    def handle(self, path, out, family, seed, force, **options):
        if not (out or path):
            raise CommandError("give the folder to write: --out DIR (or PATH)")
        folder = Path(out or path)
        if (folder / "model_index.json").exists() and not force:
            self.stdout.write(f"{folder} already holds a pipeline")
            return
        write_tiny_family(folder, family, seed=seed)
        self.stdout.write(f"wrote a tiny random {family} pipeline to {folder}")
