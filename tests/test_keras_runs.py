"""keras_runs.time_to_accuracy splits its seconds into the first epoch, later epochs and evaluation."""

import numpy as np

from mgpu.lesson02 import keras_runs
from mgpu.runtime import models


def test_time_to_accuracy_splits_its_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_BUILD_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 28, 28)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int64")
    build = lambda: models.compile_classifier(models.mlp(hidden=(8,), seed=0), "adam", 2e-3)  # noqa: E731
    runs = keras_runs.time_to_accuracy(build, x, y, x[:64], y[:64], [64], target=2.0, max_epochs=3,
                                       budget_seconds=60, log_name="test_tta")
    (run,) = runs
    assert not run.reached and run.epochs == 3 and len(run.wall_times) == 3
    assert 0 < run.eval_seconds < run.seconds
    assert 0 < run.first_epoch_seconds < run.seconds
    assert run.eval_seconds + run.first_epoch_seconds <= run.seconds + 1e-6
    assert (tmp_path / "logs" / "test_tta_b64.csv").exists()
