"""mgpu.lesson09.model_parallel: micro-batches, GPipe's schedule and its bubble, the pipeline harness with
real TensorFlow stages, and the same gradient three ways (one batch, accumulated micro-batches,
real Horovod workers with an all-reduce)."""

import threading

import numpy as np
import pytest

import mgpu  # noqa: F401  (before tensorflow)
from mgpu.lesson09 import model_parallel as mp
from mgpu.runtime import launch


# --------------------------------------------------------------------------------------------
# Micro-batches and the schedule


def test_split_micro_batches_covers_the_batch_in_order_with_sizes_differing_by_at_most_one():
    for n, m in [(256, 4), (10, 3), (7, 7), (5, 1)]:
        parts = mp.split_micro_batches(n, m)
        assert len(parts) == m
        assert parts[0].start == 0 and parts[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        sizes = [p.stop - p.start for p in parts]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(ValueError):
        mp.split_micro_batches(3, 4)
    with pytest.raises(ValueError):
        mp.split_micro_batches(3, 0)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 5, 16])
def test_the_gpipe_schedule_respects_dependencies_and_its_idle_fraction_is_the_bubble(stages, micro_batches):
    schedule = mp.gpipe_schedule(stages, micro_batches)
    when = {(s, kind, m): t for t, s, kind, m in schedule}
    assert len(when) == len(schedule) == 2 * stages * micro_batches
    for s in range(stages):
        for m in range(micro_batches):
            if s > 0:
                assert when[(s, "F", m)] > when[(s - 1, "F", m)], "a stage runs before its input exists"
            if s + 1 < stages:
                assert when[(s, "B", m)] > when[(s + 1, "B", m)], "a backward runs before its gradient exists"
            assert when[(s, "B", m)] > when[(s, "F", m)]
    # Counted cell by cell, the idle fraction is GPipe's formula.
    assert mp.schedule_idle_fraction(schedule, stages) == pytest.approx(mp.bubble_fraction(stages, micro_batches))
    # The same accounting from intervals of one second per tick.
    intervals = [mp.Interval(s, kind, m, float(t), t + 1.0) for t, s, kind, m in schedule]
    assert mp.idle_fraction(intervals, stages) == pytest.approx(mp.bubble_fraction(stages, micro_batches))


def test_bubble_fraction_values():
    assert mp.bubble_fraction(1, 1) == 0
    assert mp.bubble_fraction(2, 1) == 0.5
    assert mp.bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert mp.bubble_fraction(4, 1) > mp.bubble_fraction(4, 4) > mp.bubble_fraction(4, 32)


def test_idle_fraction_counts_overlapping_work_of_one_stage_once_and_gaps_as_idle():
    intervals = [mp.Interval(0, "F", 0, 0.0, 2.0), mp.Interval(0, "F", 1, 1.0, 3.0),  # stage 0 busy 0..3
                 mp.Interval(1, "F", 0, 3.0, 4.0)]                                     # stage 1 busy 3..4
    assert mp.busy_by_stage(intervals, 2) == [3.0, 1.0]
    assert mp.idle_fraction(intervals, 2) == pytest.approx(1 - 4.0 / (2 * 4.0))


# --------------------------------------------------------------------------------------------
# The harness


class _Recorder:
    """A stage that adds its number to the value and logs what it was called with."""

    def __init__(self, number, log):
        self.number, self.log = number, log

    def forward(self, m, x):
        self.log.append((self.number, "F", m, threading.current_thread().name))
        return x + self.number

    def backward(self, m, dy):
        self.log.append((self.number, "B", m, threading.current_thread().name))
        return (0 if dy is None else dy) + 10 ** self.number


@pytest.mark.parametrize("runner", [mp.run_pipeline, mp.run_sequential])
def test_the_harness_runs_every_forward_then_backward_in_gpipe_order_and_records_each_call(runner):
    log = []
    stages = [_Recorder(s, log) for s in range(3)]
    run = runner(stages, [100, 200, 300, 400])
    assert len(run.intervals) == 2 * 3 * 4 and run.stages == 3 and run.micro_batches == 4
    for s in range(3):
        mine = [(kind, m) for number, kind, m, _ in log if number == s]
        assert mine == [("F", m) for m in range(4)] + [("B", m) for m in reversed(range(4))]
    for i in run.intervals:
        assert i.end >= i.start >= 0
        if i.kind == "F" and i.stage > 0:
            before = next(j for j in run.intervals if (j.stage, j.kind, j.micro_batch) == (i.stage - 1, "F", i.micro_batch))
            assert i.start >= before.end, "a stage started before its input was ready"
    if runner is mp.run_pipeline:
        assert {name for s, _, _, name in log if s == 0} != {name for s, _, _, name in log if s == 1}, \
            "each stage runs in its own thread"
    assert 0.0 <= run.idle_fraction < 1.0


