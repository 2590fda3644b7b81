"""What notebook 07 teaches, as its cells define it: generated from notebooks/07_communication.ipynb
by ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; see mgpu.runtime.saved)."""


# --- cell 1 of 2 ---
import tensorflow as tf


def twobit_quantise(values, residual):
    # Returns (codes, scale, new_residual): codes uint8 in {0, 1, 2, 3}; code k stands for (k - 1.5) * scale.
    corrected = values + residual
    scale = tf.reduce_mean(tf.abs(corrected))
    codes = (tf.cast(corrected >= -scale, tf.uint8) + tf.cast(corrected >= 0, tf.uint8)
             + tf.cast(corrected >= scale, tf.uint8))
    return codes, scale, corrected - (tf.cast(codes, corrected.dtype) - 1.5) * scale


# --- cell 2 of 2 ---
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd


def twobit_allreduce(gradient, residual):
    # Returns (average, new_residual); hands Horovod only the packed codes (uint8) and the scale (float32, [1]).
    codes, scale, new_residual = twobit_quantise(gradient, residual)
    n = int(np.prod(gradient.shape))
    flat = tf.pad(tf.reshape(tf.cast(codes, tf.int32), [-1]), [[0, -n % 4]])
    packed = tf.cast(tf.reduce_sum(tf.reshape(flat, [-1, 4]) * [1, 4, 16, 64], axis=1), tf.uint8)
    every_packed = tf.reshape(tf.cast(hvd.allgather(packed), tf.int32), [-1, packed.shape[0]])  # a row per worker
    every_scale = hvd.allgather(tf.reshape(tf.cast(scale, tf.float32), [1]))
    every_codes = tf.stack([every_packed // 4 ** k % 4 for k in range(4)], axis=2)
    every_codes = tf.reshape(every_codes, [tf.shape(every_packed)[0], -1])[:, :n]
    levels = (tf.cast(every_codes, tf.float32) - 1.5) * every_scale[:, None]
    average = tf.reshape(tf.reduce_mean(levels, axis=0), gradient.shape)
    return tf.cast(average, gradient.dtype), new_residual
