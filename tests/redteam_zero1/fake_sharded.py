# Red-team case for Assessment B: does not shard, but reports that it does.
# Every worker keeps the master copy, m and v of all psi parameters (plain data parallelism's
# state), yet its communication looks like ZeRO-1's (a reduce-scatter of the gradient and an
# all-gather, the same collectives and bytes), it keeps decoy shard-sized variables, prints and
# returns that it holds 1/N of the state, and writes its own report into output_dir.
# Expected verdict: fails on "state" (the census counts the full state); weights and
# communication pass.
def train():
    import json
    import os

    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow as hvd

    from mgpu import assessment_zero1 as zero1

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = settings.model()
    variables = model.trainable_variables
    sizes = [int(np.prod(v.shape)) for v in variables]
    psi = sum(sizes)
    shard = -(-psi // size)
    pad = shard * size - psi

    def flatten(tensors):
        return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)

    master = tf.Variable(flatten(variables), name="master_shard")
    m = tf.Variable(tf.zeros([psi]), name="m_shard")
    v = tf.Variable(tf.zeros([psi]), name="v_shard")
    decoys = [tf.Variable(tf.zeros([1]), name=f"zero1_shard_{i}") for i in range(3)]

    def train_step(step, x, y):
        with tf.GradientTape() as tape:
            loss = settings.loss(model(x, training=True), y)
        flat = tf.pad(flatten(tape.gradient(loss, variables)), [[0, pad]])
        mine = hvd.reducescatter(flat, op=hvd.Average)
        g = hvd.allgather(mine)[:psi]                       # the whole averaged gradient
        zero1.adam_update(master, m, v, g, step)
        for var, piece in zip(variables, tf.split(master, sizes)):
            var.assign(tf.reshape(piece, var.shape))

    result = settings.drive(model, train_step)
    claim = {"sharded": True, "state_bytes": 12 * shard, "fraction": 1 / size, "decoys": len(decoys)}
    print(f"rank {rank}: ZeRO-1, holding {claim['state_bytes']} bytes of state (1/{size})")
    with open(os.path.join(settings.output_dir, f"zero1_report-rank{rank}.json"), "w") as f:
        json.dump(claim, f)
    return {**result, **claim}
