"""AlexNet for notebook 03, in Keras 2, and the training step the input pipelines feed.

The network is the single-tower AlexNet of Krizhevsky's "One weird trick for parallelizing
convolutional neural networks" (2014): five convolutions (64, 192, 384, 256, 256 channels; 11x11
stride 4, then 5x5 and 3x3), three max-pools, two fully connected layers of 4096 and the
classifier. ``width`` scales every layer's channels and units, so the same architecture can be
made light enough for a 2-core CPU, where the lab measures what it can; :func:`mgpu.runtime.measure.flops_per_image`
gives the cost of either.

``uint8_input=True`` builds the variant that takes raw ``uint8`` pixels and normalises them inside
the model, i.e. on the accelerator: a quarter of the bytes cross from host to device.
"""

from __future__ import annotations

import tensorflow as tf

#: Per-channel mean and standard deviation used to normalise pixels scaled to [0, 1].
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)


def alexnet(image_size: int = 224, num_classes: int = 10, width: float = 1.0, uint8_input: bool = False,
            seed: int = 0) -> tf.keras.Model:
    """Single-tower AlexNet on ``image_size`` x ``image_size`` RGB images, ``num_classes`` logits."""
    if image_size < 63:
        raise ValueError(f"AlexNet needs images of at least 63 pixels, got {image_size}")
    tf.keras.utils.set_random_seed(seed)

    def channels(n):
        return max(8, int(round(n * width)))

    layers = tf.keras.layers
    inputs = tf.keras.Input(shape=(image_size, image_size, 3), dtype=tf.uint8 if uint8_input else tf.float32)
    x = inputs
    if uint8_input:
        x = layers.Rescaling(1 / 255.0, name="to_unit_range")(tf.cast(x, tf.float32))
        x = layers.Normalization(mean=MEAN, variance=[s * s for s in STD], name="normalize_on_device")(x)
    x = layers.Conv2D(channels(64), 11, strides=4, padding="same", activation="relu", name="conv1")(x)
    x = layers.MaxPooling2D(3, strides=2, name="pool1")(x)
    x = layers.Conv2D(channels(192), 5, padding="same", activation="relu", name="conv2")(x)
    x = layers.MaxPooling2D(3, strides=2, name="pool2")(x)
    x = layers.Conv2D(channels(384), 3, padding="same", activation="relu", name="conv3")(x)
    x = layers.Conv2D(channels(256), 3, padding="same", activation="relu", name="conv4")(x)
    x = layers.Conv2D(channels(256), 3, padding="same", activation="relu", name="conv5")(x)
    x = layers.MaxPooling2D(3, strides=2, name="pool5")(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(channels(4096), activation="relu", name="fc6")(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(channels(4096), activation="relu", name="fc7")(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return tf.keras.Model(inputs, outputs, name=f"alexnet_w{width:g}_{image_size}px")


def small_convnet(image_size: int = 224, num_classes: int = 10, seed: int = 0) -> tf.keras.Model:
    """A deliberately cheap network on the same input, for contrast with AlexNet: two strided
    convolutions and a classifier (about 1% of AlexNet's FLOPs at the same resolution)."""
    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    inputs = tf.keras.Input(shape=(image_size, image_size, 3))
    x = layers.Conv2D(16, 7, strides=4, padding="same", activation="relu", name="conv1")(inputs)
    x = layers.Conv2D(32, 3, strides=2, padding="same", activation="relu", name="conv2")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, name="logits")(x)
    return tf.keras.Model(inputs, outputs, name=f"small_convnet_{image_size}px")


def make_train_step(model: tf.keras.Model, learning_rate: float = 0.01, momentum: float = 0.9):
    """A compiled SGD-with-momentum step ``step(images, labels) -> loss`` for ``model``."""
    optimizer = tf.keras.optimizers.SGD(learning_rate, momentum=momentum)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step
