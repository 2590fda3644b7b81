"""How hard is the offline default dataset? A linear model versus a small CNN.

Generates :mod:`mgpu.runtime.synthetic` data, then trains with tf.keras (Keras 2):

- softmax regression on pixels/255 (Flatten -> Dense(10)), Adam, to convergence;
- a small CNN, Conv(32,3)-Pool-Conv(64,3)-Pool-Dense(128)-Dense(10), Adam.

and prints the generation time, the linear test accuracy, the CNN's test accuracy after epoch 1
and at the end, and its training loss after epoch 1. A well-posed image set should leave a clear
gap between the two models, should not be solved after one epoch, and should not reach 100%.

    python benchmarks/dataset_difficulty.py                 # full 60k/10k, seed 0
    python benchmarks/dataset_difficulty.py --subset 10000 --epochs-cnn 2   # quick look
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="dataset seed (default 0)")
    parser.add_argument("--epochs-linear", type=int, default=25, help="linear model epochs (25)")
    parser.add_argument("--epochs-cnn", type=int, default=8, help="CNN epochs (8)")
    parser.add_argument("--subset", type=int, default=None,
                        help="use only N training and N/6 test samples, for quick runs")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow intra-op threads (0: TensorFlow's default)")
    args = parser.parse_args(argv)

    from mgpu.runtime import synthetic

    n_train = 60000 if args.subset is None else args.subset
    n_test = 10000 if args.subset is None else max(1000, args.subset // 6)
    t0 = time.perf_counter()
    x_train, y_train, x_test, y_test = synthetic.generate(args.seed, n_train=n_train, n_test=n_test)
    gen_s = time.perf_counter() - t0
    print(f"generation: {gen_s:.2f} s for {n_train} train + {n_test} test images (seed {args.seed})",
          flush=True)

    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(args.seed)
    x_train = (x_train.astype("float32") / 255.0)[..., None]
    x_test = (x_test.astype("float32") / 255.0)[..., None]

    linear = tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(28, 28, 1)),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    linear.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                   loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    t0 = time.perf_counter()
    hist = linear.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs_linear,
                      verbose=0)
    _, lin_acc = linear.evaluate(x_test, y_test, verbose=0)
    print(f"linear: test accuracy {lin_acc:.4f} (train loss {hist.history['loss'][-1]:.4f}, "
          f"train acc {hist.history['accuracy'][-1]:.4f}, {args.epochs_linear} epochs, "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)

    L = tf.keras.layers
    cnn = tf.keras.Sequential([
        L.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
        L.MaxPooling2D(),
        L.Conv2D(64, 3, activation="relu"),
        L.MaxPooling2D(),
        L.Flatten(),
        L.Dense(128, activation="relu"),
        L.Dense(10, activation="softmax"),
    ])
    cnn.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    t0 = time.perf_counter()
    hist = cnn.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs_cnn,
                   validation_data=(x_test, y_test), verbose=0)
    h = hist.history
    for e in range(args.epochs_cnn):
        print(f"  cnn epoch {e + 1}: train loss {h['loss'][e]:.4f} acc {h['accuracy'][e]:.4f} | "
              f"test loss {h['val_loss'][e]:.4f} acc {h['val_accuracy'][e]:.4f}", flush=True)
    print(f"cnn: test accuracy epoch 1 {h['val_accuracy'][0]:.4f}, final {h['val_accuracy'][-1]:.4f} "
          f"(best {max(h['val_accuracy']):.4f}); train loss epoch 1 {h['loss'][0]:.4f}, "
          f"final {h['loss'][-1]:.4f}; {time.perf_counter() - t0:.0f} s")

    print(f"SUMMARY seed={args.seed} n_train={n_train} gen_s={gen_s:.2f} linear_acc={lin_acc:.4f} "
          f"cnn_acc_epoch1={h['val_accuracy'][0]:.4f} cnn_acc_final={h['val_accuracy'][-1]:.4f} "
          f"cnn_train_loss_epoch1={h['loss'][0]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
