"""What notebook 10 teaches, as its cells define it: generated from notebooks/10_several_machines.ipynb
by ``python -m mgpu.runtime.saved`` (edit the notebook, then run it; see mgpu.runtime.saved)."""


# --- cell 1 of 2 ---
def elastic_train(folder, config):
    """One worker of the elastic job. config: seed, n_train, n_test, width, batch (per worker), lr (per worker:
    the rate is lr x workers), epochs, commit_every (steps), device_ms (the modelled device's step, or 0)."""
    import os
    import time

    import numpy as np

    import mgpu  # noqa: F401  (Keras 2 on every stack)
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from mgpu.lesson10.faults import log_event, register_worker, small_model, toy_task, write_json

    hvd.init()
    register_worker(folder, rank=hvd.rank())
    # Gloo's timeout is read at each hvd.init(). The job's holds until the first change of workers: it bounds a
    # survivor's wait for a silent peer. Every later hvd.init() reads join_timeout, time for a joining worker to
    # start Python and TensorFlow, which then also bounds the wait at a second failure.
    os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(config.get("join_timeout", 120))
    tf.keras.utils.set_random_seed(config["seed"])
    x, y, x_test, y_test = toy_task(config["seed"], config["n_train"], config["n_test"])
    model = small_model(x.shape[1], int(y.max()) + 1, config["width"])
    optimizer = tf.keras.optimizers.SGD(config["lr"] * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)  # create the optimizer's variables now: the state holds them
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    batch, device_s, math_s = config["batch"], config.get("device_ms", 0) / 1e3, []

    @tf.function
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def apply(grads):
        grads = [hvd.allreduce(g, op=hvd.Average) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    def train(state):  # an epoch visits one shuffled order; a step takes its next size x batch examples
        while state.epoch < config["epochs"]:
            order = np.random.default_rng([config["seed"], state.epoch]).permutation(len(x))
            while state.position + hvd.size() * batch <= len(x):
                mine = order[state.position + hvd.rank() * batch:][:batch]  # worker r: the r-th slice
                began = time.perf_counter()
                grads = gradients(x[mine], y[mine])
                math_s.append(time.perf_counter() - began)
                time.sleep(max(0.0, began + device_s - time.perf_counter()))  # the modelled device's time
                apply(grads)
                state.position += hvd.size() * batch
                state.examples += hvd.size() * batch
                state.step += 1
                if hvd.rank() == 0:
                    log_event(folder, event="step", size=hvd.size(), step=state.step, epoch=state.epoch,
                              examples=state.examples)
                if state.step % config["commit_every"] == 0:
                    state.commit()
                    if hvd.rank() == 0:
                        log_event(folder, event="commit", step=state.step, examples=state.examples)
            state.epoch, state.position = state.epoch + 1, 0
            state.commit()

    def on_reset():  # on every worker, after one left or joined
        optimizer.learning_rate.assign(config["lr"] * hvd.size())
        if hvd.rank() == 0:  # ranks are dealt anew: rank 0's host
            log_event(folder, event="reset", size=hvd.size(), step=state.step, examples=state.examples,
                      lr=float(optimizer.learning_rate.numpy()), host=os.environ.get("HOROVOD_HOSTNAME", "localhost"))

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, position=0, step=0, examples=0)
    state.register_reset_callbacks([on_reset])
    hvd.elastic.run(train)(state)
    accuracy = float(np.mean(np.argmax(model(x_test).numpy(), axis=1) == y_test))
    if hvd.rank() == 0:
        write_json(os.path.join(folder, "result.json"), {
            "accuracy": accuracy, "size": hvd.size(), "steps": state.step, "examples": state.examples,
            "math_ms_per_step": 1e3 * float(np.median(math_s[1:] or math_s))})
    return {"accuracy": accuracy}


# --- cell 2 of 2 ---
def checkpoint_train(folder, config, trace):
    """One worker of a job that checkpoints every checkpoint_every steps and starts from the last checkpoint
    (folder/../checkpoint.npz, shared by the runs of one job), recording its weights after every step in the
    folder trace. config: seed, n_train, width, batch, lr, steps, checkpoint_every, step_s (a pause after each
    step, so that a kill lands between steps even where a step takes a millisecond; 0 if absent)."""
    import os
    import time
    from pathlib import Path

    import numpy as np

    import mgpu  # noqa: F401  (Keras 2 on every stack)
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from mgpu.lesson10.faults import flat_weights, log_event, register_worker, small_model, toy_task, write_json

    hvd.init()
    register_worker(folder)
    tf.config.experimental.enable_op_determinism()
    tf.keras.utils.set_random_seed(config["seed"] + hvd.rank())  # a different start on every rank
    x, y, _, _ = toy_task(config["seed"], config["n_train"], 16)
    model = small_model(x.shape[1], int(y.max()) + 1, config["width"])
    optimizer = tf.keras.optimizers.SGD(config["lr"], momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    checkpoint, trace = Path(folder).parent / "checkpoint.npz", Path(trace)
    trace.mkdir(parents=True, exist_ok=True)
    variables = model.variables + optimizer.variables  # the weights, the optimizer's step count and momentum

    step = 0
    if hvd.rank() == 0 and checkpoint.exists():
        saved = np.load(checkpoint)
        for i, var in enumerate(variables):
            var.assign(saved[f"v{i}"])
        step = int(saved["step"])
    hvd.broadcast_variables(variables, root_rank=0)
    step = hvd.broadcast_object(step, root_rank=0)
    started_at, loaded = step, flat_weights(model.variables)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    batch = config["batch"]
    while step < config["steps"]:  # a step's batch follows from (seed, step) alone
        order = np.random.default_rng([config["seed"], step]).choice(len(x), hvd.size() * batch, replace=False)
        mine = order[hvd.rank() * batch:(hvd.rank() + 1) * batch]
        train_step(x[mine], y[mine])
        step += 1
        if hvd.rank() == 0:  # the step's record first: a checkpoint is never ahead of the log
            np.save(trace / f"step-{step:04d}.npy", flat_weights(model.variables))
            log_event(folder, event="step", step=step)
            if step % config["checkpoint_every"] == 0:  # a temporary file renamed over the last one
                tmp = checkpoint.with_name("checkpoint.tmp.npz")
                np.savez(tmp, step=step, **{f"v{i}": v.numpy() for i, v in enumerate(variables)})
                os.replace(tmp, checkpoint)
        time.sleep(config.get("step_s", 0.0))
    mine = flat_weights(model.variables)
    spread = max(float(np.abs(w - mine).max()) for w in hvd.allgather_object(mine))
    if hvd.rank() == 0:
        write_json(Path(folder) / "result.json", {"started_at": started_at, "steps": step, "rank_spread": spread})
        np.save(trace / f"loaded-{started_at:04d}.npy", loaded)
    return {"started_at": started_at}
