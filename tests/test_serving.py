"""mgpu.lesson11: the load generator, latency statistics, the queueing model of batching, section 3's
CPU-checkable pieces, and a real Triton server that starts, answers and stops leaving no process."""

import functools
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import mgpu  # noqa: F401  (before tensorflow)
from mgpu.lesson11 import batcher, half_precision, inference_server, loadgen, queueing


# ---- the load generator


def test_poisson_arrivals_have_the_rate_count_and_exponential_gaps():
    rate, duration = 200.0, 50.0
    times = loadgen.poisson_arrivals(rate, duration, np.random.default_rng(0))
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < duration
    # The count is Poisson(10000): its standard deviation is 100.
    assert abs(len(times) - rate * duration) < 400
    gaps = np.diff(times)
    assert math.isclose(gaps.mean(), 1 / rate, rel_tol=0.04)
    # Exponential gaps: the standard deviation equals the mean (evenly spaced requests would give 0).
    assert 0.9 < gaps.std() / gaps.mean() < 1.1
    # Memoryless: about 1 - 1/e of the gaps are shorter than the mean.
    assert abs(np.mean(gaps < 1 / rate) - (1 - math.exp(-1))) < 0.03
    again = loadgen.poisson_arrivals(rate, duration, np.random.default_rng(0))
    assert np.array_equal(times, again)
    assert not np.array_equal(times[:50], loadgen.poisson_arrivals(rate, duration, np.random.default_rng(1))[:50])


