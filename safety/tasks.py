from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(name="safety.tasks.check_prompt", acks_late=True)
def check_prompt(job_id: str) -> str:
    """The prompt gate, on the cpu queue, before any GPU time is spent."""
    from safety.gate import gate_prompt

    return gate_prompt(job_id)
