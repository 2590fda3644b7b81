"""How far do honest weights move in one epoch? The figure behind ``autograder.measure.MIN_EPOCH_CHANGE``.

The grader does not count an epoch whose weights moved by less than ``MIN_EPOCH_CHANGE`` (relative
L2 distance to the previous epoch's weights) as an epoch of training: one good epoch copied to the
next number, or copied with a little noise, must not make the 2-epoch streak. This trains the
assessment's reference model on the assessment's data (one process, global batch 128, the
profile's training images) with several optimizers and learning rates, from the high rates that
train fast to rates too low to reach the target, and prints for each: the smallest relative change
between two epochs, and the validation accuracy at the end. The rule is safe when every setting
that reaches the target moves far more than the threshold in every epoch.

    python benchmarks/epoch_changes.py            # 8 epochs per setting, seed 0
    python benchmarks/epoch_changes.py --epochs 12 --seed 1

Writes ``build/results/epoch_changes.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = [("sgd", 0.04), ("sgd", 0.004), ("sgd", 0.0004), ("adam", 1e-3), ("adam", 1e-4), ("adam", 1e-5)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from autograder.measure import MIN_EPOCH_CHANGE
    from mgpu import assessment, paths

    with tempfile.TemporaryDirectory() as folder:
        assessment.prepare_practice_data(folder)
        x, y, x_val, y_val, info = assessment.load_data(folder)
    rows = []
    for name, rate in SETTINGS:
        tf.keras.utils.set_random_seed(args.seed)
        model = assessment.reference_model(info["image_shape"], info["num_classes"], seed=args.seed)
        optimizer = (tf.keras.optimizers.SGD(rate, momentum=0.9) if name == "sgd"
                     else tf.keras.optimizers.Adam(rate))
        model.compile(optimizer=optimizer, metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        previous = np.concatenate([w.ravel() for w in model.get_weights()])
        changes, accuracy = [], 0.0
        for _ in range(args.epochs):
            history = model.fit(x, y, batch_size=128, epochs=1, validation_data=(x_val, y_val), verbose=0)
            now = np.concatenate([w.ravel() for w in model.get_weights()])
            changes.append(float(np.linalg.norm(now - previous) / np.linalg.norm(previous)))
            previous, accuracy = now, float(history.history["val_accuracy"][-1])
        row = {"optimizer": name, "learning_rate": rate, "smallest_change": min(changes),
               "last_change": changes[-1], "val_accuracy": accuracy}
        rows.append(row)
        print(f"{name:4s} lr {rate:<7g} smallest change {min(changes):.4f}  last {changes[-1]:.4f}  "
              f"val_accuracy {accuracy:.3f}", flush=True)
    reaching = [r for r in rows if r["val_accuracy"] >= 0.80]
    smallest = min((r["smallest_change"] for r in reaching), default=float("nan"))
    print(f"\nsmallest change in a setting that reaches 0.80: {smallest:.4f}; threshold {MIN_EPOCH_CHANGE} "
          f"({smallest / MIN_EPOCH_CHANGE:.0f}x below it)")
    out = paths.build_dir() / "results" / "epoch_changes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"epochs": args.epochs, "seed": args.seed, "settings": rows,
                               "smallest_change_reaching_target": smallest,
                               "threshold": MIN_EPOCH_CHANGE}, indent=1))
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
