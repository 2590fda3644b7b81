"""AlexNet as published, its uint8 variant, and the training step the pipelines feed."""

import numpy as np
import tensorflow as tf

from mgpu.lesson03 import alexnet
from mgpu.runtime import measure
from mgpu.lesson03.alexnet import MEAN, STD


def test_standard_alexnet_has_the_published_size():
    model = alexnet.alexnet(224, num_classes=1000, width=1.0)
    # The single-tower AlexNet of "One weird trick" (as in torchvision) has 61,100,840 parameters.
    assert model.count_params() == 61_100_840
    # ... and about 0.71 G multiply-accumulates per 224x224 image (conv 0.655 G + fc 0.059 G).
    assert 1.40e9 < measure.flops_per_image(model) < 1.45e9


def test_uint8_variant_normalises_on_the_device_like_the_pipeline_does():
    floats = alexnet.alexnet(96, width=0.125, seed=1)
    bytes_in = alexnet.alexnet(96, width=0.125, uint8_input=True, seed=1)
    bytes_in.set_weights(floats.get_weights())
    pixels = np.random.default_rng(0).integers(0, 256, size=(2, 96, 96, 3)).astype(np.uint8)
    normalised = (pixels.astype(np.float32) / 255 - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    np.testing.assert_allclose(bytes_in(pixels).numpy(), floats(normalised).numpy(), rtol=1e-4, atol=1e-5)


def test_train_step_learns_and_the_small_convnet_is_much_cheaper():
    model = alexnet.alexnet(64, width=0.125, seed=0)
    step = alexnet.make_train_step(model, learning_rate=0.01)
    x = tf.random.normal((16, 64, 64, 3), seed=0)
    y = tf.range(16) % 2
    losses = [float(step(x, y)) for _ in range(15)]
    assert losses[-1] < losses[0]
    small = alexnet.small_convnet(224)
    assert measure.flops_per_image(small) < 0.02 * measure.flops_per_image(alexnet.alexnet(224))
