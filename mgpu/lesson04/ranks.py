"""What each rank of a converted training script did, gathered on every rank: notebook 04's exercise checks.

:func:`worker_report` is called at the end of the learner's Horovod script (``my_train.py`` in notebook
04): it all-gathers every rank's final weights, epoch losses and shard size, so a check can tell a
converted program (one model, sharded data, averaged metrics) from N independent ones.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def worker_report(model, history, examples: int) -> dict:
    """What a Horovod training function did on every rank, gathered for checks (call on every rank).

    ``examples_by_rank``: training examples each rank read; ``weight_spread``: the largest
    difference between any rank's final weights and rank 0's; ``loss_spread``: the largest
    difference between the ranks' logged epoch losses (zero when metrics are averaged).
    """
    import horovod.tensorflow.keras as hvd

    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)
    weights = hvd.allgather(tf.constant(flat[None, :])).numpy()
    losses = np.asarray(history.history["loss"], dtype=np.float32)
    every_loss = hvd.allgather(tf.constant(losses[None, :])).numpy()
    counts = hvd.allgather(tf.constant([examples], dtype=tf.int64)).numpy()
    return {
        "size": hvd.size(),
        "examples_by_rank": [int(c) for c in counts],
        "weight_spread": float(np.abs(weights - weights[0]).max()),
        "loss_spread": float(np.abs(every_loss - every_loss[0]).max()),
        "val_accuracy": [float(v) for v in history.history.get("val_accuracy", [])],
    }
