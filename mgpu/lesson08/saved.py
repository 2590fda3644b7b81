"""What notebook 08 teaches, as its cells define it: generated from notebooks/08_memory.ipynb
by ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; see mgpu.runtime.saved)."""


# --- cell 1 of 3 ---
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd


class FlatAdam:
    """Adam (Kingma & Ba 2015) on one flat float32 vector; its state, m and v, has the vector's size."""

    def __init__(self, size, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7):
        self.m, self.v = tf.Variable(tf.zeros([size])), tf.Variable(tf.zeros([size]))
        self.lr, self.beta1, self.beta2, self.epsilon, self.t = lr, beta1, beta2, epsilon, 0

    def step(self, param, grad):  # returns the updated parameters
        self.t += 1
        self.m.assign(self.beta1 * self.m + (1 - self.beta1) * grad)
        self.v.assign(self.beta2 * self.v + (1 - self.beta2) * grad * grad)
        m_hat = self.m / (1 - self.beta1 ** self.t)
        v_hat = self.v / (1 - self.beta2 ** self.t)
        return param - self.lr * m_hat / (tf.sqrt(v_hat) + self.epsilon)


def padded(flat, n):  # a flat tensor with zeros appended up to a multiple of n
    return tf.pad(flat, [[0, -int(flat.shape[0]) % n]])


def dense(x, theta, fan_in, fan_out, hidden):  # theta: the layer's weights, then its biases, flat
    w = tf.reshape(theta[:fan_in * fan_out], [fan_in, fan_out])
    z = tf.matmul(x, w) + theta[fan_in * fan_out:fan_in * fan_out + fan_out]
    return tf.tanh(z) if hidden else z  # tanh on hidden layers, the logits as they are


def cross_entropy(logits, y):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def dp_step(params, adams, x, y, specs):
    # Plain data parallelism: every worker holds every theta, gradient and Adam state; one all-reduce a layer.
    with tf.GradientTape() as tape:
        h = x
        for theta, spec in zip(params, specs):
            h = dense(h, theta, *spec)
        loss = cross_entropy(h, y)
    grads = tape.gradient(loss, params)
    for theta, grad, adam in zip(params, grads, adams):
        theta.assign(adam.step(theta, hvd.allreduce(grad, op=hvd.Average)))
    return grads  # what the step holds at the end of its backward pass


# --- cell 2 of 3 ---
def zero1_update(theta, grad, adam):
    # Updates theta (the whole layer, on every worker) keeping Adam's state for this worker's shard only.
    n, rank = hvd.size(), hvd.rank()
    grad_shard = hvd.reducescatter(padded(grad, n), op=hvd.Average)
    theta_shard = tf.reshape(padded(theta, n), [n, -1])[rank]
    theta.assign(hvd.allgather(adam.step(theta_shard, grad_shard))[:theta.shape[0]])


def zero1_step(params, adams, x, y, specs):
    with tf.GradientTape() as tape:
        h = x
        for theta, spec in zip(params, specs):
            h = dense(h, theta, *spec)
        loss = cross_entropy(h, y)
    grads = tape.gradient(loss, params)
    for theta, grad, adam in zip(params, grads, adams):
        zero1_update(theta, grad, adam)
    return grads


# --- cell 3 of 3 ---
def layer_gradients(x, theta, dy, spec):  # a layer's backward pass: the gradients of its input and of theta
    with tf.GradientTape() as tape:
        tape.watch([x, theta])
        y = dense(x, theta, *spec)
    return tape.gradient(y, [x, theta], output_gradients=dy)


def zero2_dense(x, theta, spec, shards):
    @tf.custom_gradient
    def layer(x, theta_value):
        def backward(dy):
            dx, dtheta = layer_gradients(x, theta_value, dy, spec)
            shards.append(hvd.reducescatter(padded(dtheta, hvd.size()), op=hvd.Average))
            return dx, None  # the whole gradient is dropped here: only its shard is kept
        return dense(x, theta_value, *spec), backward
    return layer(x, tf.convert_to_tensor(theta))


def zero2_step(params, adams, x, y, specs):
    n, rank, shards = hvd.size(), hvd.rank(), []
    with tf.GradientTape() as tape:
        h = x
        for theta, spec in zip(params, specs):
            h = zero2_dense(h, theta, spec, shards)
        loss = cross_entropy(h, y)
    tape.gradient(loss, params)  # runs the backward pass, last layer first: each layer appends its shard
    for theta, grad_shard, adam in zip(params, shards[::-1], adams):
        theta_shard = tf.reshape(padded(theta, n), [n, -1])[rank]
        theta.assign(hvd.allgather(adam.step(theta_shard, grad_shard))[:theta.shape[0]])
    return shards


def zero3_dense(x, shard, spec):
    size = spec[0] * spec[1] + spec[1]  # the layer's parameters, without the padding

    @tf.custom_gradient
    def layer(x, shard_value):
        y = dense(x, hvd.allgather(shard_value)[:size], *spec)  # gathered for the forward pass, then dropped

        def backward(dy):
            theta = hvd.allgather(shard_value)[:size]  # gathered again for the backward pass
            dx, dtheta = layer_gradients(x, theta, dy, spec)
            return dx, hvd.reducescatter(padded(dtheta, hvd.size()), op=hvd.Average)
        return y, backward
    return layer(x, tf.convert_to_tensor(shard))


def zero3_step(params, adams, x, y, specs):  # params: this worker's shards
    with tf.GradientTape() as tape:
        h = x
        for shard, spec in zip(params, specs):
            h = zero3_dense(h, shard, spec)
        loss = cross_entropy(h, y)
    grad_shards = tape.gradient(loss, params)
    for shard, grad_shard, adam in zip(params, grad_shards, adams):
        shard.assign(adam.step(shard, grad_shard))
    return grad_shards
