"""Profile rows measured on the instructor's machine and kept in the course folder, not in the code.

``python -m autograder calibrate COURSE --profile P --workers N --dataset D --runs R`` grades the
reference solution R times through the real grader (:func:`autograder.grade.grade_course`: the same
sandbox, clock and held-out measurement a student's submission gets), one at a time, and derives a
row from what it measured (:func:`derive_row`):

- the target: the lowest, over the runs, of the best accuracy the reference held for
  :data:`mgpu.assessment.CONSECUTIVE_EPOCHS` epochs in a row, less a margin (``accuracy_margin``,
  or :data:`TARGET_Z` standard errors of one epoch's held-out accuracy when the held-out set is
  small: :func:`target_margin`), rounded down to a hundredth;
- the budget: ``margin`` times the slowest run's time to that target on the grader's clock, and at
  least :data:`START_SLACK_S` more than that time; the timeout 30 s more (the notebook's tests run
  after training); the memory limit four times the largest resident peak seen, rounded up to 500 MB;
- the calibration itself: the hardware (GPU model and count, or CPU model and cores), the library
  versions, the dataset's name and fingerprint, the date, the command, and every reference run's
  accuracy by epoch and times.

Rows go to ``COURSE/autograder/profiles.json`` (written whole through a temporary file). The
grader looks there first (:func:`resolve_profile`), then at the built-in practice rows of
:data:`mgpu.assessment.PROFILES`. A row is official, and its passes earn certificates, only when
its dataset is real; an official row is refused on hardware other than its calibration's, with
a one-line error naming the override (``--allow-other-hardware``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from mgpu import assessment

FORMAT = "mgpu-profiles/1"
ROWS_FILE = "profiles.json"
OVERRIDE_FLAG = "--allow-other-hardware"
#: Seconds the notebook needs after training (its tests and the outcome cell) inside the timeout.
TESTS_SECONDS = 30
#: The budget is at least this many seconds above the slowest run's time to the target: start-up
#: (imports, Horovod's launch) varies by seconds between runs whatever the training's length, which
#: a multiple alone does not cover when the training is short.
START_SLACK_S = 15

#: The target sits at least this many standard errors of one epoch's held-out accuracy below the
#: reference's streak: the streak is the best of a run's epochs, and a held-out set of 1,000 images
#: moves an epoch's accuracy by ~0.01 (one standard error) whatever the training does.
TARGET_Z = 3.0
MEMORY_FACTOR = 4
MEMORY_STEP_MB = 500


class CalibrationError(ValueError):
    """Bad input, or a measurement that cannot make a row; one line that names the fix."""


def rows_path(course_dir) -> Path:
    return Path(course_dir) / "autograder" / ROWS_FILE


# ------------------------------------------------------------------------------------ the machine

def machine() -> dict:
    """What a calibration was measured on, and what the grader compares before using an official row."""
    from mgpu.runtime import hardware, launch

    gpus = launch.visible_gpus()
    return {"gpus": gpus, "cpu": hardware._cpu_name(), "cores": launch.available_cores(),
            "summary": (f"{len(gpus)} x {gpus[0]}" if gpus and len(set(gpus)) == 1
                        else " + ".join(gpus) if gpus else f"CPU only: {hardware._cpu_name()}, "
                        f"{launch.available_cores()} cores")}


def same_hardware(calibrated: dict, here: dict) -> bool:
    """The GPUs (model and count) decide where there are GPUs; the CPU model and cores otherwise."""
    if calibrated.get("gpus") or here.get("gpus"):
        return sorted(calibrated.get("gpus", [])) == sorted(here.get("gpus", []))
    return (calibrated.get("cpu"), calibrated.get("cores")) == (here.get("cpu"), here.get("cores"))


def versions() -> dict:
    from autograder import certificates
    from mgpu.runtime import hardware

    return {"python": platform.python_version(), "tensorflow": hardware.tensorflow_version(),
            "keras": hardware.keras_2_version(), "horovod": hardware._version("horovod"),
            "numpy": hardware._version("numpy"), "grader": certificates.grader_version()}


# ------------------------------------------------------------------------------------- deriving

def streak_accuracy(accuracies: list[float | None]) -> float | None:
    """The best accuracy held for CONSECUTIVE_EPOCHS epochs in a row (None: too few measured epochs)."""
    n = assessment.CONSECUTIVE_EPOCHS
    floors = [min(window) for window in (accuracies[i:i + n] for i in range(len(accuracies) - n + 1))
              if len(window) == n and None not in window]
    return max(floors) if floors else None


def target_margin(streak: float, test_images: int, accuracy_margin: float = 0.02) -> float:
    """How far below the reference's streak the target goes: ``accuracy_margin``, or :data:`TARGET_Z`
    standard errors of an epoch's accuracy on ``test_images`` held-out images, whichever is larger
    (0.02 for Fashion-MNIST's 10,000; more for the small sets of the practice rows and the tests)."""
    p = min(max(float(streak), 0.0), 1.0)
    return max(accuracy_margin, TARGET_Z * math.sqrt(p * (1 - p) / max(int(test_images), 1)))


def reached_seconds(epochs: list[dict], target: float) -> float | None:
    """The grader's clock at the epoch that completes the first streak at or above ``target``."""
    n = assessment.CONSECUTIVE_EPOCHS
    for i in range(len(epochs) - n + 1):
        window = epochs[i:i + n]
        if all(e["accuracy"] is not None and e["accuracy"] >= target for e in window):
            return window[-1]["seconds"]
    return None


def derive_row(runs: list[dict], *, name: str, dataset: str, real: bool, workers: int, train_images: int,
               val_images: int, test_images: int, margin: float = 1.5, accuracy_margin: float = 0.02) -> dict:
    """A profile row (as a dict of :class:`mgpu.assessment.Profile` fields) from the reference's runs.

    ``runs`` are verdict dicts of the reference graded with an unreachable target (``epochs``:
    ``[{epoch, seconds, accuracy}]`` on the grader's clock, ``peak_memory_mb``, ``notebook_seconds``).
    """
    if len(runs) < 2:
        raise CalibrationError(f"{len(runs)} reference run(s): calibrate with --runs 2 or more, so that the "
                               "row covers the spread between runs")
    streaks = []
    for number, run in enumerate(runs, start=1):
        streak = streak_accuracy([e["accuracy"] for e in run["epochs"]])
        if streak is None:
            raise CalibrationError(f"reference run {number} saved {len(run['epochs'])} measured epoch(s): it needs "
                                   f"{assessment.CONSECUTIVE_EPOCHS} in a row (did it crash? see its report)")
        streaks.append(streak)
    below = target_margin(min(streaks), test_images, accuracy_margin)
    target = math.floor((min(streaks) - below) * 100 + 1e-9) / 100
    if target <= 0:
        raise CalibrationError(f"the reference held at most {min(streaks):.3f}: no target above 0 is left after "
                               f"the margin {below:.3f}; check the dataset and the reference")
    reached = [reached_seconds(run["epochs"], target) for run in runs]
    budget = math.ceil(max(margin * max(reached), max(reached) + START_SLACK_S))
    peak = max(run.get("peak_memory_mb", 0.0) for run in runs)
    return {"name": name, "dataset": dataset, "workers": workers, "train_images": train_images,
            "val_images": val_images, "test_images": test_images, "target_accuracy": target,
            "time_budget_s": budget, "timeout_s": budget + TESTS_SECONDS,
            "memory_limit_mb": max(MEMORY_STEP_MB, math.ceil(MEMORY_FACTOR * peak / MEMORY_STEP_MB) * MEMORY_STEP_MB),
            "first_epoch_accuracy": min(run["epochs"][0]["accuracy"] for run in runs), "official": bool(real),
            "_reached_s": reached, "_streaks": streaks, "_below": below}


# ------------------------------------------------------------------------------ the course file

def read_rows(course_dir) -> list[dict]:
    path = rows_path(course_dir)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise CalibrationError(f"cannot read {path} ({error}): restore it, or delete it and calibrate again") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("rows"), list):
        raise CalibrationError(f"{path} is not a profile file ({FORMAT}): delete it and calibrate again")
    return document["rows"]