def test_poisson_arrivals_rejects_nonsense():
    with pytest.raises(ValueError):
        loadgen.poisson_arrivals(0, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        loadgen.poisson_arrivals(10, -1.0, np.random.default_rng(0))


# ---- latency statistics


def test_percentile_is_nearest_rank():
    assert loadgen.percentile(range(1, 101), 99) == 99
    assert loadgen.percentile(range(1, 101), 100) == 100
    assert loadgen.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert loadgen.percentile([9.0], 99) == 9.0
    assert loadgen.percentile([3.0, 1.0, 2.0], 99) == 3.0
    with pytest.raises(ValueError):
        loadgen.percentile([], 50)
    with pytest.raises(ValueError):
        loadgen.percentile([1.0], 0)


def test_latency_stats():
    values = np.concatenate([np.ones(98), [10.0, 100.0]])
    stats = loadgen.latency_stats(values)
    assert stats == {"mean": pytest.approx(2.08), "p50": 1.0, "p99": 10.0, "max": 100.0, "count": 100}


# ---- the queueing model


A, C = 0.004, 0.001  # seconds per batch, seconds per request


def test_lone_requests_pay_the_delay_and_one_batch_cost():
    arrivals = np.arange(5) * 1.0  # far apart: each finds the server idle and alone
    without = queueing.simulate_batching(arrivals, 0.0, (A, C), max_batch=1, overhead=0.0005)
    assert np.allclose(without.latencies, A + C + 0.0005)
    waiting = queueing.simulate_batching(arrivals, 0.010, (A, C))
    assert np.allclose(waiting.latencies, 0.010 + A + C)
    assert list(waiting.batch_sizes) == [1] * 5


def test_a_delay_gathers_the_requests_that_arrive_during_it():
    arrivals = np.array([0.0, 0.001, 0.002, 0.5])
    run = queueing.simulate_batching(arrivals, 0.005, (A, C))
    assert list(run.batch_sizes) == [3, 1]
    end = 0.005 + A + 3 * C
    assert np.allclose(run.latencies[:3], end - arrivals[:3])
    # Without a delay the first runs alone, and the next two wait for it, then go together.
    greedy = queueing.simulate_batching(arrivals, 0.0, (A, C))
    assert list(greedy.batch_sizes) == [1, 2, 1]
    assert np.isclose(greedy.latencies[1], (A + C) + (A + 2 * C) - 0.001)


def test_a_full_batch_starts_before_the_delay_and_batches_never_exceed_the_maximum():
    arrivals = np.linspace(0, 0.001, 10)
    run = queueing.simulate_batching(arrivals, 1.0, (A, C), max_batch=4)
    assert list(run.batch_sizes) == [4, 4, 2]
    assert run.latencies[3] == pytest.approx(A + 4 * C)  # the fourth filled the batch: it did not wait
    assert run.latencies[-1] > 1.0  # the last two waited for the delay


def test_without_batching_the_model_is_the_md1_queue():
    # Pollaczek-Khinchine for deterministic service S at load rho: mean time in system S + rho S / (2 (1 - rho)).
    service, rate = 0.004, 150.0
    rho = rate * service
    arrivals = loadgen.poisson_arrivals(rate, 2000.0, np.random.default_rng(3))
    run = queueing.simulate_batching(arrivals, 0.0, (service, 0.0), max_batch=1)
    expected = service + rho * service / (2 * (1 - rho))
    assert math.isclose(run.latencies.mean(), expected, rel_tol=0.03)
    assert math.isclose(run.throughput, rate, rel_tol=0.03)


def test_batching_keeps_up_where_one_at_a_time_cannot():
    arrivals = loadgen.poisson_arrivals(400.0, 20.0, np.random.default_rng(4))  # 1.6x one-at-a-time capacity
    alone = queueing.simulate_batching(arrivals, 0.0, (A, C), max_batch=1)
    batched = queueing.simulate_batching(arrivals, 0.002, (A, C))
    assert alone.throughput < 1 / (A + C) * 1.01
    assert batched.throughput > 390
    assert batched.latencies.mean() < 0.05 < alone.latencies.mean()
    assert batched.mean_batch > 2


def test_simulate_batching_rejects_unordered_arrivals():
    with pytest.raises(ValueError):
        queueing.simulate_batching([0.0, 1.0, 0.5], 0.0, (A, C))


def test_fit_batch_cost_recovers_a_line():
    sizes = [1, 8, 32, 64]
    a, c = queueing.fit_batch_cost(sizes, [0.003 + 0.0002 * b for b in sizes])
    assert a == pytest.approx(0.003) and c == pytest.approx(0.0002)
    with pytest.raises(ValueError):
        queueing.fit_batch_cost([4, 4], [1.0, 1.0])


# ---- section 3, the parts a CPU can check


def test_tensor_core_sizes_pair_each_multiple_of_8_with_its_neighbour():
    assert half_precision.tensor_core_sizes([1024, 64]) == [(1024, True), (1023, False), (64, True), (63, False)]
    with pytest.raises(ValueError):
        half_precision.tensor_core_sizes([1000 + 1])


def test_loss_scaled_scales_the_loss_and_unscales_the_gradients():
    import tensorflow as tf

    wrapped = half_precision.loss_scaled(tf.keras.optimizers.SGD(0.1))
    assert isinstance(wrapped, tf.keras.mixed_precision.LossScaleOptimizer) and wrapped.dynamic
    scale = float(wrapped.loss_scale)
    assert scale > 1
    assert float(wrapped.get_scaled_loss(tf.constant(2.0))) == pytest.approx(2.0 * scale)
    gradient = tf.constant([1e-6, 3.0])
    (back,) = wrapped.get_unscaled_gradients([gradient * scale])
    assert np.allclose(back.numpy(), gradient.numpy())
    # minimize() scales and unscales inside: a float32 weight moves as plain SGD moves it.
    weight = tf.Variable([1.0, -1.0])
    wrapped.minimize(lambda: tf.reduce_sum(weight ** 2) / 2, [weight])
    assert np.allclose(weight.numpy(), [0.9, -0.9])


# ---- a batcher of one's own: the harness and notebook 11's batching_loop exercise


def _toy_model(batch):
    return np.asarray(batch) @ np.arange(12).reshape(4, 3) + 1


def _greedy_loop(requests, model, max_batch, max_delay):
    # Everything waiting, up to max_batch, without a delay.
    import queue

    while True:
        first = requests.get()
        if first is None:
            return
        batch = [first]
        while len(batch) < max_batch:
            try:
                request = requests.get_nowait()
            except queue.Empty:
                break
            if request is None:
                requests.put(None)
                break
            batch.append(request)
        for (_, answer), output in zip(batch, model(np.stack([row for row, _ in batch]))):
            answer.set_result(output)


@pytest.mark.parametrize("wait_for_answers", [True, False])
def test_serve_in_threads_answers_every_row_and_counts_the_batches(wait_for_answers):
    rows = np.arange(40 * 4).reshape(40, 4)
    run = batcher.serve_in_threads(_greedy_loop, _toy_model, rows, clients=4, max_batch=8, max_delay=0.0,
                                   wait_for_answers=wait_for_answers)
    assert all(np.array_equal(a, _toy_model(r[None])[0]) for a, r in zip(run.answers, rows))
    assert sum(run.batch_sizes) == 40 and max(run.batch_sizes) <= 8
    assert run.latencies.shape == (40,) and np.all(run.latencies >= 0) and run.seconds > 0
    assert run.throughput > 0 and run.mean_batch == pytest.approx(40 / len(run.batch_sizes))


def test_serve_in_threads_raises_the_loops_error_and_never_hangs():
    rows = np.arange(8 * 4).reshape(8, 4)

    def broken(requests, model, max_batch, max_delay):
        raise ValueError("broken loop")

    def gives_up(requests, model, max_batch, max_delay):
        requests.get()  # takes one request and returns without answering it

    with pytest.raises(ValueError, match="broken loop"):
        batcher.serve_in_threads(broken, _toy_model, rows, clients=2, max_batch=4, max_delay=0.0)
    with pytest.raises(RuntimeError, match="stopped while a request waited"):
        batcher.serve_in_threads(gives_up, _toy_model, rows, clients=2, max_batch=4, max_delay=0.0, timeout=5.0)


@functools.lru_cache(maxsize=1)
def _exercise_cells():
    from mgpu.runtime import labs

    return labs.cell_sources("11")


def _run_batching_exercise(solution):
    import queue
    import time

    cells, _ = _exercise_cells()
    namespace = {"np": np, "queue": queue, "time": time}
    exec(compile(solution, "batching_loop_solution", "exec"), namespace)
    exec(compile(cells["batching_loop_tests"], "batching_loop_tests", "exec"), namespace)


_LOOP_HEAD = ("def batching_loop(requests, model, max_batch, max_delay):\n    while True:\n"
              "        first = requests.get()\n        if first is None:\n            return\n")
_WRONG_LOOPS = {
    # Never gathers: one model call per request, whatever the delay.
    "alone": _LOOP_HEAD + "        first[1].set_result(model(np.stack([first[0]]))[0])\n",
    # Gathers until the delay, never stopping at max_batch.
    "uncapped": _LOOP_HEAD + (
        "        batch, deadline = [first], time.perf_counter() + max_delay\n"
        "        while True:\n            try:\n"
        "                r = requests.get(timeout=max(0.0, deadline - time.perf_counter()))\n"
        "            except queue.Empty:\n                break\n"
        "            if r is None:\n                requests.put(None)\n                break\n"
        "            batch.append(r)\n"
        "        out = model(np.stack([row for row, _ in batch]))\n"
        "        for (_, f), o in zip(batch, out):\n            f.set_result(o)\n"),
    # Answers every request with the whole batch's output.
    "whole batch": _LOOP_HEAD + (
        "        batch = [first]\n"
        "        while len(batch) < max_batch and not requests.empty():\n            batch.append(requests.get())\n"
        "        if batch[-1] is None:\n            requests.put(batch.pop())\n"
        "        out = model(np.stack([row for row, _ in batch]))\n"
        "        for _, f in batch:\n            f.set_result(out)\n"),
    # Rows answered in reverse order.
    "reversed": _LOOP_HEAD + (
        "        batch = [first]\n"
        "        while len(batch) < max_batch and not requests.empty():\n            batch.append(requests.get())\n"
        "        if batch[-1] is None:\n            requests.put(batch.pop())\n"
        "        out = model(np.stack([row for row, _ in batch]))\n"
        "        for (_, f), o in zip(batch, out[::-1]):\n            f.set_result(o)\n"),
}


def test_the_batching_loop_exercise_passes_the_solution_and_rejects_the_stub_and_wrong_loops():
    cells, released = _exercise_cells()
    _run_batching_exercise(cells["batching_loop_solution"])
    with pytest.raises(NotImplementedError):
        _run_batching_exercise(released["batching_loop_solution"])
    for name, wrong in _WRONG_LOOPS.items():
        with pytest.raises(AssertionError):
            _run_batching_exercise(wrong)


# ---- a real server


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(6,)), tf.keras.layers.Dense(3)])
    path = tmp_path_factory.mktemp("served") / "tiny.keras"
    model.save(path)
    return path, model