def test_the_pipeline_passes_values_forward_and_gradients_back():
    seen = {}

    class Last(_Recorder):
        def forward(self, m, x):
            seen[m] = x
            return x

    log = []
    got_back = []

    class First(_Recorder):
        def backward(self, m, dy):
            got_back.append((m, dy))
            return dy

    mp.run_pipeline([First(1, log), _Recorder(2, log), Last(0, log)], [10, 20])
    assert seen == {0: 13, 1: 23}
    assert sorted(got_back) == [(0, 1 + 100), (1, 1 + 100)]  # Last adds 10**0, the middle 10**2


def test_an_exception_in_a_stage_is_raised_by_run_pipeline():
    class Broken(_Recorder):
        def forward(self, m, x):
            raise ZeroDivisionError("stage 1 failed")

    with pytest.raises(ZeroDivisionError, match="stage 1 failed"):
        mp.run_pipeline([_Recorder(0, []), Broken(1, []), _Recorder(2, [])], [1, 2, 3], timeout=30)


class _DenseStage:
    """A real TensorFlow stage: one dense layer; the last one adds the loss. Re-materialises."""

    def __init__(self, w, last, batch):
        import tensorflow as tf

        self.tf, self.w, self.last, self.batch = tf, tf.Variable(w), last, batch
        self.saved, self.grad = {}, None

    def _apply(self, x):
        y = self.tf.matmul(x, self.w)
        return y if self.last else self.tf.tanh(y)

    def forward(self, m, inputs):
        self.saved[m] = inputs
        return self._apply(inputs[0]), inputs[1]

    def backward(self, m, dy):
        tf = self.tf
        x, labels = self.saved.pop(m)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = self._apply(x)
            if self.last:
                y = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, y)) / self.batch
        dx, dw = tape.gradient(y, [x, self.w], output_gradients=None if self.last else dy)
        self.grad = dw if self.grad is None else self.grad + dw
        return dx


def test_a_pipelined_tensorflow_step_gives_the_gradient_of_the_whole_batch():
    import tensorflow as tf

    rng = np.random.default_rng(3)
    weights = [rng.normal(size=(6, 8)).astype(np.float32), rng.normal(size=(8, 8)).astype(np.float32),
               rng.normal(size=(8, 4)).astype(np.float32)]
    x = rng.normal(size=(24, 6)).astype(np.float32)
    y = rng.integers(0, 4, 24).astype(np.int32)
    variables = [tf.Variable(w) for w in weights]
    with tf.GradientTape() as tape:
        h = tf.tanh(x @ variables[0])
        h = tf.tanh(h @ variables[1])
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, h @ variables[2]))
    expected = tape.gradient(loss, variables)
    for m in (1, 3, 8):
        stages = [_DenseStage(w, i == 2, 24) for i, w in enumerate(weights)]
        parts = [(tf.constant(x[p]), tf.constant(y[p])) for p in mp.split_micro_batches(24, m)]
        mp.run_pipeline(stages, parts)
        for stage, g in zip(stages, expected):
            np.testing.assert_allclose(stage.grad.numpy(), g.numpy(), rtol=1e-5, atol=1e-6)
    # A wrong schedule would not: dropping a micro-batch changes the gradient.
    stages = [_DenseStage(w, i == 2, 24) for i, w in enumerate(weights)]
    mp.run_pipeline(stages, [(tf.constant(x[p]), tf.constant(y[p])) for p in mp.split_micro_batches(24, 3)[:2]])
    assert not np.allclose(stages[0].grad.numpy(), expected[0].numpy(), rtol=1e-3)


# --------------------------------------------------------------------------------------------
# Accounting


def test_activation_values_per_example_adds_every_layer_output():
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(3), tf.keras.layers.Dense(2)])
    assert mp.activation_values_per_example(model) == 5
    conv = tf.keras.Sequential([tf.keras.Input((8, 8, 1)), tf.keras.layers.Conv2D(4, 3, padding="same"),
                                tf.keras.layers.Flatten()])
    assert mp.activation_values_per_example(conv) == 2 * 8 * 8 * 4


