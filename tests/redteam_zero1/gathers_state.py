# Red-team case for Assessment B: shards the update, then gathers the full state on every rank.
# A ZeRO-1 step (reduce-scatter, update of the shard, all-gather of the parameters), after which
# each worker also all-gathers the master copy, m and v of every shard and keeps them ("for a
# checkpoint"): every rank ends up holding the whole optimizer state, and sends more per step.
# Expected verdict: fails on "state" and on "communication"; weights pass.
def train():
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
    mine = slice(rank * shard, (rank + 1) * shard)

    def flatten(tensors):
        return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)

    master = tf.Variable(tf.pad(flatten(variables), [[0, pad]])[mine])
    m = tf.Variable(tf.zeros([shard]))
    v = tf.Variable(tf.zeros([shard]))
    full = {name: tf.Variable(tf.zeros([shard * size])) for name in ("master", "m", "v")}

    def train_step(step, x, y):
        with tf.GradientTape() as tape:
            loss = settings.loss(model(x, training=True), y)
        g = hvd.reducescatter(tf.pad(flatten(tape.gradient(loss, variables)), [[0, pad]]), op=hvd.Average)
        zero1.adam_update(master, m, v, g, step)
        params = hvd.allgather(master)
        for name, part in (("master", master), ("m", m), ("v", v)):
            full[name].assign(params if name == "master" else hvd.allgather(part))
        for var, piece in zip(variables, tf.split(params[:psi], sizes)):
            var.assign(tf.reshape(piece, var.shape))

    return settings.drive(model, train_step)
