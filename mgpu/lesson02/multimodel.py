"""Many small MLPs trained side by side in one batched TensorFlow computation (notebook 02 onwards).

A learning-rate sweep over a grid of 10 rates, with and without momentum, is 20 independent
training runs of the same small network. Run one after the other with ``model.fit``, tiny batches
spend most of their time in per-step overhead. Here the 20 networks are one set of tensors with a
leading *model* axis: the weights of model ``m`` are ``w1[m]``, ``b1[m]``, ``w2[m]``, ``b2[m]``, and
one batched matrix product (``einsum``) runs all of them on the same minibatch. A whole chunk of SGD
steps runs inside one compiled ``tf.function`` loop, so a step costs tens of microseconds of
overhead instead of milliseconds.

The network is a one-hidden-layer ReLU MLP (``d -> hidden -> classes``) with He-initialized
weights. Parameters are a tuple of four tensors, each with the model axis first:

* :func:`init_params` makes them (every model the same start, or one start per model);
* :func:`logits`, :func:`mean_losses`, :func:`accuracies` evaluate all models at once;
* :func:`sgd_chunk` runs ``n`` SGD steps (per-model, per-step learning rates; per-model momentum);
* :func:`microbatch_gradient_sq_norms` gives the squared gradient norm of one model on each of
  ``k`` small batches and on their union, what :mod:`mgpu.lesson02.noise_scale` needs;
* :func:`flat`, :func:`unflat` convert between the tuple and one long vector per model (used by
  :mod:`mgpu.lesson02.sharpness`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["init_params", "logits", "mean_losses", "accuracies", "sgd_chunk", "evaluate",
           "microbatch_gradient_sq_norms", "take", "flat", "unflat", "n_models"]


def init_params(n_models: int, n_in: int, hidden: int, n_classes: int, seed: int,
                same_start: bool = True) -> tuple[tf.Tensor, ...]:
    """He-normal weights, zero biases, for ``n_models`` MLPs ``n_in -> hidden -> n_classes``.

    With ``same_start`` every model starts from the same point (drawn from ``seed``), so models that
    differ only in their learning rate are compared from a common start.
    """
    rng = np.random.default_rng(seed)
    draws = 1 if same_start else n_models
    w1 = rng.standard_normal((draws, n_in, hidden)) * np.sqrt(2.0 / n_in)
    w2 = rng.standard_normal((draws, hidden, n_classes)) * np.sqrt(1.0 / hidden)
    w1 = np.broadcast_to(w1, (n_models, n_in, hidden))
    w2 = np.broadcast_to(w2, (n_models, hidden, n_classes))
    return (tf.constant(w1, tf.float32), tf.zeros((n_models, hidden)),
            tf.constant(w2, tf.float32), tf.zeros((n_models, n_classes)))


def n_models(params) -> int:
    return int(params[0].shape[0])


def take(params, index) -> tuple[tf.Tensor, ...]:
    """The models at ``index`` (a list of model numbers), still with the model axis."""
    return tuple(tf.gather(p, index) for p in params)


def logits(params, x):
    """Logits of every model: ``x`` is ``(batch, d)`` (shared) or ``(models, batch, d)``."""
    w1, b1, w2, b2 = params
    if len(x.shape) == 2:
        h = tf.einsum("bi,mih->mbh", x, w1)
    else:
        h = tf.einsum("mbi,mih->mbh", x, w1)
    h = tf.nn.relu(h + b1[:, None, :])
    return tf.einsum("mbh,mhc->mbc", h, w2) + b2[:, None, :]


def _per_model_loss(params, x, y):
    z = logits(params, x)
    if len(y.shape) == 1:
        y = tf.broadcast_to(y[None, :], tf.shape(z)[:2])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z), axis=1)


@tf.function(reduce_retracing=True)
def _losses_and_correct(params, x, y):
    z = logits(params, x)
    yy = tf.broadcast_to(y[None, :], tf.shape(z)[:2])
    loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yy, logits=z), axis=1)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(z, axis=2, output_type=tf.int32), yy),
                                    tf.float32), axis=1)
    return loss, correct


def evaluate(params, x, y, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Mean cross-entropy and accuracy of every model on ``(x, y)``: two arrays of shape (models,).

    A model whose weights have become NaN or infinite gets a loss of +inf.
    """
    total_loss = np.zeros(n_models(params))
    total_correct = np.zeros(n_models(params))
    for start in range(0, len(x), chunk):
        loss, correct = _losses_and_correct(params, tf.constant(x[start:start + chunk]),
                                            tf.constant(y[start:start + chunk], tf.int32))
        total_loss += loss.numpy()
        total_correct += correct.numpy()
    loss = total_loss / len(x)
    loss[~np.isfinite(loss)] = np.inf
    return loss, total_correct / len(x)


