"""Large-batch optimizers with layer-wise trust ratios: LARS and LAMB, as Keras 2 optimizers.

TensorFlow 2.15 / Keras 2.15 ship neither, so the course writes them from the papers:

- **LARS** (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks"):
  momentum SGD whose step for each layer is scaled by a *local learning rate*
  ``eta * ||w|| / (||g|| + wd * ||w||)``, so no layer moves by more than a fixed fraction of its
  own size, however large the batch made the global learning rate.
- **LAMB** (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76
  minutes"): Adam's bias-corrected update ``r = m_hat / (sqrt(v_hat) + eps)`` plus decoupled weight
  decay, scaled per layer by the trust ratio ``||w|| / ||r + wd * w||``.

Both fall back to a trust ratio of 1 when a norm is zero (e.g. biases initialised to zero), as the
papers' reference implementations do. Each works under ``hvd.DistributedOptimizer``.
"""

from __future__ import annotations

import tensorflow as tf


def _trust_ratio(numerator, denominator):
    """numerator / denominator, or 1 where either is zero."""
    safe = tf.logical_and(numerator > 0, denominator > 0)
    return tf.where(safe, numerator / tf.where(safe, denominator, tf.ones_like(denominator)),
                    tf.ones_like(numerator))


class _WithSlots(tf.keras.optimizers.Optimizer):
    """A Keras 2 optimizer that keeps one slot variable per model variable for each name in SLOTS."""

    SLOTS: tuple[str, ...] = ()

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._slots = {name: [self.add_variable_from_reference(v, name) for v in var_list] for name in self.SLOTS}

    def _slot(self, name, variable):
        return self._slots[name][self._index_dict[self._var_key(variable)]]


class LARS(_WithSlots):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017), Algorithm 1.

    For each variable w with gradient g:
    ``local_lr = eta * ||w|| / (||g|| + weight_decay * ||w||)``,
    ``v <- momentum * v + learning_rate * local_lr * (g + weight_decay * w)``, ``w <- w - v``.
    """

    SLOTS = ("velocity",)

    def __init__(self, learning_rate=0.1, momentum=0.9, eta=0.001, weight_decay_rate=0.0,
                 name="LARS", **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.momentum = momentum
        self.eta = eta
        self.weight_decay_rate = weight_decay_rate

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        wd = tf.cast(self.weight_decay_rate, dtype)
        velocity = self._slot("velocity", variable)
        gradient = tf.convert_to_tensor(gradient)
        w_norm, g_norm = tf.norm(variable), tf.norm(gradient)
        local_lr = tf.cast(self.eta, dtype) * _trust_ratio(w_norm, g_norm + wd * w_norm)
        velocity.assign(tf.cast(self.momentum, dtype) * velocity + lr * local_lr * (gradient + wd * variable))
        variable.assign_sub(velocity)

    def get_config(self):
        config = super().get_config()
        config.update({"learning_rate": self._serialize_hyperparameter(self._learning_rate),
                       "momentum": self.momentum, "eta": self.eta,
                       "weight_decay_rate": self.weight_decay_rate})
        return config


class LAMB(_WithSlots):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2020), Algorithm 2.

    ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``, bias-corrected ``m_hat``, ``v_hat``;
    ``r = m_hat / (sqrt(v_hat) + epsilon) + weight_decay * w``;
    ``w <- w - learning_rate * (||w|| / ||r||) * r``.
    """

    SLOTS = ("m", "v")

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay_rate=0.0, name="LAMB", **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.weight_decay_rate = weight_decay_rate

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        m, v = self._slot("m", variable), self._slot("v", variable)
        gradient = tf.convert_to_tensor(gradient)
        m.assign(b1 * m + (1 - b1) * gradient)
        v.assign(b2 * v + (1 - b2) * tf.square(gradient))
        m_hat = m / (1 - tf.pow(b1, step))
        v_hat = v / (1 - tf.pow(b2, step))
        update = m_hat / (tf.sqrt(v_hat) + tf.cast(self.epsilon, dtype)) \
            + tf.cast(self.weight_decay_rate, dtype) * variable
        trust = _trust_ratio(tf.norm(variable), tf.norm(update))
        variable.assign_sub(lr * trust * update)

    def get_config(self):
        config = super().get_config()
        config.update({"learning_rate": self._serialize_hyperparameter(self._learning_rate),
                       "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                       "weight_decay_rate": self.weight_decay_rate})
        return config
