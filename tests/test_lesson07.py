"""mgpu.lesson07.costs: the alpha-beta fit and the ring's formula, scaling efficiency, the hidden fraction, and
tensor fusion counted in Horovod's timeline (timeline.collective_calls) on 2 real workers."""

import math

import numpy as np
import pytest

from mgpu.lesson07 import costs
from mgpu.runtime import timeline

SIZES = [2 ** k for k in range(10, 27, 2)]


def test_fit_recovers_a_known_latency_and_bandwidth():
    alpha, beta = 150e-6, 1.7e9
    fit = costs.fit_alpha_beta(SIZES, [alpha + n / beta for n in SIZES])
    assert math.isclose(fit.latency_s, alpha, rel_tol=1e-9) and math.isclose(fit.bandwidth_Bps, beta, rel_tol=1e-9)
    assert math.isclose(fit.r2, 1.0) and np.allclose(fit.seconds(SIZES), [alpha + n / beta for n in SIZES])


def test_fit_with_noise_stays_close_and_reports_a_lower_r2():
    rng = np.random.default_rng(0)
    alpha, beta = 1e-3, 0.5e9
    times = [(alpha + n / beta) * rng.uniform(0.95, 1.05) for n in SIZES]
    fit = costs.fit_alpha_beta(SIZES, times)
    assert abs(fit.latency_s / alpha - 1) < 0.1 and abs(fit.bandwidth_Bps / beta - 1) < 0.1
    assert 0.95 < fit.r2 < 1


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError):
        costs.fit_alpha_beta([1024, 1024], [1e-3, 2e-3])


def test_ring_formula_and_the_link_a_fit_implies():
    alpha, beta = 50e-6, 2e9
    for n in (2, 4, 8):
        times = costs.ring_allreduce_s(SIZES, n, alpha, beta)
        fit = costs.fit_alpha_beta(SIZES, times)
        assert math.isclose(fit.latency_s, 2 * (n - 1) * alpha, rel_tol=1e-9)
        assert np.allclose(costs.link_from_allreduce(fit, n), (alpha, beta), rtol=1e-9)
    # Each worker sends 2(N - 1)/N of the vector: the same as one message at 2 workers, under twice it for any N.
    assert math.isclose(float(costs.ring_allreduce_s(1e6, 2, 0.0, 1e6)), 1.0)
    assert float(costs.ring_allreduce_s(1e6, 1024, 0.0, 1e6)) < 2


def test_message_values_per_collective():
    assert costs.message_values("allreduce", 1024, 4) == 256
    assert costs.message_values("allgather", 1024, 4) == 64  # each contributes 1/N of the result
    assert costs.message_values("reducescatter", 1024, 4) == 256


def test_scaling_efficiency_and_hidden_fraction():
    assert costs.scaling_efficiency(0.9, 0.1) == pytest.approx(0.9)
    assert costs.scaling_efficiency(0.9, 0.1, hidden_fraction=1.0) == 1.0
    assert costs.hidden_fraction({"compute": 1.0, "serial": 1.5, "overlapped": 1.2}) == pytest.approx(0.6)
    assert costs.hidden_fraction({"compute": 1.0, "serial": 1.5, "overlapped": 1.7}) == 0.0
    assert costs.hidden_fraction({"compute": 1.0, "serial": 1.5, "overlapped": 0.9}) == 1.0
    assert costs.hidden_fraction({"compute": 1.0, "serial": 0.9, "overlapped": 0.9}) == 0.0


def _span(pid, name, start, end):
    return [{"ph": "B", "name": name, "ts": start, "pid": pid}, {"ph": "E", "ts": end, "pid": pid}]


def test_collective_calls_counts_fused_tensors_once():
    # Tensors 1-3 fused (all begin before any ends), then tensor 4 alone, then 5 starting as 4 ends.
    events = (_span(1, "GLOO_ALLREDUCE", 10, 50) + _span(2, "GLOO_ALLREDUCE", 11, 51) + _span(3, "GLOO_ALLREDUCE", 12, 52)
              + _span(4, "GLOO_ALLREDUCE", 60, 70) + _span(5, "GLOO_ALLREDUCE", 70, 80)
              + _span(6, "NEGOTIATE_ALLREDUCE", 0, 9))
    assert timeline.collective_calls(events) == 3
    assert timeline.collective_calls(events, "NEGOTIATE_ALLREDUCE") == 1
    assert timeline.collective_calls([]) == 0


@pytest.mark.slow
def test_fusion_off_is_one_call_per_tensor_and_the_default_fuses(tmp_path):
    from mgpu.runtime import launch

    calls = {}
    for threshold in ("0", None):
        env = {"HOROVOD_TIMELINE": "DYNAMIC", **({"HOROVOD_FUSION_THRESHOLD": threshold} if threshold else {})}
        run = launch.run(costs.fusion_steps, 2, args=(6, 16, 8, 2, str(tmp_path / f"t{threshold}.json"), 2),
                         env=env, verbose=False).value
        assert run["tensors_per_step"] == 14 and run["step_s"] > 0
        calls[threshold] = timeline.collective_calls(run["timeline"]) / run["timeline_steps"]
    assert calls["0"] == 14
    assert calls[None] < 14
