"""The labs' exercises: the learner's copy (mgpu.runtime.labs) hides every solution, each exercise has a
graded test cell after it, and each test cell passes the source's solution and rejects wrong ones.

The pure-function exercises are run here as the learner runs them: the solution cell, then its
test cell, in a namespace holding only numpy, TensorFlow and the seed. Notebook 05's exercises, which train, are tested in
``test_notebook05_exercises.py``.
"""

import io

import nbformat
import numpy as np
import pytest

from mgpu.runtime import course, labs

NOTEBOOKS = {p.name[:2]: p for p in course.course_notebooks()}


def _cells(number):
    notebook = nbformat.read(NOTEBOOKS[number], as_version=4)
    return notebook, {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells if "nbgrader" in c.metadata}


@pytest.mark.parametrize("number", ["01", "02", "03", "04", "05", "11"])
def test_each_lab_has_at_least_two_exercises_each_followed_by_its_test(number):
    notebook, _ = _cells(number)
    exercises = labs.exercises(notebook)
    assert len(exercises) >= 2, f"notebook {number} has {len(exercises)} exercise(s)"
    _assert_each_exercise_is_followed_by_its_test(notebook)


#: Part II's notebooks split from one (06, 07, 09, 10), with the exercises each kept from it.
SPLIT_EXERCISES = {"06": ["staleness_aware_update_solution", "concatenated_gradient_solution"],
                   "07": ["twobit_quantise_solution", "twobit_allreduce_solution"],
                   "08": ["zero1_update_solution"],
                   "09": ["tensor_parallel_mlp_solution", "one_f_one_b_order_solution"], "10": ["cluster_command_solution", "elastic_train_solution", "checkpoint_train_solution",
                          "agreed_steps_solution"]}


@pytest.mark.parametrize("number", sorted(SPLIT_EXERCISES))
def test_the_split_notebooks_keep_their_exercises_each_followed_by_its_test(number):
    notebook, _ = _cells(number)
    assert labs.exercises(notebook) == SPLIT_EXERCISES[number]
    _assert_each_exercise_is_followed_by_its_test(notebook)


def _assert_each_exercise_is_followed_by_its_test(notebook):
    for index, cell in enumerate(notebook.cells):
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            following = notebook.cells[index + 1].metadata.get("nbgrader", {})
            assert following.get("grade") and following.get("locked"), \
                f"{meta['grade_id']}: the cell after an exercise must be its locked test cell"


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_the_learners_copy_has_no_solution_and_no_output(number):
    notebook, _ = _cells(number)
    released = labs.release(notebook)
    text = "".join(c.source for c in released.cells)
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert all(not c.get("outputs") for c in released.cells if c.cell_type == "code")
    stubs = sum(c.source.count("raise NotImplementedError()") for c in released.cells)
    assert stubs >= len(labs.exercises(notebook))
    # The source is left as it was.
    assert "BEGIN SOLUTION" in "".join(c.source for c in notebook.cells) or not labs.exercises(notebook)


def test_write_lab_never_overwrites_the_learners_work_and_fresh_keeps_it(tmp_path):
    sources = [NOTEBOOKS["01"], NOTEBOOKS["02"]]
    out = io.StringIO()
    written = labs.write_lab(tmp_path, notebooks=sources, out=out)
    assert [p.name for p in written] == [p.name for p in sources]
    mine = tmp_path / sources[0].name
    mine.write_text(mine.read_text().replace("raise NotImplementedError()", "return True", 1))
    assert labs.write_lab(tmp_path, notebooks=sources, out=out) == []
    assert "return True" in mine.read_text()
    assert labs.write_lab(tmp_path, notebooks=sources, fresh=["01"], out=out) == [mine]
    assert "return True" not in mine.read_text()
    kept = list((tmp_path / ".previous").glob("01_*.ipynb"))
    assert len(kept) == 1 and "return True" in kept[0].read_text()
    with pytest.raises(ValueError, match="no notebook numbered 09"):
        labs.write_lab(tmp_path, notebooks=sources, fresh=["09"], out=out)


