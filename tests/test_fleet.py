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
a GPU host, and each is shut (Fleet.doors()); and on each fleet, Debian's chromium
signs in through the load balancer (TLS), submits a job on the page and shows the delivered image,
served from the fleet's S3 through the balancer as a CDN would, on the job's card and in the gallery.

Runs where the machine lets it build namespaces (root, iproute2; CI's .ci/run runs as root), else
it is skipped with the reason."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

from scripts.fleet import LB_IP, PREFIX, PUBLIC_BUCKET, REAL_MODEL_HOST, can_run, open_doors, run
from tests.test_web_page import CHROMIUM, CHROMIUM_ARGS

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
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def page_through_the_load_balancer(fleet, tries: int = 4) -> dict:
    """Issue 44, item 1: the page as a visitor sees it, through HAProxy's TLS in front of the two
    web hosts, with the images in the fleet's S3 (served by the balancer under /imagegen-public/,
    the absolute URLs a bucket deployment gives). Chromium runs in this (the root) namespace,
    which reaches the balancer over the bridge; the balancer's certificate is the fleet's own, so
    the context ignores HTTPS errors. Sign in, submit, wait for the job to settle; what the card's
    final image and the gallery's tile show is read back (naturalWidth > 0: the browser decoded
    the pixels). The fleet's image gate blocks or holds a share of its shapes (a few of each
    burst): a job it stops is submitted again, up to `tries` jobs, since what is checked here is
    the delivered image. Every failure is reported in the result rather than raised, so the
    burst still runs; the browser is closed either way."""
    if not os.path.exists(CHROMIUM):
        return {"skipped": f"{CHROMIUM} is missing"}
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"skipped": "playwright is not installed"}
    started = time.monotonic()
    name, password = "page-visitor", secrets.token_hex(12)
    seen: dict = {"errors": [], "failed_requests": [], "jobs": []}
    try:
        fleet.python("beat", "from django.contrib.auth import get_user_model\n"
                             f"get_user_model().objects.create_user({name!r}, password={password!r})\n")
    except Exception as exc:  # an operator's one-off failed: reported like the page's failures
        return {**seen, "error": f"could not make the visitor's account: {exc}"[:2000]}
    settled = "['done', 'blocked', 'failed', 'cancelled', 'review'].includes(document.getElementById('current-status').dataset.status)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--no-proxy-server"], headless=True)
        try:
            context = browser.new_context(viewport={"width": 1200, "height": 900}, ignore_https_errors=True)
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.on("pageerror", lambda exc: seen["errors"].append(str(exc)))
            page.on("requestfailed", lambda req: seen["failed_requests"].append(f"{req.url}: {req.failure}"))
            try:
                page.goto(f"{fleet.url}/accounts/login/")
                page.get_by_label("Username").fill(name)
                page.get_by_label("Password").fill(password)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(f"{fleet.url}/")
                for _ in range(tries):
                    before = page.evaluate("window.imagegen.current.job && window.imagegen.current.job.id")
                    page.get_by_label("Prompt", exact=True).fill("a red circle on a blue background")
                    page.get_by_label("Steps").fill("12")
                    page.get_by_role("button", name="Generate").click()
                    page.wait_for_function("(before) => window.imagegen.current.job && window.imagegen.current.job.id !== before",
                                           arg=before)
                    page.wait_for_function(settled)
                    job_id, status = page.evaluate("[window.imagegen.current.job.id, window.imagegen.current.job.status]")
                    seen["jobs"].append([job_id, status])
                    if status == "done":
                        break
                seen["status"] = seen["jobs"][-1][1]
                if seen["status"] == "done":
                    final = "document.querySelector('#results img.final')"
                    page.wait_for_function(f"{final} !== null && {final}.complete && {final}.naturalWidth > 0")
                    seen["final"] = page.evaluate(f"[{final}.getAttribute('src'), {final}.naturalWidth]")
                    tile = f"document.querySelector('.gallery .tile[data-job=\"{seen['jobs'][-1][0]}\"] img')"
                    page.wait_for_function(f"{tile} !== null && {tile}.complete && {tile}.naturalWidth > 0")
                    seen["tile"] = page.evaluate(f"[{tile}.getAttribute('src'), {tile}.naturalWidth]")
            except Exception as exc:  # judged by the test, with what the page showed
                seen["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "fleet_page.png"), full_page=True)
            context.close()
        finally:
            browser.close()
    seen["seconds"] = round(time.monotonic() - started, 1)
    return seen


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
        # On every fleet (its web hosts' broker is part of what is deployed), before the burst.
        page = page_through_the_load_balancer(fleet)
        report = {**burst(fleet, spec), "page": page}
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


def test_the_page_through_the_load_balancer_shows_the_image_from_the_bucket(fleet_run):
    """Issue 44, item 1: with the images in object storage the page's URLs are absolute (here the
    balancer's /imagegen-public/, as a CDN domain would be); a visitor's chromium, through HAProxy
    and TLS, sees the job done and its image decoded on the card and in the gallery."""
    _, _, report = fleet_run
    page = report["page"]
    if "skipped" in page:
        pytest.skip(page["skipped"])
    assert "error" not in page, page
    assert page["status"] == "done", f"no job of the page's {len(page['jobs'])} was delivered: {page}"
    bucket = f"https://{LB_IP}/{PUBLIC_BUCKET}/"
    for where in ("final", "tile"):
        src, width = page[where]
        assert src.startswith(bucket) and width > 0, (where, page)
    assert page["errors"] == [], page
    print(f"the page through the load balancer: {page['seconds']} s, jobs {page['jobs']}")
