"""``python -m autograder practice NOTEBOOK``: a learner's own notebook, measured the way the grader
measures it, before it is submitted.

:func:`practice` copies the course's assessment into a private folder (``build/autograder_practice/``),
puts the notebook there as the only submission, and grades it with
:func:`autograder.grade.grade_course`: the same validation and restoring of locked cells, the same
sandbox where this machine allows it, the same clock, and the same held-out measurement of the
weights the run saved. :func:`summary` turns the verdict into what the grader would say.

What practice does not do: it issues no certificate (the private course has no signing key, and a
practice verdict is not recorded in the course's gradebook), and its held-out draw is its own (on
generated data the grader measures on a private draw seeded by the course's secret; the practice
folder has a secret of its own, so a practice run cannot tell a learner the real one's answers).
The private folder is removed afterwards unless ``keep`` is set.
"""

from __future__ import annotations

from pathlib import Path

STUDENT = "you"


class PracticeError(ValueError):
    """Bad input for a practice run; the message names the fix, in one line."""


def _check_notebook(notebook: Path) -> None:
    import nbformat

    if not notebook.is_file():
        raise PracticeError(f"no notebook {notebook}: pass the path of your assessment.ipynb")
    if notebook.suffix != ".ipynb":
        raise PracticeError(f"{notebook} is not a notebook (.ipynb): pass your assessment.ipynb")
    try:
        nbformat.read(notebook, as_version=4)
    except Exception as error:  # nbformat raises several kinds for a damaged file
        raise PracticeError(f"{notebook} is not a readable notebook ({type(error).__name__}): save it again "
                            "from Jupyter, or start again from your copy of the release") from None


def practice(notebook, profile, *, assignment: str = "assessment", work_root=None, keep: bool = False,
             timeout_s: float | None = None, isolate: bool = True, log=print):
    """Grade ``notebook`` alone, as the grader would, in a private copy of the course; the :class:`Verdict`."""
    import nbformat

    from autograder import grade as grading

    notebook = Path(notebook).resolve()
    _check_notebook(notebook)
    verdicts = grading.grade_in_private_copy({STUDENT: nbformat.read(notebook, as_version=4)}, profile,
                                             kind="practice", assignment=assignment, work_root=work_root, keep=keep,
                                             isolate=isolate, timeout_s=timeout_s, log=log)
    if len(verdicts) != 1:
        raise RuntimeError(f"practice graded {len(verdicts)} submissions, expected one")
    return verdicts[0]


def summary(verdict) -> str:
    """What the grader would say about the verdict, and what practice leaves out."""
    lines = [f"{'PASS' if verdict.passed else 'FAIL'} on profile {verdict.profile} ({verdict.workers} workers): "
             f"{verdict.reason or 'every check held'}"]
    if verdict.accuracy is not None:
        reached = (f"reached at {verdict.reached_seconds:.0f} s" if verdict.reached_seconds is not None
                   else "not reached")
        lines.append(f"held-out accuracy: best {verdict.accuracy:.3f}, target {verdict.target_accuracy:.3f} for two "
                     f"epochs in a row, {reached} (budget {verdict.time_budget_s:.0f} s)")
    for epoch in verdict.epochs:
        accuracy = "not measured" if epoch["accuracy"] is None else f"{epoch['accuracy']:.3f}"
        lines.append(f"  epoch {epoch['epoch']}: {accuracy} at {epoch['seconds']:.0f} s"
                     + (f" (rejected: {epoch['rejected']})" if epoch.get("rejected") else ""))
    lines.append(f"tests: {verdict.score:.1f} of {verdict.max_score:.0f} points; the notebook ran "
                 f"{verdict.notebook_seconds:.0f} s ({verdict.isolation or 'no sandbox'})")
    if verdict.review:
        lines.append(f"the grader would hold it for review: {verdict.review}")
    lines.append("practice only: no certificate, nothing recorded in the course's gradebook")
    return "\n".join(lines)