def _run(number, solution_id, tests_id, solution_source=None):
    _, cells = _cells(number)
    import tensorflow as tf

    namespace = {"__name__": f"exercise_{number}", "np": np, "tf": tf, "seed": 0}
    exec(compile(solution_source or cells[solution_id].source, solution_id, "exec"), namespace)
    exec(compile(cells[tests_id].source, tests_id, "exec"), namespace)


#: Each pure-function exercise: (notebook, solution cell, test cell, wrong answers the tests must reject).
WRONG = {
    ("01", "has_converged_solution", "has_converged_tests"): [
        "def has_converged(losses, tol, window):\n    return True\n",
        "def has_converged(losses, tol, window):\n    l = np.asarray(losses, float)\n"
        "    return len(l) >= window and bool(abs(l[-1] - l[-window]) <= tol)\n",
    ],
    ("01", "minibatches_solution", "minibatches_tests"): [
        "def minibatches(n, batch_size, rng):\n    for first in range(0, n, batch_size):\n"
        "        yield np.arange(first, min(n, first + batch_size))\n",
        "def minibatches(n, batch_size, rng):\n    order = rng.permutation(n)\n"
        "    for first in range(0, n - batch_size + 1, batch_size):\n        yield order[first:first + batch_size]\n",
    ],
    ("02", "critical_batch_solution", "critical_batch_tests"): [
        # The floors taken from the ends of the table instead of its minima.
        "def critical_batch(batches, steps):\n    b, s = np.asarray(batches, float), np.asarray(steps, float)\n"
        "    return float(b[0] * s[0] / s[-1])\n",
        # Unreached batches counted.
        "def critical_batch(batches, steps):\n    b, s = np.asarray(batches, float), np.asarray(steps, float)\n"
        "    if b.shape != s.shape or len(b) < 2:\n        raise ValueError('table')\n"
        "    return float(np.min(b * s) / np.min(s))\n",
    ],
    ("02", "scaled_lr_solution", "scaled_lr_tests"): [
        "def scaled_lr(base_lr, base_batch, batch, rule):\n    return base_lr * batch / base_batch\n",
        "def scaled_lr(base_lr, base_batch, batch, rule):\n    k = batch / base_batch\n"
        "    return base_lr * {'linear': k, 'sqrt': k ** 0.5}.get(rule, 1.0)\n",
    ],
    ("04", "ring_allreduce_solution", "ring_allreduce_tests"): [
        # The sum without the ring: right results, but every worker "sends" its whole vector N - 1 times.
        "def ring_allreduce(inputs):\n    total = np.sum(inputs, axis=0)\n"
        "    sent = np.array([(len(inputs) - 1) * np.asarray(a).nbytes for a in inputs])\n"
        "    return [total.copy() for _ in inputs], sent\n",
        # All-gather forgotten: only one chunk per worker is complete.
        "def ring_allreduce(inputs):\n    n = len(inputs)\n    chunks = [np.array_split(np.ravel(a), n) for a in inputs]\n"
        "    sent = np.zeros(n, dtype=np.int64)\n    for s in range(n - 1):\n"
        "        payload = [(i, (i - s) % n, chunks[i][(i - s) % n].copy()) for i in range(n)]\n"
        "        for i, c, d in payload:\n            chunks[(i + 1) % n][c] = chunks[(i + 1) % n][c] + d\n            sent[i] += d.nbytes\n"
        "    return [np.concatenate(w).reshape(np.shape(inputs[0])) for w in chunks], sent\n",
    ],
    ("03", "batch_crop_flip_solution", "batch_crop_flip_tests"): [
        # Never mirrored.
        "def batch_crop_flip(images, image_size):\n    n, side = tf.shape(images)[0], tf.shape(images)[1]\n"
        "    top = tf.random.uniform((n, 1), 0, side - image_size + 1, dtype=tf.int32)\n"
        "    left = tf.random.uniform((n, 1), 0, side - image_size + 1, dtype=tf.int32)\n"
        "    rows = tf.gather(images, top + tf.range(image_size)[None, :], batch_dims=1)\n"
        "    return tf.gather(rows, left + tf.range(image_size)[None, :], axis=2, batch_dims=1)\n",
        # One crop for the whole batch.
        "def batch_crop_flip(images, image_size):\n    side = tf.shape(images)[1]\n"
        "    t = tf.random.uniform((), 0, side - image_size + 1, dtype=tf.int32)\n"
        "    out = images[:, t:t + image_size, t:t + image_size]\n"
        "    return tf.reverse(out, [2]) if tf.random.uniform(()) < 0.5 else out\n",
    ],
    ("06", "staleness_aware_update_solution", "staleness_aware_update_tests"): [
        # The full rate, however stale (Downpour's rule).
        "def staleness_aware_update(server, worker, gradient):\n    tau = server.version - server.read_version[worker]\n"
        "    server.weights = server.weights - server.lr * gradient\n    server.version += 1\n"
        "    server.read_version[worker] = server.version\n    return tau\n",
        # The staleness counted after the update.
        "def staleness_aware_update(server, worker, gradient):\n    server.version += 1\n"
        "    tau = server.version - server.read_version[worker]\n"
        "    server.weights = server.weights - server.lr / max(tau, 1) * gradient\n"
        "    server.read_version[worker] = server.version\n    return tau\n",
        # Divided by tau + 1.
        "def staleness_aware_update(server, worker, gradient):\n    tau = server.version - server.read_version[worker]\n"
        "    server.weights = server.weights - server.lr / (tau + 1) * gradient\n    server.version += 1\n"
        "    server.read_version[worker] = server.version\n    return tau\n",
        # The reply's version not recorded.
        "def staleness_aware_update(server, worker, gradient):\n    tau = server.version - server.read_version[worker]\n"
        "    server.weights = server.weights - server.lr / max(tau, 1) * gradient\n    server.version += 1\n"
        "    return tau\n",
        # The version never advanced.
        "def staleness_aware_update(server, worker, gradient):\n    tau = server.version - server.read_version[worker]\n"
        "    server.weights = server.weights - server.lr / max(tau, 1) * gradient\n"
        "    server.read_version[worker] = server.version\n    return tau\n",
    ],
    ("06", "concatenated_gradient_solution", "concatenated_gradient_tests"): [
        # Horovod's plain average: wrong when the workers' batches differ in size.
        "def concatenated_gradient(gradients, batch_sizes):\n"
        "    return [np.mean([g[v] for g in gradients], axis=0) for v in range(len(gradients[0]))]\n",
        # Weighted by the batch sizes but not divided by their total.
        "def concatenated_gradient(gradients, batch_sizes):\n"
        "    return [sum(b * np.asarray(g[v]) for g, b in zip(gradients, batch_sizes)) for v in range(len(gradients[0]))]\n",
    ],
    ("07", "twobit_quantise_solution", "twobit_quantise_tests"): [
        # No error feedback: the residual is ignored.
        "def twobit_quantise(values, residual):\n    s = tf.reduce_mean(tf.abs(values))\n"
        "    k = tf.cast(values >= -s, tf.uint8) + tf.cast(values >= 0, tf.uint8) + tf.cast(values >= s, tf.uint8)\n"
        "    return k, s, values - (tf.cast(k, values.dtype) - 1.5) * s\n",
        # The largest absolute value as the scale.
        "def twobit_quantise(values, residual):\n    c = values + residual\n    s = tf.reduce_max(tf.abs(c))\n"
        "    k = tf.cast(c >= -s, tf.uint8) + tf.cast(c >= 0, tf.uint8) + tf.cast(c >= s, tf.uint8)\n"
        "    return k, s, c - (tf.cast(k, c.dtype) - 1.5) * s\n",
        # Code k taken as the level k * scale.
        "def twobit_quantise(values, residual):\n    c = values + residual\n    s = tf.reduce_mean(tf.abs(c))\n"
        "    k = tf.cast(c >= -s, tf.uint8) + tf.cast(c >= 0, tf.uint8) + tf.cast(c >= s, tf.uint8)\n"
        "    return k, s, c - tf.cast(k, c.dtype) * s\n",
    ],
    ("11", "p99_solution", "p99_tests"): [
        # Interpolated, not the nearest rank.
        "def p99(latencies):\n    return float(np.percentile(np.asarray(latencies, float), 99))\n",
        # The maximum.
        "def p99(latencies):\n    return float(max(latencies))\n",
        # Off by one rank.
        "def p99(latencies):\n    l = np.sort(np.asarray(latencies, float))\n    return float(l[min(int(0.99 * l.size), l.size - 1)])\n",
    ],
    ("11", "best_delays_solution", "best_delays_tests"): [
        # The delay with the largest latency.
        "def best_delays(mean_latency):\n    return {r: max(d, key=d.get) for r, d in mean_latency.items()}\n",
        # The smallest latency instead of its delay.
        "def best_delays(mean_latency):\n    return {r: min(d.values()) for r, d in mean_latency.items()}\n",
    ],
    ("05", "lars_step_solution", "lars_step_tests"): [
        # Plain SGD: no trust ratio.
        "def lars_step(w, g, lr, eta, weight_decay):\n    return -lr * (g + weight_decay * w)\n",
        # The trust ratio without the weight-decay term in the denominator.
        "def lars_step(w, g, lr, eta, weight_decay):\n    wn, gn = np.linalg.norm(w), np.linalg.norm(g)\n"
        "    r = wn / gn if wn > 0 and gn > 0 else 1.0\n    return -lr * eta * r * (g + weight_decay * w)\n",
    ],
}


