"""How a job that allows degrading runs when its model's wait would refuse it (issue 48).

Two ways, each a rung: fewer steps on the model asked for (its `degrade_steps`), or its
distilled student (the model's `serving.json` `student`, on the student's own lane, at the
student's default steps and guidance). The rungs are ranked by the quality each is measured to
draw (`kinds_right` in each model's `serving.json`, scheduling/catalogue.py): the student goes
first only when its figure at its steps beats the teacher's at the degraded steps. The first
rung whose own lane's wait admits the job takes it; a rung below the first is still better than
a 429 for a job that said it accepts less. So a student that does not beat the teacher's
degraded steps takes only jobs that fewer steps would not have saved.

A student is a rung only when it is served, its quality at its steps is recorded, and the job
can run on it (no negative prompt to a student that takes none). Without one, this is the
degrade of before: fewer steps, or a 429.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduling import catalogue, scheduler


@dataclass(frozen=True)
class Rung:
    model_version: str
    steps: int
    guidance_scale: float
    variant: str  # the lever variant (gpu_tasks/levers.py): the job's own on the teacher, none on the student
    kinds_right: float | None  # measured at these steps; None: not measured
    shape: str  # its bucket (scheduling/scheduler.py shape_key), on its model's lane
    student: bool = False


def ranked(fewer_steps: Rung | None, student: Rung | None) -> list[Rung]:
    """The rungs best first: the student ahead of fewer steps only when both are measured and the
    student's figure is higher (a tie keeps the model asked for)."""
    if student is None:
        return [fewer_steps] if fewer_steps is not None else []
    if fewer_steps is None:
        return [student]
    s, t = student.kinds_right, fewer_steps.kinds_right
    beats = s is not None and t is not None and s > t
    return [student, fewer_steps] if beats else [fewer_steps, student]


def choose(rungs: Sequence[Rung], eta_of: Callable[[Rung], float | None], limit: float) -> Rung | None:
    """The first rung whose wait (eta_of: seconds, None when its lane has no live worker) is within
    `limit`; None: none is. Each rung's wait is asked for only when the rungs above it refused."""
    for rung in rungs:
        eta = eta_of(rung)
        if eta is not None and eta <= limit:
            return rung
    return None


def rungs(model_version: str, width: int, height: int, steps: int, guidance_scale: float, variant: str,
          negative_prompt: str, degrade_steps: int) -> list[Rung]:
    """The ranked ways down for a job of `model_version` asking `steps` (degrade_steps: the
    model's, jobs/pipeline/submit.py _degrade_steps)."""
    served = catalogue.get(model_version)
    fewer = None
    if steps > degrade_steps > 0:
        fewer = Rung(model_version, degrade_steps, guidance_scale, variant,
                     served.kinds_right_at(degrade_steps) if served is not None else None,
                     scheduler.shape_key(model_version, width, height, degrade_steps, guidance_scale, variant))
    return ranked(fewer, student_rung(model_version, width, height, negative_prompt))


def student_rung(model_version: str, width: int, height: int, negative_prompt: str = "") -> Rung | None:
    """The model's student as a rung, or None (none declared or served, its quality not recorded,
    or a negative prompt it cannot take)."""
    served = catalogue.get(model_version)
    student = catalogue.get(served.student) if served is not None and served.student else None
    if student is None or student.version == model_version:
        return None
    if negative_prompt and not student.negative_prompt:
        return None
    quality = student.kinds_right_at(student.default_steps)
    if quality is None:
        return None
    steps, guidance = student.default_steps, student.guidance_scale
    return Rung(student.version, steps, guidance, "", quality,
                scheduler.shape_key(student.version, width, height, steps, guidance, ""), student=True)
