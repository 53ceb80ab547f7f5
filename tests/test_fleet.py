"""The fleet as deployed (scripts/fleet.py): every process type of deploy/Procfile on its own host
(a network namespace), PostgreSQL, Redis and S3 on a services host, HAProxy in front of two web
hosts, one GPU host on the shipped model (gpu2) and the others on the simulated accelerator.

Two fleets, one after the other (each torn down before the next is built):

- Redis as the broker: a burst of one-image jobs from several users goes through the load
  balancer, watched over SSE and websockets, while hosts are lost: every process of one GPU host
  SIGKILLed mid-pass, of the classify host (started again), of one web host (clients reconnect
  through the load balancer), the classify host's link down, the services host's Redis restarted
  empty, and a GPU host added with nothing but its Procfile line.
- RabbitMQ as the broker (a private node on the services host; Redis stays for the channel layer
  and the scheduler): a smaller burst through a GPU host's SIGKILL mid-pass and the classify
  host's kill (the work both held unacknowledged goes back to the queue).

Afterwards, on each: nothing is lost, delivered twice or public that should not be, and /metrics
agrees with the database. Before the burst, each door between hosts is tried from a web host and
a GPU host, and each is shut (Fleet.doors()).

Runs where the machine lets it build namespaces (root, iproute2; CI's .ci/run runs as root), else
it is skipped with the reason."""

from __future__ import annotations

import os

import pytest

from scripts.fleet import PREFIX, REAL_MODEL_HOST, can_run, open_doors, run

pytestmark = [pytest.mark.skipif(can_run() is not None, reason=f"no fleet here: {can_run()}"), pytest.mark.timeout(900)]

# broker -> (jobs, users, submit seconds, the faults it runs, a GPU host added)
BURSTS = {
    "redis": (36, 6, 60.0, ("kill gpu1", "kill classify", "kill web1", "classify link down", "restart redis"), True),
    "rabbitmq": (16, 4, 20.0, ("kill gpu1", "kill classify"), False),
}


# Which fleets this run builds (IMAGEGEN_TEST_FLEETS, default the Redis one; .ci/run builds both
# in its PostgreSQL pass). A fleet uses neither the run's database nor its Redis.
FLEETS = [b.strip() for b in os.environ.get("IMAGEGEN_TEST_FLEETS", "redis").split(",") if b.strip()]
if unknown := set(FLEETS) - set(BURSTS):
    raise ValueError(f"IMAGEGEN_TEST_FLEETS names no fleet: {sorted(unknown)} (known: {sorted(BURSTS)})")


@pytest.fixture(scope="module", params=FLEETS)
def fleet_run(request):
    from scripts.fleet import Fleet
    from scripts.fleet_burst import BURST_ENV, Burst, burst

    broker = request.param
    why = can_run(broker)
    if why:
        pytest.skip(f"no {broker} fleet here: {why}")
    jobs, users, seconds, faults, add_gpu = BURSTS[broker]
    spec = Burst(jobs=jobs, users=users, submit_seconds=seconds, deadline=200.0, fault_names=faults, add_gpu=add_gpu)
    # The report outlives the fleet: it is torn down before the next broker's is built.
    with Fleet(env=BURST_ENV, broker=broker) as fleet:
        fleet.up()
        report = burst(fleet, spec)
    left = [line for line in run("ip", "netns", "list").stdout.splitlines() + run("ip", "-o", "link", "show").stdout.splitlines()
            if f"{PREFIX}-" in line or f" {PREFIX}v" in line]
    assert not left, f"the fleet left namespaces or links behind: {left}"
    return broker, spec, report


def test_every_job_of_the_burst_reaches_one_terminal_status_through_the_faults(fleet_run):
    _, spec, report = fleet_run
    assert report["submitted"] == spec.jobs and not report["submit_errors"], report["submit_errors"]
    # Terminal, or held for a moderator (review: settled until a person decides, never public).
    assert not report["not_terminal"], report
    assert report["statuses"].get("done", 0) > 0, report["statuses"]
    assert "failed" not in report["statuses"], report["failed_reasons"]
    assert not report["over_attempts"]


