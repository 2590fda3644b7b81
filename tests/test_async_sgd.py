"""Notebook 06's parameter server and stragglers: the toy server's staleness accounting (the
notebook's own cells, run here), the staleness-aware update exercise against the library's rule,
the uneven split and its weighting on real Horovod workers, the
traffic counts, and TensorFlow's ParameterServerStrategy in a child process that never outlives
its call."""

import functools
import os
import threading
import time

import nbformat
import numpy as np
import psutil
import pytest

import mgpu  # noqa: F401  (before TensorFlow)
import tensorflow as tf

from mgpu.lesson04 import allreduce
from mgpu.lesson06 import async_sgd
from mgpu.runtime import course, labs, launch

TAG = "toy_parameter_server"


def _notebook():
    return nbformat.read(next(p for p in course.course_notebooks() if p.name.startswith("06")), as_version=4)


def _toy_cells() -> list[str]:
    cells = [c.source for c in _notebook().cells if TAG in c.metadata.get("tags", [])]
    assert cells, f"notebook 06 has no cells tagged {TAG!r}"
    return cells


def _graded(notebook, grade_id):
    return next(c.source for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


@pytest.fixture(scope="module")
def toy():
    """The notebook's toy parameter server, defined by running its cells as the notebook does."""
    x, y, _ = async_sgd.least_squares_problem(0, examples=256, features=5)
    namespace = {"np": np, "tf": tf, "threading": threading, "time": time, "ps_x": x, "ps_y": y,
                 "ps_setting": {"batch": 8, "device_ms": 5}}
    for source in _toy_cells():
        exec(compile(source, TAG, "exec"), namespace)
    exec(compile(_graded(_notebook(), "staleness_aware_update_solution"), "solution", "exec"), namespace)
    return namespace


def test_staleness_is_the_updates_between_pull_and_push(toy):
    server = toy["ToyParameterServer"](np.zeros(3), lr=0.5)
    for worker in "abc":
        server.pull(worker)
    weights_a, version_a = server.push("a", np.ones(3, np.float32))           # nothing happened since: 0
    assert version_a == 1 and np.allclose(weights_a, -0.5)
    server.push("b", np.full(3, 2.0, np.float32))                             # A pushed meanwhile: 1
    server.push("c", np.full(3, 4.0, np.float32))                             # A and B pushed: 2
    server.push("a", np.ones(3, np.float32))                                  # B and C since A's reply: 2
    assert server.staleness == [0, 1, 2, 2] and server.read_version == {"a": 4, "b": 2, "c": 3}
    assert server.version == 4 and len(server.snapshots) == 5
    assert np.allclose(server.weights, -0.5 * (1 + 2 + 4 + 1))
    assert server.bytes_in == 4 * 12 and server.bytes_out == 3 * 12 + 4 * 12  # 3 pulls, 4 replies


def test_staleness_aware_rate_divides_by_the_staleness(toy):
    """The exercise's solution, plugged into the notebook's server as its runs plug it."""
    server = toy["ToyParameterServer"](np.zeros(2), lr=0.6, update=toy["staleness_aware_update"])
    for worker in range(4):
        server.pull(worker)
    for worker in range(4):
        server.push(worker, np.ones(2, np.float32))
    assert server.staleness == [0, 1, 2, 3]
    # rates lr / max(tau, 1): 0.6, 0.6, 0.3, 0.2
    assert np.allclose(server.weights, -(0.6 + 0.6 + 0.3 + 0.2))


def _run_exercise(solution):
    """The exercise as the learner runs it: a solution, then the graded test cell."""
    namespace = {"np": np, "tf": tf, "seed": 0, "async_sgd": async_sgd}
    exec(compile(solution, "solution", "exec"), namespace)
    exec(compile(_graded(_notebook(), "staleness_aware_update_tests"), "tests", "exec"), namespace)


_RULE = "def staleness_aware_update(server, worker, gradient):\n"
WRONG_RULES = {
    "the full rate, however stale": _RULE + "    tau = server.version - server.read_version[worker]\n"
    "    server.weights = server.weights - server.lr * gradient\n    server.version += 1\n"
    "    server.read_version[worker] = server.version\n    return tau\n",
    "the staleness counted after the update": _RULE + "    server.version += 1\n"
    "    tau = server.version - server.read_version[worker]\n"
    "    server.weights = server.weights - server.lr / max(tau, 1) * gradient\n"
    "    server.read_version[worker] = server.version\n    return tau\n",
    "divided by tau + 1": _RULE + "    tau = server.version - server.read_version[worker]\n"
    "    server.weights = server.weights - server.lr / (tau + 1) * gradient\n    server.version += 1\n"
    "    server.read_version[worker] = server.version\n    return tau\n",
    "the reply's version not recorded": _RULE + "    tau = server.version - server.read_version[worker]\n"
    "    server.weights = server.weights - server.lr / max(tau, 1) * gradient\n    server.version += 1\n"
    "    return tau\n",
    "the version never advanced": _RULE + "    tau = server.version - server.read_version[worker]\n"
    "    server.weights = server.weights - server.lr / max(tau, 1) * gradient\n"
    "    server.read_version[worker] = server.version\n    return tau\n",
}


def test_staleness_aware_exercise_passes_the_solution_and_rejects_the_stub_and_wrong_rules():
    notebook = _notebook()
    _run_exercise(_graded(notebook, "staleness_aware_update_solution"))
    released = labs.release(notebook)
    with pytest.raises(NotImplementedError):
        _run_exercise(_graded(released, "staleness_aware_update_solution"))
    for name, wrong in WRONG_RULES.items():
        with pytest.raises(AssertionError):
            _run_exercise(wrong)
            pytest.fail(f"the test cell accepted a rule with {name}")


def test_simulate_async_is_deterministic_and_the_staleness_aware_rule_survives_a_rate_plain_async_does_not():
    def plain(server, worker, gradient):
        tau = server.version - server.read_version[worker]
        server.weights = server.weights - server.lr * gradient
        server.version += 1
        server.read_version[worker] = server.version
        return tau

    runs = [async_sgd.simulate_async(async_sgd.staleness_aware_update, workers=4, updates=60, seed=3) for _ in range(2)]
    assert runs[0]["staleness"] == runs[1]["staleness"] and np.array_equal(runs[0]["weights"], runs[1]["weights"])
    assert runs[0]["version"] == 60 and runs[0]["staleness"][:4] == [0, 1, 2, 3]  # everyone starts from version 0
    assert max(runs[0]["staleness"]) >= 4
    x, y, _ = async_sgd.least_squares_problem(3, examples=256, features=5)
    plain_run = async_sgd.simulate_async(plain, workers=4, updates=60, seed=3)
    assert plain_run["staleness"] == runs[0]["staleness"]  # the order of events does not depend on the rule
    start, aware, blown = async_sgd.losses_of_snapshots(
        np.array([np.zeros(5), runs[0]["weights"], plain_run["weights"]]), x, y)
    assert aware < start / 10 and blown > start


def test_sync_server_applies_the_average_once_per_round(toy):
    server = toy["ToySyncServer"](np.zeros(2), lr=1.0, num_workers=3)
    replies = {}

    def worker(i):
        server.pull(i)
        replies[i] = server.push(i, np.full(2, float(i + 1), np.float32))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert server.version == 1 and server.staleness == [0]
    assert np.allclose(server.weights, -2.0)  # the mean of 1, 2 and 3
    assert all(v == 1 and np.allclose(w, -2.0) for w, v in replies.values())


@pytest.mark.parametrize("workers", [1, 3])
def test_threaded_workers_mean_staleness_is_n_minus_one(toy, workers):
    x = toy["ps_x"]
    server = toy["run_toy"](toy["ToyParameterServer"](np.zeros(x.shape[1]), lr=0.05), workers, 150, run_seed=1)
    assert 150 <= server.version < 150 + workers and len(server.staleness) == server.version
    assert all(0 <= s < server.version for s in server.staleness)
    # Each worker's stalenesses add up to the others' pushes during its run: N - 1 on average,
    # less the first round (all workers start from version 0).
    assert abs(np.mean(server.staleness) - (workers - 1)) <= 0.3
    losses = async_sgd.losses_of_snapshots(np.array([w for _, w in server.snapshots]), toy["ps_x"], toy["ps_y"])
    assert losses[-1] < losses[0] / 5


def test_lambda_max_is_the_largest_curvature_of_the_loss():
    x, y, lambda_max = async_sgd.least_squares_problem(3, examples=300, features=6, condition=10.0)
    w = tf.Variable(tf.zeros(6))
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            loss = 0.5 * tf.reduce_mean((tf.linalg.matvec(x, w) - y) ** 2)
        grad = inner.gradient(loss, w)
    hessian = outer.jacobian(grad, w).numpy()
    assert np.isclose(np.linalg.eigvalsh(hessian)[-1], lambda_max, rtol=1e-4)


def test_losses_of_snapshots_and_histogram():
    x = np.array([[1.0, 0.0], [0.0, 2.0]], np.float32)
    y = np.array([1.0, 2.0], np.float32)
    losses = async_sgd.losses_of_snapshots(np.array([[0.0, 0.0], [1.0, 1.0], [np.inf, 0.0]]), x, y)
    assert np.allclose(losses[:2], [0.5 * (1 + 4) / 2, 0.0]) and losses[2] == np.inf
    assert async_sgd.staleness_histogram([0, 1, 1, 3]) == {0: 0.25, 1: 0.5, 3: 0.25}


def test_split_by_work_load():
    assert async_sgd.split_by_work_load(64, [3, 1]) == [48, 16]
    assert async_sgd.split_by_work_load(64, [1, 1, 1]) == [22, 21, 21]
    for load in ([1, 2, 3], [0.3, 0.7], [5], [1, 1, 1, 1, 1, 1, 1]):
        sizes = async_sgd.split_by_work_load(100, load)
        assert sum(sizes) == 100
        assert all(abs(s - 100 * l / sum(load)) < 1 for s, l in zip(sizes, load))
    with pytest.raises(ValueError):
        async_sgd.split_by_work_load(64, [1, 0])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_traffic_counts_match_the_ring_and_the_server(n):
    values = 12 * n
    _, sent = allreduce.ring_allreduce([np.ones(values, np.float32)] * n)
    traffic = async_sgd.traffic_per_worker(n, values * 4)
    assert np.all(sent == traffic["ring_worker_sends"])
    assert traffic["ps_server_receives"] == traffic["ps_server_sends"] == n * values * 4


# A library function with its arguments, so that the workers do not import this module (whose
# imports, nbgrader's among them, are not the workers' business).
_STRAGGLER_JOB = functools.partial(
    async_sgd.straggler_study,
    [dict(name="even", slowness=[1, 1], work_load=[1, 1], weighted=False),
     dict(name="uneven weighted", slowness=[1, 3], work_load=[3, 1], weighted=True),
     dict(name="uneven plain", slowness=[1, 3], work_load=[3, 1], weighted=False)],
    global_batch=32, steps=2, warmup=1, ms_per_example=0.5, seed=4)


@pytest.mark.slow
def test_weighted_uneven_split_equals_the_concatenated_batch_on_horovod_workers():
    result = launch.run(_STRAGGLER_JOB, 2, verbose=False).value
    configs = result["configs"]
    assert result["size"] == 2
    assert configs["uneven weighted"]["sizes"] == [24, 8]
    assert configs["uneven weighted"]["device_s_per_rank"] == pytest.approx([0.012, 0.012])
    # An even split is right with a plain average; an uneven one only when weighted.
    assert configs["even"]["max_error_vs_concatenated"] < 1e-5
    assert configs["uneven weighted"]["max_error_vs_concatenated"] < 1e-5
    assert configs["uneven plain"]["max_error_vs_concatenated"] > 1e-3
    assert all(c["step_s"] > 0 and c["examples_per_s"] > 0 for c in configs.values())


def _children_running_ps_demo():
    return [p for p in psutil.Process().children(recursive=True)
            if "mgpu.lesson06.async_sgd" in " ".join(p.cmdline())]


@pytest.mark.slow
def test_parameter_server_strategy_trains_with_weights_on_the_ps_and_leaves_nothing_running():
    record = async_sgd.ps_strategy_demo(workers=2, steps=20, device_ms=5, seed=2)
    assert record["variable_device"].startswith("/job:ps") and record["step_counter_device"].startswith("/job:ps")
    assert len(record["cluster"]["worker"]) == 2 and len(record["cluster"]["ps"]) == 1
    assert record["updates_applied"] == 20 and len(record["staleness"]) == 20
    assert all(0 <= s < 20 for s in record["staleness"])
    assert record["final_loss"] < record["initial_loss"]
    assert not _children_running_ps_demo()


@pytest.mark.slow
def test_parameter_server_strategy_child_is_killed_on_timeout():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out"):
        async_sgd.ps_strategy_demo(steps=10_000, timeout=3)
    assert time.monotonic() - started < 30
    assert not _children_running_ps_demo()