def test_hybrid_plan_numbers():
    plan = mp.hybrid_plan(replicas=4, stages=2, micro_batches=6, batch=12, activation_values=10,
                          parameters_by_stage=[100, 300])
    assert plan["devices"] == 8 and plan["global_batch"] == 48 and plan["micro_batch_size"] == 2
    assert plan["bubble_fraction"] == pytest.approx(1 / 7)
    assert plan["bytes_between_stages_per_replica_step"] == 2 * 1 * 12 * 10 * 4
    assert plan["bytes_allreduce_sent_per_device_max"] == pytest.approx(2 * 3 / 4 * 300 * 4)
    assert plan["bytes_allreduce_sent_all_devices"] == pytest.approx(4 * 2 * 3 / 4 * 400 * 4)
    assert plan["bytes_allreduce_if_pure_data_parallel_per_device"] == pytest.approx(2 * 7 / 8 * 400 * 4)
    with pytest.raises(ValueError):
        mp.hybrid_plan(replicas=2, stages=3, micro_batches=1, batch=4, activation_values=1, parameters_by_stage=[1, 2])


# --------------------------------------------------------------------------------------------
# Three ways to one gradient


def _model(seed):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(3)])


def _gradient(model, x, y):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def _problem():
    rng = np.random.default_rng(5)
    return rng.normal(size=(64, 12)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int32)


def _allreduced(seed):
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    x, y = _problem()
    mine = mp.split_micro_batches(len(x), hvd.size())[hvd.rank()]
    grads = _gradient(_model(seed), x[mine], y[mine])
    return [hvd.allreduce(tf.constant(g), op=hvd.Average).numpy() for g in grads]


@pytest.mark.slow
def test_one_batch_accumulated_micro_batches_and_an_allreduce_give_the_same_gradient():
    x, y = _problem()
    model = _model(1)
    whole = _gradient(model, x, y)
    accumulated = [np.zeros_like(g) for g in whole]
    for part in mp.split_micro_batches(len(x), 4):
        share = (part.stop - part.start) / len(x)
        accumulated = [a + share * g for a, g in zip(accumulated, _gradient(model, x[part], y[part]))]
    reduced = launch.run(_allreduced, 4, args=(1,), verbose=False).value
    for w, a, r in zip(whole, accumulated, reduced):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(r, w, rtol=1e-5, atol=1e-7)
    # Summing the parts' means without weighting them (a common slip) is 4 times too large.
    summed = [np.zeros_like(g) for g in whole]
    for part in mp.split_micro_batches(len(x), 4):
        summed = [a + g for a, g in zip(summed, _gradient(model, x[part], y[part]))]
    assert not np.allclose(summed[0], whole[0], rtol=1e-2)


# --------------------------------------------------------------------------------------------
# Notebook 09's exercise: Megatron's tensor-parallel MLP block on two real Horovod workers


def _notebook_cells():
    """Notebook 09's nbgrader cells by grade id: as written, and in the learner's copy."""
    from mgpu.runtime import labs

    return labs.cell_sources("09")


def _run_tp_exercise(solution_source):
    """What the notebook does: the solution cell, then its test cell (which launches 2 workers)."""
    import tensorflow as tf

    by_id, _ = _notebook_cells()
    namespace = {"tf": tf, "launch": launch, "model_parallel": mp, "seed": 7,
                 "tp_setting": dict(features=16, hidden=32, batch=8)}
    exec(compile(solution_source, "tensor_parallel_mlp_solution", "exec"), namespace)
    exec(compile(by_id["tensor_parallel_mlp_tests"], "tensor_parallel_mlp_tests", "exec"), namespace)
    return namespace["tp_rows"]


