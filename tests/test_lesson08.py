"""Notebook 08 (memory): the byte formulas, the budget measured from the tensors, and ZeRO on real
Horovod workers (every stage ends with plain data parallelism's weights, holds the bytes its formula
says and hands Horovod the tensors it should); the exercise's test rejects the learner's stub."""

import numpy as np
import pytest

from mgpu.lesson08 import zero
from mgpu.runtime import launch

WIDTHS = (8, 16, 16, 3)  # the last layer has 16 x 3 + 3 = 51 parameters: padded for 2 workers


def test_layer_sizes_padding_and_the_formulas_of_each_stage():
    assert zero.layer_sizes(WIDTHS) == [144, 272, 51]
    assert zero.padded_size(51, 2) == 52 and zero.padded_size(52, 4) == 52 and zero.padded_size(1, 4) == 4
    assert zero.layer_specs(WIDTHS) == [(8, 16, True), (16, 16, True), (16, 3, False)]
    psi, shard = 467, (144 + 272 + 52) // 2
    assert zero.formula_bytes(WIDTHS, 2, "dp") == {"parameters": 4 * psi, "gradients": 4 * psi, "optimizer state": 8 * psi}
    assert zero.formula_bytes(WIDTHS, 2, "zero1") == {"parameters": 4 * psi, "gradients": 4 * psi,
                                                       "optimizer state": 8 * shard}
    assert zero.formula_bytes(WIDTHS, 2, "zero2") == {"parameters": 4 * psi, "gradients": 4 * shard,
                                                       "optimizer state": 8 * shard}
    assert sum(zero.formula_bytes(WIDTHS, 2, "zero3").values()) == 16 * shard


def test_network_bytes_by_the_ring_algorithms():
    entries = [{"op": "allreduce", "bytes": 400}, {"op": "reducescatter", "bytes": 400}, {"op": "allgather", "bytes": 100}]
    assert zero.network_bytes(entries, 4) == pytest.approx(600 + 300 + 300)
    assert zero.network_bytes(entries[:1], 2) == 400


def test_the_budget_measured_from_the_tensors_is_the_prediction():
    import tensorflow as tf

    from mgpu.lesson08 import memory

    model = tf.keras.Sequential([tf.keras.Input((12,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(3)])
    x, y = tf.random.normal((5, 12)), tf.constant([0, 1, 2, 0, 1])
    loss = lambda y, logits: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))  # noqa: E731
    measured = memory.measure_budget(model, tf.keras.optimizers.Adam(), x, y, loss)
    psi = 12 * 8 + 8 + 8 * 3 + 3
    assert measured == {"weights": 4 * psi, "gradients": 4 * psi, "optimizer state": 8 * psi + 8,
                        "activations": 4 * 5 * (8 + 3)}


@pytest.mark.slow
def test_every_zero_stage_trains_to_data_parallel_weights_with_the_formulas_bytes_on_two_workers():
    from mgpu.lesson08 import saved

    stages = {"dp": saved.dp_step, "zero1": saved.zero1_step, "zero2": saved.zero2_step, "zero3": saved.zero3_step}
    rows = launch.run(zero.compare_stages, 2, args=(stages, saved.FlatAdam, WIDTHS, 4, 4, 1e-2, 3), verbose=False).value
    assert sorted((r["stage"], r["rank"]) for r in rows) == sorted((s, k) for s in stages for k in (0, 1))
    dp = {r["rank"]: r for r in rows if r["stage"] == "dp"}
    assert np.array_equal(dp[0]["weights"], dp[1]["weights"])
    assert not np.allclose(dp[0]["weights"], np.concatenate(zero.initial_thetas(3, WIDTHS)))  # it trained
    psi, padded = 467, 468
    for r in rows:
        assert np.array_equal(r["weights"], dp[r["rank"]]["weights"]), r["stage"]  # two workers: bit for bit
        assert {p: r[p] for p in ("parameters", "gradients", "optimizer state")} == zero.formula_bytes(WIDTHS, 2, r["stage"])
        ops = sorted(e["op"] for e in r["collectives"])
        assert ops == {"dp": ["allreduce"] * 3, "zero1": ["allgather"] * 3 + ["reducescatter"] * 3,
                       "zero2": ["allgather"] * 3 + ["reducescatter"] * 3,
                       "zero3": ["allgather"] * 6 + ["reducescatter"] * 3}[r["stage"]]
        rounds = 3 if r["stage"] == "zero3" else 2
        assert zero.network_bytes(r["collectives"], 2) == rounds / 2 * 4 * (psi if r["stage"] == "dp" else padded)


