"""An assignment's outcome: what the grader measures once a run has ended, and whether it passes.

The pipeline (:mod:`autograder.grade`) is the same for every assignment: validate, rebuild, run,
check the tests cleanly, measure, grade. What a run must *achieve* is the assignment's, and the
pipeline asks for it in one place, the *measure* step, through the object :data:`OUTCOMES` names
for the assignment (by its folder name in ``source/``). An outcome is a class with three methods:

- ``parameters(profile) -> dict``: what the notebook's ``parameters`` cell is told beside the
  grader's own ``workers``, ``profile``, ``data_dir`` and ``output_dir`` (the assessment: its
  target accuracy and time budget);
- ``open(context: Context) -> None``: once per cohort, in the grader's process, before any run
  (the assessment builds its measuring model on the held-out images here);
- ``judge(run: autograder.sandbox.RunResult, evidence_dir: Path | None) -> Judgement``: once per
  run, from what the grader itself took from the run (the epoch files the watchdog copied, the
  times it saw them, the workers it saw, and the evidence files below), never from what the run
  printed. It may be called from several threads at once.

and may declare ``evidence = (name_regex, max_bytes)``: files of the run's ``output_dir`` it reads
besides the epoch files. After the run, the grader copies those (regular files the Horovod
workers' user wrote, at most ``max_bytes`` each and 64 MB in all, no link followed:
:func:`autograder.runners.copy_evidence`) into a folder of its own, ``evidence_dir``; without the
attribute, ``evidence_dir`` is None. A ``Judgement.record`` entry that is not a field of the
record (:class:`autograder.grade.Verdict`) is kept in the record's ``measured``.

:class:`AccuracyInTime` is the assessment's: held-out accuracy of every saved epoch
(:class:`autograder.measure.Measurer`), at or above the target for two consecutive epochs, the
second seen within the time budget (:func:`autograder.measure.decide`).
:class:`mgpu.assessment_zero1.ShardedOptimizer` is Assessment B's (``zero1``): the weights against the
grader's reference run, the optimizer state each worker held and the bytes sent per step, decided from
the evidence files the protected loop wrote. Another assignment adds its own class (anywhere
importable) and one line to :data:`OUTCOMES`; nothing else changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from autograder import course as course_mod
from autograder import measure
from mgpu import assessment
from mgpu.assessment_zero1 import ShardedOptimizer


@dataclass(frozen=True, eq=False)
class Context:
    """What the grader prepared for the cohort that an outcome may measure with."""

    profile: assessment.Profile
    x_heldout: np.ndarray        # images no run ever sees (the test split, or a private draw)
    y_heldout: np.ndarray
    image_shape: tuple
    num_classes: int
    heldout: str                 # what they are, in words (for the outcome cell)
    dataset_name: str


@dataclass
class Judgement:
    """An outcome's verdict on one run."""

    passed: bool
    reason: str                  # one line: why it failed, or what it reached
    lines: list[str] = field(default_factory=list)  # the outcome cell's text, before its last line (PASSED/NOT REACHED)
    #: fields of the submission's record (:class:`autograder.grade.Verdict`) to set, e.g. epochs, accuracy;
    #: any other entry goes into the record's ``measured``
    record: dict = field(default_factory=dict)


class AccuracyInTime:
    """The assessment's outcome: held-out accuracy >= target for 2 consecutive epochs, within the budget."""

    def parameters(self, profile: assessment.Profile) -> dict:
        return {"time_budget_s": float(profile.time_budget_s), "target_accuracy": float(profile.target_accuracy)}

    def open(self, context: Context) -> None:
        self.context = context
        self.measurer = measure.Measurer(context.x_heldout, context.y_heldout, context.image_shape,
                                         context.num_classes)

    def judge(self, run, evidence_dir=None) -> Judgement:
        profile, context = self.context.profile, self.context
        epochs = self.measurer.measure(run.epoch_files, run.epoch_seen_s, run.epoch_rejected)
        outcome = measure.decide(epochs, profile.target_accuracy, profile.time_budget_s,
                                 first_epoch_accuracy=profile.first_epoch_accuracy)
        lines = [f"Measured by the grader on {context.heldout} ({context.dataset_name}); target "
                 f"{profile.target_accuracy:.3f} for {assessment.CONSECUTIVE_EPOCHS} consecutive epochs "
                 f"within {profile.time_budget_s:.0f} s.",
                 "epoch  seen at (s)  accuracy"]
        lines += [f"{e.epoch:5d}  {e.seconds:11.1f}  " + (f"{e.accuracy:.3f}" if e.accuracy is not None
                                                           else f"rejected: {e.rejected}")
                  for e in outcome.epochs]
        record = {"epochs": [asdict(e) for e in outcome.epochs], "accuracy": outcome.best_accuracy,
                  "reached_seconds": outcome.reached_seconds, "review": outcome.review}
        return Judgement(outcome.passed, outcome.reason, lines, record)


#: Each assignment's outcome class, by the assignment's name (its folder in ``source/``).
OUTCOMES = {"assessment": AccuracyInTime, "zero1": ShardedOptimizer}


def outcome_for(assignment: str):
    """A new outcome object for ``assignment``; CourseError (one line) when none is declared."""
    try:
        return OUTCOMES[assignment]()
    except KeyError:
        raise course_mod.CourseError(f"no outcome declared for assignment {assignment!r}: add its class to "
                                     f"autograder.outcomes.OUTCOMES (declared: {', '.join(sorted(OUTCOMES))})") \
            from None