def test_the_tensor_parallel_blocks_are_columns_of_w1_and_rows_of_w2_that_rebuild_the_block():
    parts = [mp.tensor_parallel_blocks(6, 8, 2, k, batch=3, seed=1) for k in range(2)]
    x, w1, w2 = parts[0][:3]
    assert all(np.array_equal(p[1], w1) and np.array_equal(p[0], x) for p in parts)
    np.testing.assert_array_equal(np.concatenate([p[4] for p in parts], axis=1), w1)
    np.testing.assert_array_equal(np.concatenate([p[5] for p in parts], axis=0), w2)
    relu = lambda a: np.maximum(a, 0)  # noqa: E731
    np.testing.assert_allclose(sum(relu(x @ p[4]) @ p[5] for p in parts), relu(x @ w1) @ w2, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        mp.tensor_parallel_blocks(6, 7, 2, 0, batch=3, seed=1)


@pytest.mark.slow
def test_the_09_exercise_test_passes_the_solution_on_two_workers():
    by_id, _ = _notebook_cells()
    rows = _run_tp_exercise(by_id["tensor_parallel_mlp_solution"])
    assert [r["rank"] for r in rows] == [0, 1]
    assert all((r["all-reduces forward"], r["all-reduces backward"]) == (1, 1) for r in rows)
    assert all(r["weights held"] * 2 == r["weights of the block"] for r in rows)


PLAIN_ALLREDUCE = '''
def tensor_parallel_mlp(x, w1_block, w2_block):
    import horovod.tensorflow as hvd
    hidden = tf.nn.relu(tf.matmul(x, w1_block))
    return hvd.allreduce(tf.matmul(hidden, w2_block), op=hvd.Sum)
'''
NO_BACKWARD_SUM = '''
def tensor_parallel_mlp(x, w1_block, w2_block):
    import horovod.tensorflow as hvd

    @tf.custom_gradient
    def g(partial):
        return hvd.allreduce(partial, op=hvd.Sum), lambda dy: tf.identity(dy)

    return g(tf.matmul(tf.nn.relu(tf.matmul(x, w1_block)), w2_block))
'''
AVERAGE = '''
def tensor_parallel_mlp(x, w1_block, w2_block):
    import horovod.tensorflow as hvd

    @tf.custom_gradient
    def f(x):
        return tf.identity(x), lambda dx: hvd.allreduce(dx, op=hvd.Sum)

    @tf.custom_gradient
    def g(partial):
        return hvd.allreduce(partial, op=hvd.Average), lambda dy: tf.identity(dy)

    return g(tf.matmul(tf.nn.relu(tf.matmul(f(x), w1_block)), w2_block))
'''


@pytest.mark.slow
@pytest.mark.parametrize("answer, complaint", [
    (None, "NotImplementedError"),                        # the learner's copy, untouched
    (PLAIN_ALLREDUCE, "the weight gradients"),            # Horovod's own gradient of the all-reduce: 2x
    (NO_BACKWARD_SUM, "x's gradient"),                    # f left out: each worker keeps its share of dx
    (AVERAGE, "y is not the unsplit block's"),            # the mean of the partial outputs, not their sum
], ids=["stub", "plain-allreduce", "no-f", "average"])
def test_the_09_exercise_test_rejects_the_stub_and_wrong_blocks(answer, complaint):
    _, released = _notebook_cells()
    with pytest.raises(AssertionError, match=complaint):
        _run_tp_exercise(released["tensor_parallel_mlp_solution"] if answer is None else answer)


# --------------------------------------------------------------------------------------------
# Schedules as orders (GPipe, 1F1B): validity, stashes, the bubble on ideal devices


def _one_f_one_b(stages, micro_batches):
    """A reference 1F1B order (the notebook's exercise has its own)."""
    order = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro_batches)
        entries = [("F", m) for m in range(warmup)]
        for m in range(warmup, micro_batches):
            entries += [("F", m), ("B", m - warmup)]
        order.append(entries + [("B", m) for m in range(micro_batches - warmup, micro_batches)])
    return order


@pytest.mark.parametrize("stages, micro_batches", [(1, 1), (1, 4), (2, 1), (3, 2), (4, 4), (4, 8), (5, 16)])
def test_gpipe_and_1f1b_orders_are_valid_share_the_bubble_and_stash_m_against_at_most_n(stages, micro_batches):
    for make, stashed in ((mp.gpipe_order, micro_batches), (_one_f_one_b, min(stages, micro_batches))):
        order = make(stages, micro_batches)
        assert mp.schedule_problems(order, stages, micro_batches) == []
        assert max(mp.stash_peaks(order)) == stashed
        for backward in (1, 2, 3):
            ticks = mp.simulate_order(order, t_forward=1, t_backward=backward)
            assert max(i.end for i in ticks) == (micro_batches + stages - 1) * (1 + backward)
            assert mp.idle_fraction(ticks, stages) == pytest.approx(mp.bubble_fraction(stages, micro_batches))
    assert mp.stash_peaks(_one_f_one_b(stages, micro_batches)) == [min(stages - s, micro_batches) for s in range(stages)]


