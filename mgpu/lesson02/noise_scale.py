"""The gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` from gradients at two batch sizes.

McCandlish et al. (2018), *An empirical model of large-batch training*, predict the batch size
beyond which larger batches stop paying (the critical batch) from the *noise scale*: the ratio of
the per-example gradient variance ``tr(Sigma)`` to the squared norm of the true gradient ``|G|^2``.
Neither is observed directly, but the expected squared norm of a minibatch gradient of ``B``
examples is ``E|G_B|^2 = |G|^2 + tr(Sigma) / B``. Two batch sizes ``b_small < b_big`` therefore
give unbiased estimates of both (their appendix A.1):

    |G|^2      ~ (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
    tr(Sigma)  ~ (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)

Each estimate is very noisy on its own, so :class:`TwoBatchEstimator` averages the numerator and
the denominator of ``B_simple`` separately over many pairs and divides only at the end.

The code only sees squared norms, so it does not care where they come from. In notebook 02 one process
splits a batch into microbatches (:func:`mgpu.lesson02.multimodel.microbatch_gradient_sq_norms`); in
data-parallel training (notebook 04 onwards) ``b_small`` is each worker's batch and ``b_big`` the global
batch: feed every worker's local ``|G_small|^2`` and the all-reduced ``|G_big|^2`` to
:meth:`TwoBatchEstimator.update`, and the estimate costs nothing extra.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["gradient_sq_estimate", "trace_sigma_estimate", "TwoBatchEstimator", "expected_sq_norm",
           "measure_mlp"]


def expected_sq_norm(gradient_sq: float, trace_sigma: float, batch_size: float) -> float:
    """``E|G_B|^2 = |G|^2 + tr(Sigma) / B`` for a mean of ``B`` independent per-example gradients."""
    return gradient_sq + trace_sigma / batch_size


def gradient_sq_estimate(small_sq, big_sq, b_small: float, b_big: float):
    """Unbiased estimate of ``|G|^2`` from squared norms at ``b_small`` and ``b_big`` (elementwise)."""
    _check(b_small, b_big)
    return (b_big * np.asarray(big_sq) - b_small * np.asarray(small_sq)) / (b_big - b_small)


def trace_sigma_estimate(small_sq, big_sq, b_small: float, b_big: float):
    """Unbiased estimate of ``tr(Sigma)`` from squared norms at ``b_small`` and ``b_big`` (elementwise)."""
    _check(b_small, b_big)
    return (np.asarray(small_sq) - np.asarray(big_sq)) / (1.0 / b_small - 1.0 / b_big)


def _check(b_small, b_big):
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")


class TwoBatchEstimator:
    """Accumulates pairs ``(|G_small|^2, |G_big|^2)`` and estimates ``|G|^2``, ``tr(Sigma)``, ``B_simple``.

    ``update(small_sq, big_sq)`` takes one big-batch squared norm and the squared norms of one or
    more small batches measured at the same parameters (e.g. every worker's); the small ones are
    averaged first. ``reset()`` starts a new measurement (e.g. at the next checkpoint).
    """

    def __init__(self, b_small: float, b_big: float):
        _check(b_small, b_big)
        self.b_small, self.b_big = float(b_small), float(b_big)
        self.reset()

    def reset(self) -> None:
        self._small_sum = 0.0
        self._big_sum = 0.0
        self.pairs = 0

    def update(self, small_sq, big_sq: float) -> None:
        self._small_sum += float(np.mean(small_sq))
        self._big_sum += float(big_sq)
        self.pairs += 1

    def _means(self):
        if self.pairs == 0:
            raise ValueError("no gradient norms yet: call update() first")
        return self._small_sum / self.pairs, self._big_sum / self.pairs

    @property
    def gradient_sq(self) -> float:
        """The estimate of ``|G|^2`` from the averaged squared norms."""
        return float(gradient_sq_estimate(*self._means(), self.b_small, self.b_big))

    @property
    def trace_sigma(self) -> float:
        """The estimate of ``tr(Sigma)`` from the averaged squared norms."""
        return float(trace_sigma_estimate(*self._means(), self.b_small, self.b_big))

    @property
    def b_simple(self) -> float:
        """``tr(Sigma) / |G|^2``; NaN while the averaged ``|G|^2`` estimate is not positive."""
        g2 = self.gradient_sq
        return self.trace_sigma / g2 if g2 > 0 else math.nan


def measure_mlp(params, x: np.ndarray, y: np.ndarray, b_small: int, k: int, repeats: int,
                rng: np.random.Generator) -> TwoBatchEstimator:
    """Estimate the noise scale of the first MLP in ``params`` (:mod:`mgpu.lesson02.multimodel`) on ``(x, y)``.

    Each of ``repeats`` big batches of ``k * b_small`` random examples is split into ``k`` small
    ones: the ``k`` small-batch squared norms and the big batch's one make a pair, exactly as ``k``
    data-parallel workers with ``b_small`` examples each would see them.
    """
    from mgpu.lesson02 import multimodel  # TensorFlow is only needed here

    estimator = TwoBatchEstimator(b_small, b_small * k)
    for _ in range(repeats):
        index = rng.choice(len(x), size=b_small * k, replace=False)
        small, big = multimodel.microbatch_gradient_sq_norms(params, x[index], y[index], k)
        estimator.update(small, big)
    return estimator
