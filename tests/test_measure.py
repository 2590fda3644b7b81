"""The benchmark harness (with a fake clock: exact and independent of machine load) and FLOP counts."""

import numpy as np
import pytest
import tensorflow as tf

from mgpu.runtime import measure


class FakeClock:
    """A clock that advances only when the measured call says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_warm_up_is_excluded_and_the_median_resists_one_slow_round():
    clock = FakeClock()
    durations = iter([5.0, 5.0] + [0.1, 0.1, 0.1, 2.0, 0.1])  # two slow warm-ups, one slow round
    calls = []

    def step():
        calls.append(1)
        clock.now += next(durations)

    rate = measure.measure_rate(step, items_per_call=32, warmup=2, repeats=5, clock=clock)
    assert len(calls) == 7
    assert rate.rounds == pytest.approx([320, 320, 320, 16, 320])
    assert rate.median == pytest.approx(320)
    assert rate.seconds_per_call[3] == pytest.approx(2.0)


def test_rounds_of_several_calls():
    clock = FakeClock()

    def step():
        clock.now += 0.25

    rate = measure.measure_rate(step, items_per_call=10, warmup=0, repeats=3, calls_per_round=4, clock=clock)
    assert rate.rounds == pytest.approx([40, 40, 40]) and rate.spread == pytest.approx(0)


def test_bad_arguments_and_a_stopped_clock():
    with pytest.raises(ValueError):
        measure.measure_rate(lambda: None, items_per_call=0)
    with pytest.raises(RuntimeError, match="did not advance"):
        measure.measure_rate(lambda: None, items_per_call=1, warmup=0, clock=lambda: 1.0)


def test_flops_of_a_small_network_by_hand():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(8, 8, 3)),
        tf.keras.layers.Conv2D(4, 3, padding="same"),        # 8*8*4 outputs x 3*3*3 MACs
        tf.keras.layers.Conv2D(6, 3, strides=2, padding="valid", groups=2),  # 3*3*6 x 3*3*2
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(5),                             # 54 x 5
    ])
    expected = 2 * (8 * 8 * 4 * 27 + 3 * 3 * 6 * 18 + 54 * 5)
    assert measure.flops_per_image(model) == expected


def test_flops_agree_with_tensorflows_profiler_for_a_conv_net():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(32, 32, 3)),
        tf.keras.layers.Conv2D(16, 5, strides=2, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, padding="same"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    concrete = tf.function(model).get_concrete_function(tf.TensorSpec([1, 32, 32, 3], tf.float32))
    graph = convert_variables_to_constants_v2(concrete).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profiled = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
    ours = measure.flops_per_image(model)
    # The profiler also counts bias adds, ReLU and pooling: a few percent more than the MACs.
    assert ours <= profiled <= 1.05 * ours


def test_side_by_side_rounds_alternate_so_a_slowdown_hits_both():
    clock = FakeClock()
    order = []
    slow = {"factor": 1.0}

    def make(name, seconds):
        def call():
            order.append(name)
            clock.now += seconds * slow["factor"]
            if len(order) == 8:  # the machine gets twice as slow halfway through
                slow["factor"] = 2.0
        return call

    rates = measure.measure_side_by_side({"a": make("a", 0.1), "b": make("b", 0.2)}, items_per_call=10,
                                         warmup=1, repeats=4, clock=clock)
    assert order[:2] == ["a", "b"] and order[2:] == ["a", "b"] * 4
    ratios = [ra / rb for ra, rb in zip(rates["a"].rounds, rates["b"].rounds)]
    assert ratios == pytest.approx([2.0] * 4)  # every round: a is twice as fast as b


def test_crossover_is_the_first_batch_where_the_gpu_wins():
    cpu = {1: 0.001, 10: 0.002, 100: 0.01, 1000: 0.1}
    assert measure.crossover_batch(cpu, {1: 0.01, 10: 0.01, 100: 0.009, 1000: 0.01}) == 100
    assert measure.crossover_batch(cpu, {1: 0.5, 10: 0.5, 100: 0.5, 1000: 0.5}) is None


def test_call_times_of_tiny_models_on_the_cpu():
    def build(width):
        return tf.keras.Sequential([tf.keras.Input(shape=(1,)), tf.keras.layers.Dense(width, "relu"),
                                    tf.keras.layers.Dense(2)])

    table = measure.call_times(build, widths=[2, 64], batch_sizes=[1, 100], devices=["/CPU:0"],
                               repeats=2, calls_per_round=3)
    assert set(table["/CPU:0"]) == {2, 64}
    assert all(0 < seconds < 5 for row in table["/CPU:0"].values() for seconds in row.values())
