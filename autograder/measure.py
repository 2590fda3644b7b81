"""The grader's own measurement of a run: held-out accuracy of every saved epoch, and the verdict.

Nothing the student's code printed or wrote as a number is used. :class:`Measurer` builds the
reference architecture once (in the grader's process; no student code and no pickled object is
ever loaded), then for each ``epoch_XXX.npz`` sets the weights with
:func:`mgpu.assessment.load_epoch_weights` and computes the accuracy on the held-out test images,
whose labels never left the grader. :func:`decide` applies the criterion: measured accuracy >=
target for 2 consecutive epochs, the second one seen (grader's clock) within the budget.

The files measured are the grader's own copies, taken by the sandbox the moment each epoch file
first appeared, so an epoch's accuracy and its time are those of the same weights. Two epochs
are two epochs of training only if the weights moved between them and so did what they compute:
an epoch whose weights (:data:`MIN_EPOCH_CHANGE`) or held-out logits (:data:`MIN_OUTPUT_CHANGE`)
are (nearly) the previous epoch's does not extend a streak, so the same model saved again, or
disguised by a transformation that keeps its function (a rescaled layer, permuted units), is not
a second epoch. Each epoch's held-out predictions are kept for the cohort's test for copies.
A run whose first saved epoch is already at the target is held for the instructor's review.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mgpu import assessment

#: Smallest relative change of the weights, ||w_e - w_(e-1)|| / ||w_(e-1)||, for epoch e to count as
#: an epoch of training after epoch e-1. Measured with ``python benchmarks/epoch_changes.py`` (the
#: reference model on the assessment's data, 8 epochs, global batch 128): the settings that reach
#: 0.80 moved at least 3.9% in every epoch (SGD 0.04: 5.4%, Adam 1e-3: 3.9%); even rates too low
#: to learn (SGD 4e-4, Adam 1e-5, validation accuracy 0.41) moved 0.4% and 0.7%. 0.1% is 39x
#: below the first, and far above a copy with noise small enough to keep its accuracy.
MIN_EPOCH_CHANGE = 1e-3
#: Smallest relative change of the held-out logits, ||z_e - z_(e-1)|| / ||z_(e-1)||, for epoch e to
#: count: the weights can be moved without changing what they compute (rescale a ReLU layer's
#: output and the next layer's input, permute hidden units), the function cannot. Measured with
#: ``python benchmarks/epoch_changes.py``: the settings that reach 0.80 changed their validation
#: logits by at least 4.3% in every epoch (Adam 1e-3; SGD 0.04: 14%), 43x above this.
MIN_OUTPUT_CHANGE = 1e-3
#: Two submissions whose predictions on the held-out images agree on at least this fraction of
#: them, at or above the target, are copies (however their weights were disguised). Measured with
#: ``python benchmarks/epoch_changes.py``: two honest runs from the same start on two orders of the
#: images agreed on 92.1-94.5% of the validation images (they disagree on 5.5% or more; copies
#: here on at most 1%).
COPY_AGREEMENT = 0.99


@dataclass
class EpochMeasurement:
    epoch: int
    seconds: float                 # when the grader first saw the file, since the run started
    accuracy: float | None         # None when the file was rejected
    rejected: str = ""             # why, in one line
    weights_sha256: str = ""       # of the weights as loaded (shapes and float32 bytes), for copies
    change: float | None = None    # relative change of the weights since the previous epoch's file
    output_change: float | None = None  # relative change of the held-out logits since then
    predictions: str = ""          # the held-out predictions (base64 of one uint8 class per image), for copies


@dataclass
class Outcome:
    passed: bool
    reason: str                    # one line: why it failed, or what it reached
    epochs: list[EpochMeasurement] = field(default_factory=list)
    reached_epoch: int | None = None
    reached_seconds: float | None = None
    best_accuracy: float | None = None
    review: str = ""               # why the instructor should look before this counts as a pass

    def as_dict(self) -> dict:
        return asdict(self)


class Measurer:
    """Held-out accuracy of saved weights in the reference model (thread-safe, one model)."""

    def __init__(self, x_test: np.ndarray, y_test: np.ndarray, image_shape, num_classes: int):
        import tensorflow as tf

        self.x_test, self.y_test = x_test, np.asarray(y_test).astype(np.int64)
        self.model = assessment.reference_model(image_shape, num_classes)
        self._logits = tf.function(lambda x: self.model(x, training=False))
        self._lock = threading.Lock()

    def accuracy(self, weights_file: Path) -> float:
        """Accuracy on the held-out set; raises :class:`assessment.WeightsRejected`."""
        return self.accuracy_and_hash(weights_file)[0]

    def accuracy_and_hash(self, weights_file: Path) -> tuple[float, str]:
        """(held-out accuracy, SHA-256 of the weights as loaded); raises :class:`assessment.WeightsRejected`."""
        accuracy, digest, _, _ = self._measure(weights_file)
        return accuracy, digest

    def _measure(self, weights_file: Path) -> tuple[float, str, np.ndarray, np.ndarray]:
        import hashlib

        import tensorflow as tf

        with self._lock:
            assessment.load_epoch_weights(weights_file, self.model)
            weights = self.model.get_weights()
            digest = hashlib.sha256()
            for weight in weights:
                digest.update(str(weight.shape).encode())
                digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
            logits = np.concatenate([self._logits(tf.constant(self.x_test[start:start + 1000])).numpy()
                                     for start in range(0, len(self.x_test), 1000)]).astype(np.float64)
        correct = int(np.sum(np.argmax(logits, axis=1) == self.y_test))
        flat = np.concatenate([np.ravel(w).astype(np.float64) for w in weights])
        return correct / len(self.x_test), digest.hexdigest(), flat, logits

    def measure(self, files: dict[int, Path], seen_s: dict[int, float],
                rejected: dict[int, str] | None = None) -> list[EpochMeasurement]:
        """Measure the grader's copies of the epoch files (``{epoch: path}``), with when each was seen."""
        measured = [EpochMeasurement(epoch, seen_s.get(epoch, float("nan")), None, why)
                    for epoch, why in (rejected or {}).items()]
        previous: tuple[int, np.ndarray, np.ndarray] | None = None
        for epoch, path in sorted(files.items()):
            seconds = seen_s.get(epoch, float("nan"))
            try:
                accuracy, digest, flat, logits = self._measure(path)
            except assessment.WeightsRejected as error:
                measured.append(EpochMeasurement(epoch, seconds, None, str(error)))
                continue
            change = output_change = None
            if previous is not None and previous[0] == epoch - 1:
                change = _relative(flat, previous[1])
                output_change = _relative(logits, previous[2])
            measured.append(EpochMeasurement(epoch, seconds, accuracy, weights_sha256=digest, change=change,
                                             output_change=output_change,
                                             predictions=encode_predictions(np.argmax(logits, axis=1))))
            previous = (epoch, flat, logits)
        return sorted(measured, key=lambda e: e.epoch)


