"""`Prefer: wait=N` (RFC 7240) on POST /api/v1/jobs: the finished job when it ends within N
seconds, the usual 202 otherwise; the job goes on either way."""

from __future__ import annotations

import time

import pytest

from tests.conftest import admitted_to, wait_for_status, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {"prompt": "a green square on a white background", "width": 64, "height": 64, "steps": 2}


def test_a_fast_job_is_answered_200_with_its_images(workers, alice_api):
    response = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7001}, format="json", HTTP_PREFER="wait=60")
    assert response.status_code == 200, response.content
    job = response.json()
    assert job["status"] == "done" and len(job["images"]) == 1
    assert response["Preference-Applied"] == "wait=10"  # capped by IMAGEGEN_PREFER_WAIT_MAX


def test_a_job_that_does_not_end_in_time_is_answered_202_and_goes_on(alice_api, settings):
    settings.IMAGEGEN_PREFER_WAIT_MAX = 120  # a wait past the one asked would take longer than the bound below
    with admitted_to("nobody-serves-prefer"):
        started = time.monotonic()
        response = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7002}, format="json", HTTP_PREFER="wait=1")
        took = time.monotonic() - started
    assert response.status_code == 202 and response["Preference-Applied"] == "wait=1"
    assert 0.9 <= took < 60, took
    assert response.json()["status"] in ("queued", "running")
    assert wait_for_status(response.json()["id"], ("queued",), timeout=5).status == "queued"  # not cancelled


@pytest.mark.parametrize("header", ["", "respond-async", "wait=soon", "wait=-3", "wait=nan", "handling=lenient"])
def test_without_a_valid_wait_the_answer_is_the_usual_202_at_once(alice_api, header, settings):
    settings.IMAGEGEN_PREFER_WAIT_MAX = 120  # a wait applied by mistake would pass the bound below
    with admitted_to("nobody-serves-prefer"):
        started = time.monotonic()
        response = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7003}, format="json", HTTP_PREFER=header)
    assert response.status_code == 202 and "Preference-Applied" not in response
    assert time.monotonic() - started < 60


def test_one_user_holds_at_most_the_bound_of_waits_and_the_next_is_answered_at_once(alice, alice_api, settings):
    """Issue 44, item 6: held waits take the web process's threads; twenty from one user starved
    everyone else. Past IMAGEGEN_PREFER_WAIT_PER_USER held ones, a submit gets the usual 202 at
    once (no Preference-Applied); the held ones end when their jobs do."""
    import threading

    from jobs.api import prefer
    from jobs.models import GenerationJob
    from tests.conftest import client_for

    settings.IMAGEGEN_PREFER_WAIT_PER_USER = 2
    settings.IMAGEGEN_PREFER_WAIT_MAX = 120
    answers: list = []

    def held_submit(seed: int) -> None:
        answers.append(client_for(alice).post("/api/v1/jobs", {**BODY, "seed": seed}, format="json",
                                              HTTP_PREFER="wait=120"))

    with admitted_to("nobody-serves-prefer"):
        threads = [threading.Thread(target=held_submit, args=(7100 + i,)) for i in range(2)]
        for t in threads:
            t.start()
        wait_until(lambda: prefer.held(alice.pk) == 2, 60, "the two held waits")
        third = alice_api.post("/api/v1/jobs", {**BODY, "seed": 7102}, format="json", HTTP_PREFER="wait=120")
        assert third.status_code == 202 and "Preference-Applied" not in third
        for job in GenerationJob.objects.filter(owner=alice, seed__in=(7100, 7101)):
            assert alice_api.post(f"/api/v1/jobs/{job.id}/cancel").status_code in (200, 202)
        for t in threads:
            t.join(60)
    assert sorted(a.status_code for a in answers) == [200, 200]  # ended (cancelled) within their wait
    assert prefer.held(alice.pk) == 0


@pytest.mark.integration  # a server of its own
def test_a_client_that_leaves_while_waiting_releases_its_wait(worker_env):
    """Issue 44, item 6: a held wait kept its thread after its client had gone. Through uvicorn,
    with one held wait per user: the client leaves mid-wait, and the user's next submit is waited
    on again (before, the first wait held its place for its whole 300 s)."""
    import json
    import socket

    import httpx

    from jobs.access import tokens
    from jobs.models import GenerationJob
    from scripts.procs import stop_group
    from tests.conftest import make_user
    from tests.test_hardening_bodies import start_uvicorn

    user = make_user("prefer-leaver")
    token = tokens.issue(user, "t")
    server = start_uvicorn({**worker_env, "IMAGEGEN_PREFER_WAIT_PER_USER": "1", "IMAGEGEN_PREFER_WAIT_MAX": "300",
                            "IMAGEGEN_MODEL_NAME": "nobody-serves-prefer"}, name="uvicorn-prefer")
    try:
        body = json.dumps({**BODY, "seed": 7200}).encode()
        head = (f"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Token {token}\r\n"
                f"Content-Type: application/json\r\nPrefer: wait=300\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(head + body)
            # submitted: from now on it waits
            wait_until(lambda: GenerationJob.objects.filter(owner=user, seed=7200).exists(), 60, "the held submit")
        # The client has gone. Its wait ends, so a next submit is waited on (Preference-Applied).
        seeds = iter(range(7201, 7300))

        def waited_on() -> bool:
            again = httpx.post(f"{server.url}/api/v1/jobs", json={**BODY, "seed": next(seeds)}, timeout=30,
                               headers={"Authorization": f"Token {token}", "Prefer": "wait=0.1"})
            assert again.status_code == 202, again.text
            return again.headers.get("Preference-Applied") == "wait=0.1"

        wait_until(waited_on, 60, "the release of the wait whose client left", pause=0.2)
    finally:
        stop_group(server.proc, 10)
