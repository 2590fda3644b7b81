"""Tests for mgpu.runtime.synthetic, the offline default dataset."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from mgpu.runtime import synthetic

N_TRAIN, N_TEST = 3000, 1000  # small splits keep the file fast


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str((a.dtype, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def small():
    return synthetic.generate(seed=0, n_train=N_TRAIN, n_test=N_TEST)


def test_class_names():
    assert isinstance(synthetic.CLASS_NAMES, tuple)
    assert len(synthetic.CLASS_NAMES) == 10
    assert len(set(synthetic.CLASS_NAMES)) == 10
    assert all(isinstance(n, str) and 0 < len(n) <= 20 for n in synthetic.CLASS_NAMES)


def test_shapes_and_dtypes_match_fashion_mnist(small):
    x_train, y_train, x_test, y_test = small
    assert x_train.shape == (N_TRAIN, 28, 28) and x_test.shape == (N_TEST, 28, 28)
    assert y_train.shape == (N_TRAIN,) and y_test.shape == (N_TEST,)
    for a in small:
        assert a.dtype == np.uint8
    assert set(np.unique(y_train)) == set(range(10))
    assert set(np.unique(y_test)) == set(range(10))


def test_default_sizes_are_fashion_mnist_sizes():
    import inspect

    params = inspect.signature(synthetic.generate).parameters
    assert params["seed"].default == 0
    assert params["n_train"].default == 60000
    assert params["n_test"].default == 10000


def test_same_seed_is_byte_identical(small):
    again = synthetic.generate(seed=0, n_train=N_TRAIN, n_test=N_TEST)
    assert _digest(*again) == _digest(*small)


def test_different_seed_differs(small):
    other = synthetic.generate(seed=1, n_train=N_TRAIN, n_test=N_TEST)
    for a, b in zip(small, other):
        assert a.shape == b.shape
    # Images differ almost everywhere, labels differ in order.
    assert np.mean(np.any(small[0] != other[0], axis=(1, 2))) > 0.99
    assert np.mean(np.any(small[2] != other[2], axis=(1, 2))) > 0.99
    assert not np.array_equal(small[1], other[1])
    assert not np.array_equal(small[3], other[3])


def test_train_and_test_are_different_images(small):
    x_train, _, x_test, _ = small
    train_hashes = {hashlib.sha256(img.tobytes()).digest() for img in x_train}
    assert not any(hashlib.sha256(img.tobytes()).digest() in train_hashes for img in x_test)


def test_test_split_independent_of_n_train(small):
    _, _, x_test, y_test = small
    for n_train in (0, 17, 2 * N_TRAIN + 1):
        _, _, x2, y2 = synthetic.generate(seed=0, n_train=n_train, n_test=N_TEST)
        assert _digest(x2, y2) == _digest(x_test, y_test)


def test_train_split_independent_of_n_test(small):
    x_train, y_train, _, _ = small
    x2, y2, _, _ = synthetic.generate(seed=0, n_train=N_TRAIN, n_test=7)
    assert _digest(x2, y2) == _digest(x_train, y_train)


def test_smaller_split_is_a_prefix(small):
    x_train, y_train, x_test, y_test = small
    x2, y2, x3, y3 = synthetic.generate(seed=0, n_train=1234, n_test=321)
    assert np.array_equal(x2, x_train[:1234]) and np.array_equal(y2, y_train[:1234])
    assert np.array_equal(x3, x_test[:321]) and np.array_equal(y3, y_test[:321])


def test_empty_splits():
    x_train, y_train, x_test, y_test = synthetic.generate(seed=3, n_train=0, n_test=0)
    assert x_train.shape == (0, 28, 28) and y_train.shape == (0,)
    assert x_test.shape == (0, 28, 28) and y_test.shape == (0,)


@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"n_train": -1}, {"n_test": -5}])
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        synthetic.generate(**kwargs)


def test_labels_balanced(small):
    _, y_train, _, y_test = small
    for y in (y_train, y_test):
        counts = np.bincount(y, minlength=10)
        assert counts.min() == counts.max() == len(y) // 10
    # Any prefix, even an odd size, is balanced to within one sample per class.
    for n in (1, 9, 11, 999, 1234):
        counts = np.bincount(y_train[:n], minlength=10)
        assert counts.max() - counts.min() <= 1


def test_labels_are_shuffled(small):
    _, y_train, _, _ = small
    # Not sorted and not a fixed cycle: consecutive blocks of ten are in different orders.
    blocks = y_train[: 100 * 10].reshape(100, 10)
    assert len({tuple(b) for b in blocks}) > 50


def test_pixel_range_is_used(small):
    x_train, _, x_test, _ = small
    for x in (x_train, x_test):
        assert x.min() == 0
        assert x.max() == 255
        assert x.std() > 20  # far from constant (values span 0..255)
        per_image = x.reshape(len(x), -1)
        assert np.all(per_image.max(axis=1) > per_image.min(axis=1))  # no blank image
        # Like Fashion-MNIST: mostly dark background, a bright object.
        assert 0.05 < np.mean(x > 128) < 0.5


def test_classes_are_distinct_but_samples_vary():
    # 1000 samples per class: enough for the class means to be well resolved.
    x_train, y_train, _, _ = synthetic.generate(seed=0, n_train=10000, n_test=0)
    x = x_train.reshape(len(x_train), -1).astype(np.float64)
    means, noise = [], []
    for c in range(10):
        xc = x[y_train == c]
        # Samples within a class vary, and are all different from each other.
        assert xc.std(axis=0).mean() > 10
        assert len(np.unique(xc, axis=0)) == len(xc)
        means.append(xc.mean(axis=0))
        # How far apart two halves of the same class are: the sampling noise of a class mean.
        noise.append(np.linalg.norm(xc[0::2].mean(axis=0) - xc[1::2].mean(axis=0)))
    for a in range(10):
        for b in range(a + 1, 10):
            gap = np.linalg.norm(means[a] - means[b])
            assert gap > 2 * max(noise[a], noise[b]), (synthetic.CLASS_NAMES[a], synthetic.CLASS_NAMES[b])


def test_generator_does_not_need_tensorflow():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import sys; from mgpu.runtime import synthetic; synthetic.generate(0, 20, 20); "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules"
    )
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_learnable_far_above_chance():
    tf = pytest.importorskip("tensorflow")
    x_train, y_train, x_test, y_test = synthetic.generate(seed=0, n_train=6000, n_test=1000)
    x_train = (x_train / 255.0).astype("float32")[..., None]
    x_test = (x_test / 255.0).astype("float32")[..., None]
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1)),
        layers.MaxPooling2D(2),
        layers.Conv2D(16, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(3e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=64, epochs=2, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    assert accuracy > 0.5  # chance is 0.1
