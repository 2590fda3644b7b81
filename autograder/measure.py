"""The grader's own measurement of a run: held-out accuracy of every saved epoch, and the verdict.

Nothing the student's code printed or wrote as a number is used. :class:`Measurer` builds the
reference architecture once (in the grader's process; no student code and no pickled object is
ever loaded), then for each ``epoch_XXX.npz`` sets the weights with
:func:`mgpu.assessment.load_epoch_weights` and computes the accuracy on the held-out test images,
whose labels never left the grader. :func:`decide` applies the criterion: measured accuracy >=
target for 2 consecutive epochs, the second one seen (grader's clock) within the budget.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mgpu import assessment


@dataclass
class EpochMeasurement:
    epoch: int
    seconds: float                 # when the grader first saw the file, since the run started
    accuracy: float | None         # None when the file was rejected
    rejected: str = ""             # why, in one line
    weights_sha256: str = ""       # of the weights as loaded (shapes and float32 bytes), for copies


@dataclass
class Outcome:
    passed: bool
    reason: str                    # one line: why it failed, or what it reached
    epochs: list[EpochMeasurement] = field(default_factory=list)
    reached_epoch: int | None = None
    reached_seconds: float | None = None
    best_accuracy: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


class Measurer:
    """Held-out accuracy of saved weights in the reference model (thread-safe, one model)."""

    def __init__(self, x_test: np.ndarray, y_test: np.ndarray, image_shape, num_classes: int):
        import tensorflow as tf

        self.x_test, self.y_test = x_test, np.asarray(y_test).astype(np.int64)
        self.model = assessment.reference_model(image_shape, num_classes)
        self._predict = tf.function(lambda x: tf.argmax(self.model(x, training=False), axis=-1))
        self._lock = threading.Lock()

    def accuracy(self, weights_file: Path) -> float:
        """Accuracy on the held-out set; raises :class:`assessment.WeightsRejected`."""
        return self.accuracy_and_hash(weights_file)[0]

    def accuracy_and_hash(self, weights_file: Path) -> tuple[float, str]:
        """(held-out accuracy, SHA-256 of the weights as loaded); raises :class:`assessment.WeightsRejected`."""
        import hashlib

        import tensorflow as tf

        with self._lock:
            assessment.load_epoch_weights(weights_file, self.model)
            digest = hashlib.sha256()
            for weight in self.model.get_weights():
                digest.update(str(weight.shape).encode())
                digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
            correct = 0
            for start in range(0, len(self.x_test), 1000):
                batch = tf.constant(self.x_test[start:start + 1000])
                correct += int(np.sum(self._predict(batch).numpy() == self.y_test[start:start + 1000]))
        return correct / len(self.x_test), digest.hexdigest()

    def measure(self, output_dir: Path, seen_s: dict[int, float]) -> list[EpochMeasurement]:
        measured = []
        for epoch, path in assessment.epoch_files(output_dir).items():
            seconds = seen_s.get(epoch, float("nan"))
            try:
                accuracy, digest = self.accuracy_and_hash(path)
                measured.append(EpochMeasurement(epoch, seconds, accuracy, weights_sha256=digest))
            except assessment.WeightsRejected as error:
                measured.append(EpochMeasurement(epoch, seconds, None, str(error)))
        return measured


def decide(epochs: list[EpochMeasurement], target: float, budget_s: float,
           consecutive: int = assessment.CONSECUTIVE_EPOCHS) -> Outcome:
    """The verdict on the grader's measurements alone."""
    if not epochs:
        return Outcome(False, "no weights saved: no epoch finished with protected_callbacks() in "
                              "model.fit, so there is nothing to measure")
    rejected = [e for e in epochs if e.accuracy is None]
    valid = [e for e in epochs if e.accuracy is not None]
    best = max((e.accuracy for e in valid), default=None)
    streak, previous = 0, None
    for e in sorted(epochs, key=lambda e: e.epoch):
        ok = e.accuracy is not None and e.accuracy >= target
        streak = streak + 1 if ok and previous is not None and e.epoch == previous + 1 else int(ok)
        previous = e.epoch
        if streak >= consecutive:
            outcome = Outcome(e.seconds <= budget_s, "", epochs, e.epoch, e.seconds, best)
            if outcome.passed:
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
    if rejected:
        reason += f"; {len(rejected)} epoch file(s) rejected: {rejected[0].rejected}"
    return Outcome(False, reason, epochs, best_accuracy=best)
