from django.apps import AppConfig


class GpuTasksConfig(AppConfig):
    name = "gpu_tasks"

    def ready(self) -> None:
        from gpu_tasks import worker  # noqa: F401  (connects the worker signals)