def _relative(now: np.ndarray, before: np.ndarray) -> float:
    """How much ``now`` differs from ``before``, relative to it; 0 when it cannot be told (a NaN or an
    infinity in either), so such an epoch never counts as one that moved."""
    change = float(np.linalg.norm(now - before) / (np.linalg.norm(before) + 1e-12))
    return change if np.isfinite(change) else 0.0


def encode_predictions(classes: np.ndarray) -> str:
    """One class per held-out image, as compact text for a record."""
    import base64

    return base64.b64encode(np.asarray(classes, np.uint8).tobytes()).decode()


def decode_predictions(text: str) -> np.ndarray:
    """The classes :func:`encode_predictions` wrote."""
    import base64

    return np.frombuffer(base64.b64decode(text), np.uint8)


def decide(epochs: list[EpochMeasurement], target: float, budget_s: float,
           consecutive: int = assessment.CONSECUTIVE_EPOCHS, first_epoch_accuracy: float = 0.0) -> Outcome:
    """The verdict on the grader's measurements alone (``first_epoch_accuracy``: the reference's)."""
    if not epochs:
        return Outcome(False, "no weights saved: no epoch finished with protected_callbacks() in "
                              "model.fit, so there is nothing to measure")
    rejected = [e for e in epochs if e.accuracy is None]
    valid = [e for e in epochs if e.accuracy is not None]
    best = max((e.accuracy for e in valid), default=None)
    still = [e.epoch for e in valid if (e.change is not None and e.change < MIN_EPOCH_CHANGE)
             or (e.output_change is not None and e.output_change < MIN_OUTPUT_CHANGE)]
    streak, previous = 0, None
    for e in sorted(epochs, key=lambda e: e.epoch):
        ok = e.accuracy is not None and e.accuracy >= target and e.epoch not in still
        streak = streak + 1 if ok and previous is not None and e.epoch == previous + 1 else int(ok)
        previous = e.epoch
        if streak >= consecutive:
            outcome = Outcome(e.seconds <= budget_s, "", epochs, e.epoch, e.seconds, best)
            first = min(valid, key=lambda v: v.epoch)
            if outcome.passed and first.accuracy >= target:
                outcome.passed = False
                outcome.review = (f"held for review: the first epoch the run saved (epoch {first.epoch}, seen at "
                                  f"{first.seconds:.0f} s) was already at {first.accuracy:.3f} >= {target:.3f}, "
                                  f"after less training than the reference's first epoch (which reaches "
                                  f"{first_epoch_accuracy:.2f}): weights brought in from outside? The instructor "
                                  "decides")
                outcome.reason = outcome.review
            elif outcome.passed:
                outcome.reason = (f"accuracy >= {target:.3f} target for {consecutive} consecutive epochs "
                                  f"at epoch {e.epoch}, {e.seconds:.0f} s <= {budget_s:.0f} s budget")
            else:
                outcome.reason = (f"target reached at epoch {e.epoch} after {e.seconds:.0f} s > "
                                  f"{budget_s:.0f} s budget")
            return outcome
    if best is None:
        return Outcome(False, f"every saved epoch was rejected: {rejected[0].rejected}", epochs)
    if best >= target:
        reason = (f"accuracy reached {best:.3f} >= {target:.3f} target but not for {consecutive} "
                  "consecutive epochs")
    else:
        reason = f"accuracy {best:.3f} < {target:.3f} target (best of {len(valid)} saved epochs)"
    if still:
        reason += (f"; epoch(s) {', '.join(map(str, still))} did not count: their weights, or what the weights "
                   "compute on the held-out images, are (nearly) those of the epoch before, so no training "
                   "happened between them")
    if rejected:
        reason += f"; {len(rejected)} epoch file(s) rejected: {rejected[0].rejected}"
    return Outcome(False, reason, epochs, best_accuracy=best)
