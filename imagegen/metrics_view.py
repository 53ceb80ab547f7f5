"""GET /metrics: Prometheus text, gathered from Redis (counters, histograms) and computed
gauges (queue, workers, review queue, jobs in each status, stored bytes, views)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import threading
import time

from django.conf import settings
from django.db.models import Count, Sum
from django.http import HttpResponse, JsonResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from imagegen import metrics


def _labelled(family, labels: dict, value, names: list[str]):
    family.add_metric([str(labels.get(n, "")) for n in names], value)


class ImagegenCollector:
    def collect(self):
        yield from self._counters()
        yield from self._histograms()
        yield from self._queue()
        yield from self._workers()
        yield from _cached_database(self._database)

    def _workers(self):
        """Per-node liveness (scheduling/liveness.py), live consumers of every routed queue (0:
        a queue nobody consumes) and the messages waiting in each on the broker."""
        from scheduling import liveness

        nodes = liveness.nodes()
        up = GaugeMetricFamily("imagegen_worker_up", "1 while a Celery worker's heartbeat is fresh, 0 after it stopped (kept an hour)",
                               labels=["worker", "queues"])
        age = GaugeMetricFamily("imagegen_worker_heartbeat_age_seconds", "Seconds since each worker's last heartbeat", labels=["worker"])
        for node, info in sorted(nodes.items()):
            up.add_metric([node, ",".join(info["queues"])], 1.0 if info["live"] else 0.0)
            age.add_metric([node], round(info["age"], 3))
        yield up
        yield age
        expected = expected_queues()
        consumers = GaugeMetricFamily("imagegen_queue_consumers", "Live workers consuming each routed queue", labels=["queue"])
        for queue, n in sorted(liveness.consumers(expected).items()):
            consumers.add_metric([queue], n)
        yield consumers
        depth = GaugeMetricFamily("imagegen_queue_messages", "Messages waiting on the broker in each routed queue", labels=["queue"])
        for queue, n in sorted(broker_depths(expected).items()):
            depth.add_metric([queue], n)
        yield depth

    def _counters(self):
        from jobs.media.cache import stats

        counters = metrics.read_counters()
        cache = stats()
        counters.setdefault("imagegen_cache_hits_total", {})["{}"] = cache["hits"]
        counters.setdefault("imagegen_cache_misses_total", {})["{}"] = cache["misses"]
        for name, series in sorted(counters.items()):
            label_names = sorted({k for lk in series for k in json.loads(lk)})
            family = CounterMetricFamily(name.removesuffix("_total"), HELP.get(name, name), labels=label_names)
            for lk, value in series.items():
                _labelled(family, json.loads(lk), value, label_names)
            yield family

    def _histograms(self):
        for name, series in sorted(metrics.read_histograms().items()):
            label_names = sorted({k for lk in series for k in json.loads(lk)})
            family = HistogramMetricFamily(name, HELP.get(name, name), labels=label_names)
            for lk, parts in series.items():
                labels = json.loads(lk)
                buckets = [(str(le), parts.get(str(le), 0.0)) for le in metrics.BUCKETS[name]]
                buckets.append(("+Inf", parts.get("+Inf", 0.0)))
                family.add_metric([str(labels.get(n, "")) for n in label_names], buckets, parts.get("sum", 0.0))
            yield family

    def _queue(self):
        from imagegen.redis_client import get_redis
        from scheduling import scheduler
        from scheduling.costs import COST_KEY, seconds_per_image
        from scheduling.heartbeats import busy_fractions, live_workers

        model = settings.IMAGEGEN_MODEL_NAME
        costs = get_redis().hgetall(COST_KEY)
        depth = GaugeMetricFamily("imagegen_queue_images", "Images waiting, per model and shape", labels=["model", "shape"])
        depth_s = GaugeMetricFamily("imagegen_queue_gpu_seconds", "GPU-seconds of work waiting, per model and shape", labels=["model", "shape"])
        total_seconds = 0.0
        for shape, entries in scheduler.queued_entries(model).items():
            images = sum(c for _, c, _ in entries)
            seconds = images * seconds_per_image(shape, costs)
            total_seconds += seconds
            depth.add_metric([model, shape], images)
            depth_s.add_metric([model, shape], seconds)
        yield depth
        yield depth_s
        workers = live_workers(model)
        active = GaugeMetricFamily("imagegen_gpu_workers", "Live GPU workers (heartbeats)", labels=["model"])
        active.add_metric([model], len(workers))
        yield active
        signal = GaugeMetricFamily(
            "imagegen_queued_gpu_seconds_per_gpu",
            "The autoscaling signal: queued GPU-seconds per live GPU worker (queued seconds when none)",
            labels=["model"],
        )
        signal.add_metric([model], total_seconds / max(1, len(workers)))
        yield signal
        busy = GaugeMetricFamily("imagegen_gpu_busy_fraction", "Fraction of the last minute each GPU worker spent in passes", labels=["worker"])
        for worker, fraction in busy_fractions(model).items():
            busy.add_metric([worker], fraction)
        yield busy

    def _database(self):
        # imagegen_jobs_total and imagegen_safety_decisions_total are counters kept in Redis
        # (imagegen.metrics.count_jobs / count_verdicts): counted from rows, they fell when
        # rows were deleted. What is here now is gauges: the current state of the rows.
        from jobs.actions import queue_ages, review_queue
        from jobs.models import GeneratedImage, GenerationJob

        current = GaugeMetricFamily("imagegen_jobs_in_status", "Jobs now in each status, by model version",
                                    labels=["status", "version"])
        for row in GenerationJob.objects.values("status", "model_version").annotate(n=Count("id")):
            current.add_metric([row["status"], row["model_version"]], row["n"])
        yield current
        waiting = GaugeMetricFamily("imagegen_stage_queue_age_seconds",
                                    "How long the oldest batch waiting (unstarted) in each batch stage's queue has waited",
                                    labels=["stage"])
        for stage, age in queue_ages().items():
            waiting.add_metric([stage], age)
        yield waiting
        review = GaugeMetricFamily("imagegen_review_queue_depth", "Cases waiting for a moderator")
        review.add_metric([], review_queue().count())
        yield review
        stored = GaugeMetricFamily("imagegen_stored_bytes", "Bytes of stored images per tier", labels=["tier"])
        for row in GeneratedImage.objects.values("tier", "cold").annotate(b=Sum("byte_size")):
            stored.add_metric([f"{row['tier']}{'-cold' if row['cold'] else ''}"], row["b"] or 0)
        yield stored
        views = HistogramMetricFamily("imagegen_views_per_image", "Views per stored image")
        edges = (0, 1, 2, 5, 10, 100, 1000)
        qs = GeneratedImage.objects.exclude(tier="deleted")
        buckets = [(str(le), qs.filter(views__lte=le).count()) for le in edges]
        buckets.append(("+Inf", qs.count()))
        views.add_metric([], buckets, qs.aggregate(s=Sum("views"))["s"] or 0)
        yield views


HELP = metrics.HELP


def expected_queues() -> set[str]:
    """Every queue of the routing table, a lane's template for each served lane."""
    from imagegen.stage_table import routed_queues
    from scheduling.lanes import served_lanes

    lanes = served_lanes()
    return {q.format(lane=lane) for q in routed_queues() for lane in (lanes if "{lane}" in q else [""])}