def test_schedule_problems_names_what_is_wrong():
    assert "2 lists for 3 stages" in mp.schedule_problems(mp.gpipe_order(2, 2), 3, 2)[0]
    missing = [[("F", 0), ("B", 0)], [("F", 0), ("F", 1), ("B", 1), ("B", 0)]]
    assert "stage 0 must do" in mp.schedule_problems(missing, 2, 2)[0]
    backward_first = [[("B", 0), ("F", 0)]]
    assert "before its forward" in mp.schedule_problems(backward_first, 1, 1)[0]
    # Stage 0 waits for the backward of micro-batch 1 before the forward that stage 1 needs first: a deadlock.
    crossed = [[("F", 1), ("B", 1), ("F", 0), ("B", 0)], [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]
    assert "deadlock" in mp.schedule_problems(crossed, 2, 2)[0]
    assert mp.schedule_problems("nonsense", 1, 1)
    with pytest.raises(RuntimeError, match="deadlock"):
        mp.simulate_order(crossed)


def _run_schedule_exercise(solution_source):
    by_id, _ = _notebook_cells()
    namespace = {"model_parallel": mp, "np": np}
    exec(compile(solution_source, "one_f_one_b_order_solution", "exec"), namespace)
    exec(compile(by_id["one_f_one_b_order_tests"], "one_f_one_b_order_tests", "exec"), namespace)
    return namespace["one_f_one_b_order"]


def test_the_09_schedule_exercise_passes_the_solution_which_is_1f1b():
    by_id, _ = _notebook_cells()
    order = _run_schedule_exercise(by_id["one_f_one_b_order_solution"])
    for n, m in [(3, 7), (4, 2)]:
        assert order(n, m) == _one_f_one_b(n, m)


SCHEDULE_GPIPE = "def one_f_one_b_order(stages, micro_batches):\n    return model_parallel.gpipe_order(stages, micro_batches)\n"
SCHEDULE_ONE_AT_A_TIME = ("def one_f_one_b_order(stages, micro_batches):\n"
                          "    return [[e for m in range(micro_batches) for e in (('F', m), ('B', m))] for _ in range(stages)]\n")
SCHEDULE_LONG_WARMUP = '''
def one_f_one_b_order(stages, micro_batches):
    order = []
    for s in range(stages):
        warmup = min(stages - s, micro_batches)
        entries = [("F", m) for m in range(warmup)]
        for m in range(warmup, micro_batches):
            entries += [("F", m), ("B", m - warmup)]
        order.append(entries + [("B", m) for m in range(micro_batches - warmup, micro_batches)])
    return order
'''
SCHEDULE_BACKWARD_FIRST = '''
def one_f_one_b_order(stages, micro_batches):
    order = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro_batches)
        entries = [("F", m) for m in range(warmup)]
        for m in range(warmup, micro_batches):
            entries += [("B", m - warmup), ("F", m)] if m > warmup else [("F", m), ("B", m - warmup)]
        order.append(entries + [("B", m) for m in range(micro_batches - warmup, micro_batches)])
    return order
'''


@pytest.mark.parametrize("answer, complaint", [
    (None, "NotImplementedError"),                   # the learner's copy, untouched
    (SCHEDULE_GPIPE, "micro-batches stashed"),       # GPipe: M stashed
    (SCHEDULE_ONE_AT_A_TIME, "idles"),               # one micro-batch at a time: valid, 1 stashed, no pipelining
    (SCHEDULE_LONG_WARMUP, "micro-batches stashed"),  # one warm-up forward too many: N + 1 stashed on stage 0
    (SCHEDULE_BACKWARD_FIRST, "before its forward|deadlock|idles"),  # a backward before its forward
], ids=["stub", "gpipe", "one-at-a-time", "long-warm-up", "backward-first"])
def test_the_09_schedule_exercise_rejects_the_stub_and_wrong_orders(answer, complaint):
    _, released = _notebook_cells()
    if answer is None:
        with pytest.raises(NotImplementedError):
            _run_schedule_exercise(released["one_f_one_b_order_solution"])
        return
    with pytest.raises(AssertionError, match=complaint):
        _run_schedule_exercise(answer)


# --------------------------------------------------------------------------------------------
# Stages as processes: the same gradients as the whole batch, the stashes counted


def test_numpy_stages_give_the_gradient_of_the_whole_model():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    weights = [mp._dense_weights(5, 1, 3, s == 1, [4, s]) for s in range(2)]
    got = mp.reference_gradients(x, y, stages=2, width=5, layers=1, classes=3, seed=4)
    # Finite differences on one weight of stage 0.
    def loss(w00):
        w = [list(weights[0]), weights[1]]
        w[0][0] = weights[0][0].astype(np.float64).copy()
        w[0][0][1, 2] = w00
        h = np.tanh(x @ w[0][0])
        h = np.tanh(h @ w[1][0])
        logits = h @ w[1][1]
        logits = logits - logits.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(6), y]))
    w00 = float(weights[0][0][1, 2])
    numeric = (loss(w00 + 1e-4) - loss(w00 - 1e-4)) / 2e-4
    assert got[1 * 5 + 2] == pytest.approx(numeric, rel=1e-2, abs=1e-5)