@pytest.mark.parametrize("exercise", sorted(WRONG), ids=lambda e: e[1].replace("_solution", ""))
def test_exercise_tests_pass_the_solution_and_reject_the_stub_and_wrong_answers(exercise):
    number, solution_id, tests_id = exercise
    _run(number, solution_id, tests_id)
    _, released = labs.cell_sources(number)
    with pytest.raises(NotImplementedError):
        _run(number, solution_id, tests_id, released[solution_id])
    for wrong in WRONG[exercise]:
        with pytest.raises((AssertionError, ValueError, TypeError, IndexError)):
            _run(number, solution_id, tests_id, wrong)


def test_10_cluster_command_exercise_accepts_the_solution_and_rejects_the_stub_and_wrong_commands(tmp_path):
    from mgpu.lesson10 import multinode

    _, cells = _cells("10")
    _, released = labs.cell_sources("10")
    hostfile = multinode.write_hostfile(tmp_path / "hosts", {"gpu1": 4, "gpu2": 4, "gpu3": 4})

    def run(solution):
        namespace = {"multinode": multinode, "cluster_hostfile": hostfile}
        exec(compile(solution, "cluster_command_solution", "exec"), namespace)
        exec(compile(cells["cluster_command_tests"].source, "cluster_command_tests", "exec"), namespace)

    run(cells["cluster_command_solution"].source)
    with pytest.raises(NotImplementedError):
        run(released["cluster_command_solution"])
    right = '["horovodrun", "-np", "12", "--hostfile", str(cluster_hostfile), "--gloo", "--network-interface", "ib0"'
    wrong = [
        # The untouched starting point.
        'cluster_command = ["horovodrun", "python", "train.py"]\nrank9_host, rank9_gpu = None, None\n',
        # One process per machine instead of per GPU.
        'cluster_command = ' + right.replace('"12"', '"3"') + ', "python", "train.py"]\nrank9_host, rank9_gpu = "gpu3", 1\n',
        # No network interface.
        'cluster_command = ["horovodrun", "-np", "12", "--hostfile", str(cluster_hostfile), "--gloo", "python", '
        '"train.py"]\nrank9_host, rank9_gpu = "gpu3", 1\n',
        # Rank 9 counted from 1, or its GPU taken as its rank.
        f'cluster_command = {right}, "python", "train.py"]\nrank9_host, rank9_gpu = "gpu3", 0\n',
        f'cluster_command = {right}, "python", "train.py"]\nrank9_host, rank9_gpu = "gpu3", 9\n',
    ]
    for answer in wrong:
        with pytest.raises((AssertionError, ValueError)):
            run(answer)