def broker_depths(queues: set[str]) -> dict[str, int]:
    """Messages ready in each queue, asked of the broker (Redis or RabbitMQ) through kombu; a
    queue it cannot answer for is left out."""
    from imagegen.celery import app

    depths: dict[str, int] = {}
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            channel = conn.default_channel
            for queue in sorted(queues):
                try:
                    depths[queue] = int(channel.queue_declare(queue=queue, passive=True).message_count)
                except Exception:  # not declared yet: nothing was ever sent to it
                    depths[queue] = 0
                    channel = conn.channel()
    except Exception:
        return depths
    return depths

# The database gauges are full-table aggregates: computed at most once per
# IMAGEGEN_METRICS_CACHE_SECONDS per process, whoever scrapes. Counters and the queue (Redis) stay live.
_cache_lock = threading.Lock()
_cache: dict = {"at": -1e18, "families": []}


def _cached_database(compute):
    ttl = settings.IMAGEGEN_METRICS_CACHE_SECONDS
    with _cache_lock:
        if ttl <= 0 or time.monotonic() - _cache["at"] >= ttl:
            _cache["families"] = list(compute())
            _cache["at"] = time.monotonic()
        return list(_cache["families"])


def _bearer(request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def operator_access(request) -> bool:
    """The caller may read /metrics and /readyz's details: `Authorization: Bearer
    <IMAGEGEN_METRICS_TOKEN>`, or a client address in IMAGEGEN_METRICS_ALLOW (CIDRs). The
    address is the throttles' (DRF's: the peer, which the deploy files leave to uvicorn: it reads
    X-Forwarded-For only from IMAGEGEN_TRUSTED_PROXIES, and IMAGEGEN_NUM_PROXIES=0)."""
    from rest_framework.throttling import BaseThrottle

    token = settings.IMAGEGEN_METRICS_TOKEN
    given = _bearer(request)
    if token and given and hmac.compare_digest(given.encode(), token.encode()):
        return True
    try:
        peer = ipaddress.ip_address(BaseThrottle().get_ident(request) or "")
    except ValueError:
        return False
    return any(peer in ipaddress.ip_network(net, strict=False) for net in settings.IMAGEGEN_METRICS_ALLOW)


def metrics_view(request):
    if not operator_access(request):
        response = JsonResponse({"detail": "/metrics needs Authorization: Bearer <IMAGEGEN_METRICS_TOKEN> "
                                           "or an address in IMAGEGEN_METRICS_ALLOW."}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ImagegenCollector())
    started = time.monotonic()
    body = generate_latest(registry)
    body += f"# scrape took {time.monotonic() - started:.3f}s\n".encode()
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