@pytest.mark.slow
def test_stage_processes_give_the_whole_batchs_gradient_and_count_the_stashes():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(24, 16)).astype(np.float32), rng.integers(0, 10, 24)
    reference = mp.reference_gradients(x, y, stages=3, width=16, layers=2, classes=10, seed=5)
    with mp.ProcessPipeline(3, 16, 2, seed=5, timeout=120) as pipe:
        math = pipe.calibrate(4, repeats=2)
        assert math["forward_s"] > 0 and math["backward_s"] > 0
        for make, stashed in ((mp.gpipe_order, 6), (_one_f_one_b, 3)):
            for device in (None, {"forward_s": 2e-4, "backward_s": 4e-4}):
                run = pipe.step(make(3, 6), x, y, 6, device)
                np.testing.assert_allclose(run["gradients"], reference, rtol=1e-5, atol=1e-6)
                assert max(run["peak_stashed"]) == stashed
                assert len(run["intervals"]) == 2 * 3 * 6 and 0 <= run["idle"] < 1
                if device:  # every call lasts at least its device time
                    assert all(i.end - i.start >= 0.9 * 4 * (2e-4 if i.kind == "F" else 4e-4) for i in run["intervals"])


# --------------------------------------------------------------------------------------------
# The layout cost model on a hand case


def test_the_layout_cost_model_on_a_hand_case():
    gpt = mp.GPT(layers=4, hidden=10, heads=2, vocab=20, sequence=5)
    assert gpt.parameters == pytest.approx(12 * 4 * 100 + 13 * 4 * 10 + (20 + 5) * 10)  # 5570
    memory = mp.layout_memory(gpt, tp=2, pp=2, dp=3, micro_batch=1, micro_batches=5)
    psi = 5570 / 4
    assert memory["weights"] == pytest.approx(2 * psi) and memory["gradients"] == pytest.approx(2 * psi)
    assert memory["optimizer"] == pytest.approx(12 * psi)
    layer = 5 * 1 * 10 * (10 + 24 / 2 + 5 * 2 * 5 / (10 * 2))  # 1225 bytes per layer and micro-batch
    assert memory["activations"] == pytest.approx(2 * 2 * (2 * 5 * 10) + layer)  # 2 in flight x 2 layers x inputs
    assert memory["total"] == pytest.approx(16 * psi + 400 + layer)
    assert mp.layout_memory(gpt, tp=2, pp=2, dp=3, micro_batch=1, micro_batches=5, zero1=True)["optimizer"] == pytest.approx(4 * psi)
    assert mp.layout_memory(gpt, tp=2, pp=2, dp=3, micro_batch=1, micro_batches=1, recompute=False)["activations"] \
        == pytest.approx(1 * 2 * layer)
    step = mp.layout_step(gpt, gpus=12, tp=2, pp=2, batch=6, micro_batch=1, flops_per_gpu=1e3,
                          intra_node_bytes_per_s=100.0, inter_node_bytes_per_s=10.0)
    assert step["dp"] == 3 and step["micro_batches"] == 2 and step["bubble"] == pytest.approx(1 / 3)
    assert step["bytes_sent"]["tensor parallel"] == pytest.approx(6 * 2 * 2 * 1.0 * 100)  # 6 per layer, 2 layers, M = 2
    assert step["bytes_sent"]["data parallel"] == pytest.approx(4 / 3 * 2 * psi)
    assert step["bytes_sent"]["pipeline"] == pytest.approx(2 * 2 * 100)
    compute = gpt.flops_per_step(6) / (12 * 1e3)
    assert step["step_s"] == pytest.approx(compute * 1.5 + 2400 / 100 + (4 / 3 * 2 * psi + 400) / 10)
    with pytest.raises(ValueError):
        mp.layout_step(gpt, gpus=12, tp=2, pp=2, batch=4, micro_batch=1, flops_per_gpu=1.0,
                       intra_node_bytes_per_s=1.0, inter_node_bytes_per_s=1.0)