def mean_losses(params, x, y) -> np.ndarray:
    """Mean cross-entropy of every model on ``(x, y)``, shape (models,)."""
    return evaluate(params, x, y)[0]


def accuracies(params, x, y) -> np.ndarray:
    """Accuracy of every model on ``(x, y)``, shape (models,)."""
    return evaluate(params, x, y)[1]


def _sgd_step(params, velocity, x, y, lr, momenta):
    with tf.GradientTape() as tape:
        tape.watch(params)
        loss = tf.reduce_sum(_per_model_loss(params, x, y))
    grads = tape.gradient(loss, params)
    new_params, new_velocity = [], []
    for p, v, g in zip(params, velocity, grads):
        shape = [-1] + [1] * (len(p.shape) - 1)
        v = tf.reshape(momenta, shape) * v + g
        new_velocity.append(v)
        new_params.append(p - tf.reshape(lr, shape) * v)
    return tuple(new_params), tuple(new_velocity)


@tf.function(reduce_retracing=True)
def _sgd_chunk(params, velocity, x_all, y_all, batches, lrs, momenta):
    def body(i, params, velocity):
        index = batches[i]
        params, velocity = _sgd_step(params, velocity, tf.gather(x_all, index),
                                     tf.gather(y_all, index), lrs[i], momenta)
        return i + 1, params, velocity

    _, params, velocity = tf.while_loop(lambda i, *_: i < tf.shape(batches)[0], body,
                                        (tf.constant(0), tuple(params), tuple(velocity)))
    return params, velocity


def sgd_chunk(params, velocity, x_all, y_all, batches: np.ndarray, lrs: np.ndarray,
              momenta: np.ndarray):
    """Run ``len(batches)`` steps of SGD with heavy-ball momentum on every model at once.

    ``x_all``, ``y_all``: the training arrays (tensors, kept on the device between chunks).
    ``batches``: ``(steps, batch)`` example indices; all models see the same minibatches.
    ``lrs``: ``(steps, models)`` learning rate of each model at each step (warm-up schedules are
    just rows that grow). ``momenta``: ``(models,)``; 0 is plain SGD. The update is
    ``v <- mu v + g``, ``w <- w - lr v``. Returns the new ``(params, velocity)``.
    """
    return _sgd_chunk(tuple(params), tuple(velocity), x_all, y_all,
                      tf.constant(batches, tf.int32), tf.constant(lrs, tf.float32),
                      tf.constant(momenta, tf.float32))


@tf.function(reduce_retracing=True)
def _micro_norms(params, x, y):
    # x: (k, b, d); the one model's weights are repeated k times so each copy sees one microbatch.
    k = tf.shape(x)[0]
    tiled = [tf.repeat(p, k, axis=0) for p in params]
    with tf.GradientTape() as tape:
        tape.watch(tiled)
        loss = tf.reduce_sum(_per_model_loss(tiled, x, y))
    grads = tape.gradient(loss, tiled)
    small = tf.add_n([tf.reduce_sum(tf.reshape(g, [k, -1]) ** 2, axis=1) for g in grads])
    big = tf.add_n([tf.reduce_sum(tf.reduce_mean(g, axis=0) ** 2) for g in grads])
    return small, big


def microbatch_gradient_sq_norms(params, x: np.ndarray, y: np.ndarray, k: int):
    """Squared gradient norms of the first model of ``params`` on ``k`` microbatches and their union.

    ``x``, ``y`` hold ``k * b`` examples, split into ``k`` consecutive microbatches of ``b``. Returns
    ``(small, big)``: ``small`` has the ``k`` values ``|G_b|^2`` (one per microbatch, as each worker
    of a data-parallel job would see), ``big`` is ``|G_kb|^2`` of the average gradient (what the
    all-reduce gives).
    """
    b = len(x) // k
    one = tuple(p[:1] for p in params)
    small, big = _micro_norms(one, tf.constant(x[: k * b].reshape(k, b, -1), tf.float32),
                              tf.constant(y[: k * b].reshape(k, b), tf.int32))
    return small.numpy(), float(big)


def flat(params) -> np.ndarray:
    """One row per model: all parameters concatenated, shape ``(models, n_parameters)``."""
    m = n_models(params)
    return np.concatenate([np.asarray(p).reshape(m, -1) for p in params], axis=1)


def unflat(vectors: np.ndarray, like) -> tuple[tf.Tensor, ...]:
    """Inverse of :func:`flat`: rows of ``vectors`` shaped like the parameters ``like``."""
    vectors = np.asarray(vectors, np.float32)
    m = vectors.shape[0]
    out, start = [], 0
    for p in like:
        size = int(np.prod(p.shape[1:]))
        out.append(tf.constant(vectors[:, start:start + size].reshape((m, *p.shape[1:]))))
        start += size
    return tuple(out)