def _backend(name):
    reason = {"triton": inference_server.triton_unavailable_reason, "ray": inference_server.ray_unavailable_reason}[name]()
    return pytest.param(name, marks=pytest.mark.skipif(reason is not None, reason=str(reason)), id=name)


BACKENDS = [_backend("triton"), _backend("ray")]


def test_triton_unavailable_reason_names_what_is_missing():
    import importlib.util

    reason = inference_server.triton_unavailable_reason()
    if int(np.__version__.split(".")[0]) >= 2:
        assert "NumPy" in reason
    elif importlib.util.find_spec("pytriton") is None:
        assert "not installed" in reason
    else:
        assert reason is None, reason


def test_the_server_is_triton_where_it_runs_and_ray_serve_elsewhere(monkeypatch):
    monkeypatch.setattr(inference_server, "triton_unavailable_reason", lambda: None)
    assert inference_server.pick_backend()[0] == "triton"
    monkeypatch.setattr(inference_server, "triton_unavailable_reason", lambda: "NumPy 2")
    monkeypatch.setattr(inference_server, "ray_unavailable_reason", lambda: None)
    backend, why = inference_server.pick_backend()
    assert backend == "ray" and "NumPy 2" in why and "@serve.batch" in why
    monkeypatch.setattr(inference_server, "ray_unavailable_reason", lambda: "Ray Serve is not installed (pip install ...)")
    backend, why = inference_server.pick_backend()
    assert backend is None and "NumPy 2" in why and "pip install" in why
    assert inference_server.pick_backend("ray") == (None, "Ray Serve is not installed (pip install ...)")
    with pytest.raises(ValueError, match="'auto', 'triton' or 'ray'"):
        inference_server.pick_backend("tensorflow-serving")


