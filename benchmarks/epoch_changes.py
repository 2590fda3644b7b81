"""How far do honest weights, and what they compute, move in one epoch? The figures behind
``autograder.measure.MIN_EPOCH_CHANGE``, ``MIN_OUTPUT_CHANGE`` and ``COPY_AGREEMENT``.

The grader does not count an epoch whose weights moved by less than ``MIN_EPOCH_CHANGE`` (relative
L2 distance to the previous epoch's weights) as an epoch of training: one good epoch copied to the
next number, or copied with a little noise, must not make the 2-epoch streak. This trains the
assessment's reference model on the assessment's data (one process, global batch 128, the
profile's training images) with several optimizers and learning rates, from the high rates that
train fast to rates too low to reach the target, and prints for each: the smallest relative change
between two epochs, the smallest relative change of its validation logits (what the model
computes: a rescaling or a permutation of hidden units moves the weights but not this), and the
validation accuracy at the end. The rules are safe when every setting that reaches the target
moves far more than the thresholds in every epoch. Then two runs of the best setting that differ
only in the order of the images: the fraction of validation images on which their predictions
agree, the figure behind the grader's test for copies whose weights were disguised.

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

    from autograder.measure import COPY_AGREEMENT, MIN_EPOCH_CHANGE, MIN_OUTPUT_CHANGE
    from mgpu.runtime import paths
    from mgpu import assessment

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
        previous_logits = model.predict(x_val, verbose=0)
        changes, output_changes, accuracy = [], [], 0.0
        for _ in range(args.epochs):
            history = model.fit(x, y, batch_size=128, epochs=1, validation_data=(x_val, y_val), verbose=0)
            now = np.concatenate([w.ravel() for w in model.get_weights()])
            changes.append(float(np.linalg.norm(now - previous) / np.linalg.norm(previous)))
            logits = model.predict(x_val, verbose=0)
            output_changes.append(float(np.linalg.norm(logits - previous_logits) / np.linalg.norm(previous_logits)))
            previous, previous_logits, accuracy = now, logits, float(history.history["val_accuracy"][-1])
        row = {"optimizer": name, "learning_rate": rate, "smallest_change": min(changes),
               "last_change": changes[-1], "smallest_output_change": min(output_changes),
               "val_accuracy": accuracy, "predictions": np.argmax(previous_logits, axis=1)}
        rows.append(row)
        print(f"{name:4s} lr {rate:<7g} smallest change {min(changes):.4f}  last {changes[-1]:.4f}  "
              f"smallest output change {min(output_changes):.4f}  val_accuracy {accuracy:.3f}", flush=True)
    reaching = [r for r in rows if r["val_accuracy"] >= 0.80]
    smallest = min((r["smallest_change"] for r in reaching), default=float("nan"))
    smallest_output = min((r["smallest_output_change"] for r in reaching), default=float("nan"))
    print(f"\nsmallest change in a setting that reaches 0.80: {smallest:.4f}; threshold {MIN_EPOCH_CHANGE} "
          f"({smallest / MIN_EPOCH_CHANGE:.0f}x below it)")
    print(f"smallest output change in a setting that reaches 0.80: {smallest_output:.4f}; threshold "
          f"{MIN_OUTPUT_CHANGE} ({smallest_output / MIN_OUTPUT_CHANGE:.0f}x below it)")
    # Two honest runs of the same setting on different orders of the images: how often do they agree?
    name, rate = ("adam", 1e-3)
    agreements = []
    for order_seed in (1, 2):
        tf.keras.utils.set_random_seed(args.seed)  # the same start: only the order differs
        model = assessment.reference_model(info["image_shape"], info["num_classes"], seed=args.seed)
        model.compile(optimizer=tf.keras.optimizers.Adam(rate), metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        order = np.random.default_rng(order_seed).permutation(len(x))
        model.fit(x[order], y[order], batch_size=128, epochs=args.epochs, verbose=0)
        agreements.append(np.argmax(model.predict(x_val, verbose=0), axis=1))
    reference = next(r for r in rows if (r["optimizer"], r["learning_rate"]) == (name, rate))["predictions"]
    pairs = [float(np.mean(a == b)) for a, b in ((agreements[0], agreements[1]), (agreements[0], reference),
                                                 (agreements[1], reference))]
    print(f"agreement of honest {name} {rate:g} runs on other orders of the images: "
          f"{', '.join(f'{p:.3f}' for p in pairs)}; copies are flagged from {COPY_AGREEMENT}")
    for r in rows:
        r.pop("predictions")
    out = paths.build_dir() / "results" / "epoch_changes.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"epochs": args.epochs, "seed": args.seed, "settings": rows,
                               "smallest_change_reaching_target": smallest,
                               "threshold": MIN_EPOCH_CHANGE,
                               "smallest_output_change_reaching_target": smallest_output,
                               "output_threshold": MIN_OUTPUT_CHANGE,
                               "honest_agreement": pairs, "copy_agreement": COPY_AGREEMENT}, indent=1))
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
