"""Every write of a job's state goes through these named actions: the status, the reason, the
leases, the batch stage and the images' tier. Each is a compare-and-set on the current state,
and each sends its status events after commit. Views, consumers, the admin and the stage tasks
call them; they never dispatch a stage themselves (that is the tasks modules' job), except that
admitting a job to the scheduler wakes a GPU worker of its lane (scheduling.lanes.wake).

    lifecycle  created, admitted, claimed, renewed, requeued, cancelled, blocked, held, failed
    delivery   past the GPU: hand-off to quarantine, verdicts, publish
    stages     a batch stage's lease: started, renewed, released, re-run or re-sent by the reaper
    review     moderators' decisions and appeals
    batches    a pass's own row: opened, sized, timed
    images     take-down and deletion, views, the retention tiers, regeneration
    verdicts   the prompt gate's verdict
    rewrites   the rewrite stage: waiting jobs claimed in one batch, the rewriter's prompt saved
"""

from jobs.actions.batches import (
    drop_unclaimed_batch,
    open_batch,
    pass_finished,
    pass_started,
    record_steering,
    size_batch,
)
from jobs.actions.delivery import (
    Outcome,
    Written,
    close_empty,
    finish_batch,
    hand_off,
    held_jobs,
    live_images,
    record_verdicts,
)
from jobs.actions.images import (
    delete_job,
    drain_unpublish,
    mark_bytes_dropped,
    mark_cold,
    mark_warm,
    purge_deleted,
    reconcile_public,
    record_views,
    settle_regeneration,
    take_down,
)
from jobs.actions.lifecycle import (
    admit,
    attach_cached,
    block_job,
    cancel_job,
    cancel_past_deadline,
    claim_batch,
    create_queued,
    enqueue,
    fail_rewrite,
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
    wake_rewriter,
)
from jobs.actions.review import ReviewError, appeal, approve, reject, reject_delivered, review_queue
from jobs.actions.rewrites import claim_rewrites, release_rewrites, save_rewrite
from jobs.actions.stages import (
    end_stage_lease,
    give_up_stage,
    observe_stage_seconds,
    pass_on,
    queue_ages,
    release_stage,
    renew_stage,
    requeue_stuck_batches,
    stage_waited,
    start_stage,
)
from jobs.actions.verdicts import record_prompt_verdict

__all__ = [
    "drop_unclaimed_batch", "record_views", "mark_bytes_dropped", "mark_cold", "mark_warm", "open_batch", "pass_finished",
    "pass_started", "record_prompt_verdict", "record_steering", "settle_regeneration", "size_batch",
    "Outcome", "ReviewError", "Written", "admit", "appeal", "approve", "attach_cached", "block_job", "cancel_job", "cancel_past_deadline",
    "claim_batch", "close_empty", "create_queued", "delete_job", "drain_unpublish", "reconcile_public", "enqueue", "fail_running", "fail_unstarted",
    "finish_batch", "finish_from_cache", "hand_off", "held_jobs", "hold_for_review", "images_to_make", "live_images",
    "move_queued", "purge_deleted", "rebuild_scheduler_state", "record_verdicts", "reject", "reject_delivered", "renew_leases",
    "requeue_expired", "requeue_stuck_batches", "end_stage_lease", "give_up_stage", "observe_stage_seconds",
    "claim_rewrites", "fail_rewrite", "release_rewrites", "save_rewrite", "wake_rewriter",
    "pass_on", "queue_ages", "release_stage", "renew_stage", "stage_waited", "start_stage", "return_to_queue_now", "review_queue", "shape_of", "take_down",
]
