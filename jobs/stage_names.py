"""How a failure reason names each stage of a job ("the image safety check was interrupted 3
times"). Written once here, below the actions, so the stage table (jobs/pipeline/stages.py) and
the actions that fail a stage's jobs (jobs/actions/stages.py) read the same words."""

from __future__ import annotations

DESCRIBES: dict[str, str] = {
    "rewrite": "rewriting the prompt",
    "generate": "generation",
    "classify": "the image safety check",
    "publish": "publishing the images",
}