def test_the_faults_all_happened(fleet_run):
    _, spec, report = fleet_run
    faults = {f["fault"]: f for f in report["faults"]}
    assert set(faults) == set(spec.fault_names) | ({"add gpu3"} if spec.add_gpu else set()), report["faults"]
    assert not [f for f in report["faults"] if "error" in f], report["faults"]
    assert faults["kill gpu1"]["jobs_in_pass"] > 0, "gpu1 was killed between passes"
    assert faults["kill gpu1"]["to_running_elsewhere_s"] is not None, "gpu1's work never ran elsewhere"
    if faults["kill classify"]["batches_at_gate"]:
        assert faults["kill classify"]["to_classified_s"] is not None, "the batches at the killed gate were never classified"
    if "kill web1" in faults and faults["kill web1"]["streams_dropped"]:
        assert faults["kill web1"]["to_streams_back_s"] is not None, (
            f"a stream on the killed web host never came back: {faults['kill web1']}")
    if spec.add_gpu:
        assert any(w.startswith("gpu3:") for w in report["gpu_duty_cycle"]), "the added GPU host took no work"


def test_no_process_exited_on_its_own(fleet_run):
    """The fleet starts a Procfile process again when it exits by itself (as a platform would);
    none needed to here: every process lost was killed by the burst."""
    _, _, report = fleet_run
    assert report["process_restarts"] == {}, report["process_restart_log"]


def test_the_shipped_model_host_and_the_simulated_hosts_both_generated_done_images(fleet_run):
    """gpu2 runs the real pipeline (models/shapes-v2 on CPU); the job's image rows name the
    worker whose pass made them."""
    _, spec, report = fleet_run
    by_host = report["done_by_host"]
    assert by_host.get(REAL_MODEL_HOST, 0) > 0, by_host
    if spec.add_gpu:  # gpu1 dies early; gpu3 joins on the simulated accelerator
        assert sum(n for h, n in by_host.items() if h != REAL_MODEL_HOST) > 0, by_host


def test_every_done_image_is_in_the_public_bucket_and_fetchable_through_the_load_balancer(fleet_run):
    _, _, report = fleet_run
    assert report["images_lost"] == 0, report["fetch_failures"]
    assert report["duplicate_images"] == 0
    assert report["public_not_done"] == 0


def test_nothing_held_or_blocked_is_public(fleet_run):
    _, _, report = fleet_run
    assert report["held_or_blocked_public"] == []


def test_watchers_see_the_terminal_status_exactly_once_and_as_the_database_has_it(fleet_run):
    _, _, report = fleet_run
    assert report["watchers"]["sse"] > 0 and report["watchers"]["websocket"] > 0
    assert report["watchers_terminal_not_once"] == []
    assert report["watchers_terminal_differs"] == []


def test_the_metrics_agree_with_the_database(fleet_run):
    _, _, report = fleet_run
    assert report["metrics_jobs_in_status"] == {k: float(v) for k, v in report["db_jobs_in_status"].items()}


def test_the_metrics_show_the_lost_gpu_host_silent_and_every_queue_consumed(fleet_run):
    """gpu1 was killed for good: its worker is not up (silent, or gone from the list: a Redis
    restart after the kill empties the heartbeats, and a dead host never heartbeats again); gpu3
    joined where it was added; every routed queue still has a live consumer (classify and web1
    were started again)."""
    _, spec, report = fleet_run
    up = report["metrics_workers_up"]
    assert [v for k, v in up.items() if k.endswith("@gpu1")] in ([], [0.0]), up
    if spec.add_gpu:
        assert [v for k, v in up.items() if k.endswith("@gpu3")] == [1.0], up
    consumers = report["metrics_queue_consumers"]
    assert {"cpu", "classify", "io", "webhooks", "gpu.shapes"} <= set(consumers), consumers
    assert all(n >= 1 for q, n in consumers.items() if q in {"cpu", "classify", "io", "webhooks", "gpu.shapes"}), consumers


def test_every_door_between_hosts_is_shut(fleet_run):
    """Issue 44, item 3: PostgreSQL trusted the whole subnet without a password, SeaweedFS's
    master, volume server and filer (which reads the quarantine bucket past the S3 identities)
    listened on every address, and web believed any client's X-Forwarded-For. From a web host and
    from a GPU host: PostgreSQL refuses no password, a wrong one and the superuser (and takes the
    application's: the hosts' DATABASE_URL carries it), SeaweedFS's own ports do not answer, S3
    refuses anonymous reads and lists of the quarantine bucket (and serves the public one, and the
    quarantine with the keys), and a web host reached directly does not let a forged
    X-Forwarded-For into /metrics' allow-list (which lets the scraper's own address in); through
    the load balancer neither; nothing else listens on the services host beyond its loopback."""
    _, _, report = fleet_run
    doors = report["doors"]
    assert set(doors["from"]) == {"web1", "gpu2"}, doors
    assert open_doors(doors) == [], doors
