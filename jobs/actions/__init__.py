"""Every write of a job's state goes through these named actions: the status, the reason, the
leases, the batch stage and the images' tier. Each is a compare-and-set on the current state,
and each sends its status events after commit. Views, consumers, the admin and the stage tasks
call them; they never dispatch a stage themselves (that is the tasks modules' job), except that
admitting a job to the scheduler wakes a GPU worker of its lane (scheduling.lanes.wake).

    lifecycle  created, admitted, claimed, renewed, requeued, cancelled, blocked, held, failed
    delivery   past the GPU: hand-off to quarantine, verdicts, publish, stuck stages
    review     moderators' decisions and appeals
    images     take-down and deletion
"""

from jobs.actions.delivery import (
    Outcome,
    Written,
    close_empty,
    finish_batch,
    hand_off,
    held_jobs,
    live_images,
    record_verdicts,
    requeue_stuck_batches,
)
from jobs.actions.images import delete_job, purge_deleted, take_down
from jobs.actions.lifecycle import (
    admit,
    attach_cached,
    block_job,
    cancel_job,
    cancel_past_deadline,
    claim_batch,
    create_queued,
    enqueue,
    fail_running,
    fail_unstarted,
    finish_from_cache,
    hold_for_review,
    images_to_make,
    move_queued,
    rebuild_scheduler_state,
    renew_leases,
    requeue_expired,
    return_to_queue_now,
    shape_of,
)
from jobs.actions.review import ReviewError, appeal, approve, reject, reject_delivered, review_queue

__all__ = [
    "Outcome", "ReviewError", "Written", "admit", "appeal", "approve", "attach_cached", "block_job", "cancel_job", "cancel_past_deadline",
    "claim_batch", "close_empty", "create_queued", "delete_job", "enqueue", "fail_running", "fail_unstarted",
    "finish_batch", "finish_from_cache", "hand_off", "held_jobs", "hold_for_review", "images_to_make", "live_images",
    "move_queued", "purge_deleted", "rebuild_scheduler_state", "record_verdicts", "reject", "reject_delivered", "renew_leases",
    "requeue_expired", "requeue_stuck_batches", "return_to_queue_now", "review_queue", "shape_of", "take_down",
]
