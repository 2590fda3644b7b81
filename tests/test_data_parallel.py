"""Data-parallel correctness with real Horovod processes.

Four workers, each on its own quarter of every batch, with ``hvd.DistributedOptimizer`` must end
with the same weights as one process trained on the concatenated batches: the all-reduce averages
the four gradients, which is the gradient of the mean loss over the whole batch. If the all-reduce
silently stopped (as it does with Keras 3 installed), rank 0 would only have learned from its own
quarter and this test fails.
"""

import numpy as np
import pytest

from mgpu.runtime import launch

pytestmark = pytest.mark.slow

WORKERS = 4
PER_WORKER_BATCH = 8
STEPS = 6
LEARNING_RATE = 0.1


def _problem():
    rng = np.random.default_rng(42)
    x = rng.normal(size=(STEPS * WORKERS * PER_WORKER_BATCH, 12)).astype(np.float32)
    y = (x @ rng.normal(size=(12, 3)) + 0.1 * rng.normal(size=(len(x), 3))).argmax(axis=1)
    return x, y


def _model(seed):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([
        tf.keras.Input(shape=(12,)),
        tf.keras.layers.Dense(16, activation="tanh"),
        tf.keras.layers.Dense(3),
    ])


def _train_on_workers(broadcast: bool):
    import horovod.tensorflow as hvd_core
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    # Each rank starts from different weights, as independent processes would.
    model = _model(seed=100 + hvd.rank())
    x, y = _problem()
    # Global batch i holds rows [i*G, (i+1)*G); rank r takes its r-th slice of every global batch.
    global_batch = PER_WORKER_BATCH * hvd.size()
    rows = np.concatenate([np.arange(i * global_batch + hvd.rank() * PER_WORKER_BATCH,
                                     i * global_batch + (hvd.rank() + 1) * PER_WORKER_BATCH)
                           for i in range(STEPS)])
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LEARNING_RATE))
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if broadcast:
        # Before the first step. (Horovod's BroadcastGlobalVariablesCallback broadcasts at the
        # end of the first batch, after each rank took one step from its own weights.)
        hvd_core.broadcast_variables(model.variables, root_rank=0)
    start = [w.copy() for w in model.get_weights()]
    model.fit(x[rows], y[rows], batch_size=PER_WORKER_BATCH, epochs=1, shuffle=False, verbose=0)
    weights = model.get_weights()

    def spread(arrays):
        flat = np.concatenate([a.ravel() for a in arrays])
        every_rank = hvd.allgather(tf.constant(flat[None, :])).numpy()
        return float(np.abs(every_rank - every_rank[0]).max())

    return {"initial_rank0": start, "weights": weights,
            "initial_spread": spread(start), "final_spread": spread(weights)}


def _train_one_process(initial_weights):
    import tensorflow as tf

    model = _model(seed=100)
    model.set_weights(initial_weights)
    model.compile(optimizer=tf.keras.optimizers.SGD(LEARNING_RATE),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _problem()
    model.fit(x, y, batch_size=PER_WORKER_BATCH * WORKERS, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def test_four_workers_equal_one_process_on_the_concatenated_batch():
    result = launch.run(_train_on_workers, WORKERS, kwargs={"broadcast": True}, verbose=False).value
    # Broadcast made every rank start from rank 0's weights, and they stayed equal.
    assert result["initial_spread"] == 0.0
    assert result["final_spread"] < 1e-6
    reference = _train_one_process(result["initial_rank0"])
    moved = max(np.abs(r - s).max() for r, s in zip(reference, result["initial_rank0"]))
    assert moved > 1e-2  # training changed the weights: the comparison below means something
    difference = max(np.abs(d - s).max() for d, s in zip(result["weights"], reference))
    print(f"max |4 workers - 1 process| weight difference: {difference:.2e}")  # `pytest -s` shows it
    for distributed, single in zip(result["weights"], reference):
        np.testing.assert_allclose(distributed, single, rtol=0, atol=2e-6)


def test_without_broadcast_workers_end_apart():
    result = launch.run(_train_on_workers, WORKERS, kwargs={"broadcast": False}, verbose=False).value
    # Same averaged gradients, different starting points: the ranks never agree.
    assert result["initial_spread"] > 1e-2
    assert result["final_spread"] > 1e-2
