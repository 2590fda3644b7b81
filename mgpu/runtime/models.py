"""Small Keras 2 models for the labs: a CNN and an MLP for 28x28 (or 32x32x3) images.

Both take the dataset's raw ``uint8`` images (they scale to [0, 1] themselves, so a ``tf.data``
pipeline or ``model.fit`` can feed the arrays straight from :func:`mgpu.runtime.data.load`) and end in
``num_classes`` logits. :func:`compile_classifier` adds the usual sparse cross-entropy loss and
accuracy metric. Weights are initialized from ``seed``, so two builds with one seed are identical.
Later labs add their models here.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["small_cnn", "mlp", "compile_classifier", "small_resnet"]


def _inputs(input_shape):
    inputs = tf.keras.Input(shape=input_shape, dtype=tf.uint8)
    x = tf.keras.layers.Rescaling(1.0 / 255)(tf.cast(inputs, tf.float32))
    if len(input_shape) == 2:
        x = tf.keras.layers.Reshape((*input_shape, 1))(x)
    return inputs, x


def small_cnn(input_shape=(28, 28), num_classes: int = 10, filters=(16, 32), dense: int = 64,
              seed: int = 0) -> tf.keras.Model:
    """Conv(3x3) + max-pool blocks with ``filters`` channels, then a dense layer and the logits."""
    tf.keras.utils.set_random_seed(seed)
    inputs, x = _inputs(input_shape)
    for n in filters:
        x = tf.keras.layers.Conv2D(n, 3, padding="same", activation="relu")(x)
        x = tf.keras.layers.MaxPooling2D()(x)
    x = tf.keras.layers.Flatten()(x)
    x = tf.keras.layers.Dense(dense, activation="relu")(x)
    outputs = tf.keras.layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, outputs, name="small_cnn")


def mlp(input_shape=(28, 28), num_classes: int = 10, hidden=(128,), seed: int = 0) -> tf.keras.Model:
    """Flatten, then ReLU dense layers of sizes ``hidden``, then the logits."""
    tf.keras.utils.set_random_seed(seed)
    inputs, x = _inputs(input_shape)
    x = tf.keras.layers.Flatten()(x)
    for n in hidden:
        x = tf.keras.layers.Dense(n, activation="relu")(x)
    outputs = tf.keras.layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, outputs, name="mlp")


def compile_classifier(model: tf.keras.Model, optimizer="adam", learning_rate: float | None = None):
    """Compile with sparse cross-entropy on logits and accuracy; ``optimizer`` is a name or object."""
    if isinstance(optimizer, str):
        optimizer = tf.keras.optimizers.get(optimizer)
        if learning_rate is not None:
            optimizer.learning_rate = learning_rate
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def small_resnet(input_shape=(28, 28), num_classes: int = 10, width: int = 16, blocks: int = 1,
                 seed: int = 0) -> tf.keras.Model:
    """A ResNet-style CNN (He et al. 2016) small enough for CPU runs: notebook 04 measures speed with it.

    A 3x3 stem of ``width`` channels, then two stages of ``blocks`` residual blocks each (two 3x3
    convolutions added to the block's input); the second stage halves the resolution and doubles the
    channels, with a 1x1 projection on its shortcut. Global average pooling, then the logits. There
    is no batch normalization, so every variable is trained (none is a per-worker running statistic)
    and data-parallel workers that stay in step hold exactly the same model.
    """
    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    inputs, x = _inputs(input_shape)
    x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    for stage, channels in enumerate((width, 2 * width)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = x
            if stride != 1 or shortcut.shape[-1] != channels:
                shortcut = layers.Conv2D(channels, 1, strides=stride)(shortcut)
            h = layers.Conv2D(channels, 3, strides=stride, padding="same", activation="relu")(x)
            h = layers.Conv2D(channels, 3, padding="same")(h)
            x = layers.ReLU()(layers.Add()([shortcut, h]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, outputs, name="small_resnet")