# --------------------------------------------------------------------------------------------
# The exercise: zero1_update, run as the notebook runs it (its solution cell, then its test cell)


def _exercise_cells():
    from mgpu.runtime import labs

    return labs.cell_sources("08")


_JOB = '''
def exercise_job(candidates, adam_class, widths, batch, steps, lr, seed):
    # One launch for every answer: DP and each answer's ZeRO-1 on the same workers; an answer that raises
    # is recorded with its traceback, as a failed launch of it alone would show it.
    import traceback
    runs = {}
    for name, (dp_step, zero1_step) in candidates.items():
        try:
            runs[name] = ("ok", zero.compare_stages({"dp": dp_step, "zero1": zero1_step}, adam_class, widths,
                                                     batch, steps, lr, seed))
        except Exception:
            runs[name] = ("failed", traceback.format_exc())
    return runs
'''


class _Answered:
    """What the test cell's launch.run returns for one answer: that answer's part of the shared launch."""

    def __init__(self, status, value):
        self.ok, self.value = status == "ok", value if status == "ok" else None
        self.output = "" if self.ok else value

    def failure_reason(self):
        return "" if self.ok else "rank 0 raised: " + self.output.strip().splitlines()[-1]


def _namespace(source):
    from mgpu.lesson08 import saved

    namespace = {name: value for name, value in vars(saved).items() if not name.startswith("__")}
    namespace.update({"__name__": "exercise_08", "launch": launch, "zero": zero, "zero_lr": 1e-3, "seed": 5})
    exec(compile(source, "zero1_update_solution", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def exercise_runs():
    """Runs the solution, the learner's stub and WRONG_SHARD through the notebook's test cell, with one
    2-worker launch for all three: the cell's launch.run is answered from that launch."""
    by_id, released = _exercise_cells()
    answers = {"solution": by_id["zero1_update_solution"], "stub": released["zero1_update_solution"],
               "wrong-shard": WRONG_SHARD}
    spaces = {name: _namespace(source) for name, source in answers.items()}
    job_space = {"__name__": "exercise_08_job", "zero": zero}
    exec(_JOB, job_space)
    shared = {}

    def run(fn, num_workers, args=(), **kwargs):
        stages, *rest = args
        assert fn is zero.compare_stages and num_workers == 2 and set(stages) == {"dp", "zero1"}
        if not shared:
            candidates = {name: (space["dp_step"], space["zero1_step"]) for name, space in spaces.items()}
            shared.update(launch.run(job_space["exercise_job"], 2, args=(candidates, *rest), verbose=False).value)
        return _Answered(*shared[current[0]])

    current = [None]
    outcomes = {}
    for name, space in spaces.items():
        current[0] = name
        space["launch"] = type("cell_launch", (), {"run": staticmethod(run)})
        try:
            exec(compile(by_id["zero1_update_tests"], "zero1_update_tests", "exec"), space)
            outcomes[name] = space["ex_rows"]
        except AssertionError as error:
            outcomes[name] = error
    return outcomes


WRONG_SHARD = '''
def zero1_update(theta, grad, adam):
    n, rank = hvd.size(), hvd.rank()
    grad_shard = hvd.reducescatter(padded(grad, n), op=hvd.Average)
    theta_shard = tf.reshape(padded(theta, n), [n, -1])[0]
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
'''


@pytest.mark.slow
def test_the_exercise_test_passes_the_solution(exercise_runs):
    rows = exercise_runs["solution"]
    assert not isinstance(rows, AssertionError), rows
    assert rows[("zero1", 0)]["optimizer state"] * 2 < rows[("dp", 0)]["optimizer state"] + 16


@pytest.mark.slow
@pytest.mark.parametrize("answer, complaint", [
    ("stub", "NotImplementedError"),                   # the learner's copy, untouched
    ("wrong-shard", "differ from data parallelism's"),  # every worker updates the first shard of theta
])
def test_the_exercise_test_rejects_the_stub_and_a_wrong_shard(exercise_runs, answer, complaint):
    assert isinstance(exercise_runs[answer], AssertionError), f"the test cell accepted the {answer}"
    assert complaint in str(exercise_runs[answer])