def write_row(course_dir, row: dict) -> Path:
    """Add ``row`` to the course's file, replacing the row with the same (name, dataset, workers)."""
    path = rows_path(course_dir)
    key = (row["name"], row["dataset"], row["workers"])
    rows = [r for r in read_rows(course_dir) if (r["name"], r["dataset"], r["workers"]) != key] + [row]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".profiles", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "rows": rows}, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_PROFILE_FIELDS = {f.name for f in dataclasses.fields(assessment.Profile)}


def calibration_summary(row: dict) -> str:
    """The calibration of a course row in one line: hardware, date, runs, dataset, and the row file's entry hash."""
    calibration = row.get("calibration") or {}
    runs = calibration.get("runs") or []
    reached = [r["reached_target_s"] for r in runs if r.get("reached_target_s") is not None]
    dataset = calibration.get("dataset") or {}
    digest = hashlib.sha256(json.dumps(row, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    return (f"calibrated on {calibration.get('hardware', {}).get('summary', 'unknown hardware')} "
            f"{str(calibration.get('date', '?'))[:10]}: {len(runs)} reference runs"
            + (f" reached the target in {min(reached):.0f}-{max(reached):.0f} s" if reached else "")
            + f", {dataset.get('name', '?')} {str(dataset.get('fingerprint', '?'))[-12:]}, row {digest}")


def profile_from_row(row: dict) -> assessment.Profile:
    fields = {k: v for k, v in row.items() if k in _PROFILE_FIELDS and k != "calibration"}
    return assessment.Profile(**fields, calibration=calibration_summary(row))


def resolve_profile(course_dir, name: str, workers: int, *, allow_other_hardware: bool = False,
                    here: dict | None = None) -> tuple[assessment.Profile, dict | None]:
    """``(profile, calibration)``: the course's calibrated row first, else the built-in practice row.

    An official row measured on other hardware raises :class:`CalibrationError` naming
    :data:`OVERRIDE_FLAG`, unless ``allow_other_hardware``.
    """
    rows = [r for r in read_rows(course_dir) if r.get("name") == name]
    for row in rows:
        if row.get("workers") != workers:
            continue
        calibration = row.get("calibration") or {}
        if row.get("official") and not allow_other_hardware:
            here = machine() if here is None else here
            measured_on = calibration.get("hardware", {})
            if not same_hardware(measured_on, here):
                raise CalibrationError(
                    f"profile {name!r} ({workers} workers) was calibrated on {measured_on.get('summary', 'unknown')} and "
                    f"this machine is {here['summary']}: its target and budget do not hold here. Calibrate "
                    f"here (python -m autograder calibrate), or pass {OVERRIDE_FLAG} to grade with it anyway")
        return profile_from_row(row), calibration
    if rows:
        raise CalibrationError(f"profile {name!r} is calibrated for {' or '.join(str(r['workers']) for r in rows)} "
                               f"workers in {rows_path(course_dir)}: use --workers accordingly, or calibrate for "
                               f"{workers}")
    try:
        return assessment.profile(name, workers), None
    except KeyError as error:
        raise CalibrationError(error.args[0]) from None


# ---------------------------------------------------------------------------------- measuring

def calibrate(course_dir, name: str, workers: int, dataset_name: str, runs: int, *, train_images: int,
              val_images: int, test_images: int, margin: float = 1.5, accuracy_margin: float = 0.02,
              assignment: str = "assessment", isolate: bool = True, timeout_s: float = 3600,
              command: str = "", work_root=None, log=print) -> tuple[dict, Path]:
    """Grade the reference ``runs`` times, one at a time, derive the row, write it; ``(row, path)``."""
    import nbformat

    from autograder import grade as grading
    from mgpu.runtime import data

    if runs < 2:
        raise CalibrationError(f"--runs {runs}: calibrate with 2 or more reference runs")
    if not (Path(course_dir) / "source" / assignment / f"{assignment}.ipynb").is_file():
        raise CalibrationError(f"no reference solution {Path(course_dir) / 'source' / assignment / (assignment + '.ipynb')}: "
                               "pass the course folder that holds source/ (this repo's is assignments/)")
    dataset = data.load(dataset_name, verbose=False)
    # The reference trains every epoch it asks for: the target is out of reach, the budget generous.
    provisional = assessment.Profile(name, dataset_name, workers, train_images=train_images, val_images=val_images,
                                     test_images=test_images, target_accuracy=1.01, time_budget_s=timeout_s,
                                     timeout_s=timeout_s, memory_limit_mb=10 ** 6)
    reference = nbformat.read(Path(course_dir) / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    verdicts = grading.grade_in_private_copy({f"reference-{i}": reference for i in range(1, runs + 1)}, provisional,
                                             kind="calibration", assignment=assignment, work_root=work_root,
                                             isolate=isolate, timeout_s=timeout_s, progress=True, log=log)
    measured = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else dict(v) for v in verdicts]
    row = derive_row(measured, name=name, dataset=dataset_name, real=dataset.real, workers=workers,
                     train_images=train_images, val_images=val_images, test_images=test_images, margin=margin,
                     accuracy_margin=accuracy_margin)
    reached, streaks, below = row.pop("_reached_s"), row.pop("_streaks"), row.pop("_below")
    row["calibration"] = {
        "hardware": machine(), "versions": versions(),
        "dataset": {"name": dataset.name, "fingerprint": dataset.fingerprint, "real": bool(dataset.real)},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
        "margin": margin, "accuracy_margin": accuracy_margin, "target_below_streak": round(below, 4),
        "runs": [{"accuracy_by_epoch": [e["accuracy"] for e in m["epochs"]],
                  "epoch_seconds": [e["seconds"] for e in m["epochs"]], "streak_accuracy": streak,
                  "reached_target_s": r, "notebook_s": m["notebook_seconds"], "peak_memory_mb": m["peak_memory_mb"]}
                 for m, r, streak in zip(measured, reached, streaks)],
    }
    return row, write_row(course_dir, row)