def test_a_server_that_can_run_nowhere_says_why_before_starting(monkeypatch, tmp_path):
    monkeypatch.setattr(inference_server, "triton_unavailable_reason", lambda: "no Triton here")
    monkeypatch.setattr(inference_server, "ray_unavailable_reason", lambda: "no Ray here")
    server = inference_server.InferenceServer(tmp_path / "model.keras")
    with pytest.raises(inference_server.ServerError, match="no Triton here.*no Ray here"):
        server.start()
    assert server._process is None


def _pytriton_blocks(pid):
    return list(Path("/dev/shm").glob(f"pytrtion{pid}-*"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_server_answers_batches_and_stops_leaving_no_process(saved_model, tmp_path, backend):
    path, model = saved_model
    x = np.random.default_rng(0).normal(size=(16, 6)).astype("float32")
    server = inference_server.InferenceServer(path, delays_ms=[0.0, 5.0], max_batch=8, log_path=tmp_path / "server.log",
                                     backend=backend)
    with server:
        child = server._process.pid
        pids = server.pids()
        assert len(pids) >= 3  # the child and Triton with a stub per model, or Ray's daemons and actors
        assert np.allclose(loadgen.infer(server.url, inference_server.model_name(5.0), x[:4]), model(x[:4]).numpy(), atol=1e-5)
        before = server.stats()
        # 24 requests in 24 ms to the 5 ms batcher: it must gather several into each batch.
        run = loadgen.send_load(server.url, inference_server.model_name(5.0), np.linspace(0, 0.024, 24), x)
        after = server.stats()
        assert run.errors == 0 and len(run.latencies) == 24 and np.all(run.latencies > 0)
        batches, answered = inference_server.batches_between(before, after, inference_server.model_name(5.0))
        assert answered == 24 and batches < 24
        assert sum(count * size for size, (count, _) in after[inference_server.model_name(5.0)]["by_batch_size"].items()
                   ) == after[inference_server.model_name(5.0)]["requests"]
        alone = loadgen.send_load(server.url, inference_server.NO_BATCHING, np.linspace(0, 0.01, 5), x)
        assert alone.errors == 0
        assert inference_server.batches_between(after, server.stats(), inference_server.NO_BATCHING) == (5, 5)
        assert inference_server.busy_seconds(before, after, inference_server.model_name(5.0)) > 0
        missing = loadgen.send_load(server.url, "delay_7000us", np.zeros(2), x)  # a name the server does not have
        assert missing.errors == 2 and missing.unanswered == 0
        right = model(x).numpy()
        checked = loadgen.send_load(server.url, inference_server.model_name(5.0), np.linspace(0, 0.01, 8), x, expected=right)
        assert (checked.errors, checked.unanswered, len(checked.latencies)) == (0, 0, 8)
        wrong = loadgen.send_load(server.url, inference_server.model_name(0.0), np.zeros(3), x, expected=right + 1)
        assert (wrong.errors, wrong.unanswered) == (3, 0), "an answer that differs from the model's is an error"
        late = loadgen.send_load(server.url, inference_server.model_name(5.0), np.zeros(1), x, timeout=0.002)  # waits 5 ms
        assert (late.errors, late.unanswered, len(late.latencies)) == (0, 1, 0), "no answer in time: unanswered"
        speed = loadgen.burst_capacity(server.url, [inference_server.NO_BATCHING, inference_server.model_name(0.0)], 8, x, rounds=2)
        assert set(speed) == {inference_server.NO_BATCHING, inference_server.model_name(0.0)} and all(v > 0 for v in speed.values())
    assert inference_server.alive(pids) == []
    assert not _pytriton_blocks(child)
    assert "serving" in (tmp_path / "server.log").read_text()
    assert server._workdir is None or not Path(server._workdir).exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_whose_child_dies_still_leaves_no_process(saved_model, backend):
    path, _ = saved_model
    server = inference_server.InferenceServer(path, delays_ms=[0.0], backend=backend)
    with server:
        pids = server.pids()
        os.kill(server._process.pid, signal.SIGKILL)  # the server's own processes are orphaned
    assert inference_server.alive(pids) == []
    assert server._workdir is None or not Path(server._workdir).exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_that_cannot_start_raises_with_its_log_and_leaves_nothing(tmp_path, backend):
    server = inference_server.InferenceServer(tmp_path / "missing.keras", delays_ms=[0.0], backend=backend)
    with pytest.raises(inference_server.ServerError, match="exited with code"):
        server.start()
    assert inference_server.alive(server.pids()) == []
