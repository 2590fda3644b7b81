"""Notebook 08's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


def memory_budget(predicted: dict, measured: dict, name: str = "08_memory_budget"):
    """The parts of a training step's memory, predicted (hatched) beside measured, in MB."""
    parts = list(predicted)
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    y = np.arange(len(parts))
    ax.barh(y - 0.2, [predicted[p] / 1e6 for p in parts], height=0.4, color="white", edgecolor="C0",
            hatch="//", label="predicted from the model")
    ax.barh(y + 0.2, [measured[p] / 1e6 for p in parts], height=0.4, color="C0", label="measured from the tensors")
    ax.set_yticks(y, parts)
    ax.invert_yaxis()
    ax.set_xlabel("MB")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("one training step's memory, by part", fontsize=10)
    save_figure(fig, name)
    return fig


def zero_bytes(rows: list, name: str = "08_zero_bytes"):
    """Bytes one worker holds (rank 0) per stage, stacked by part, one panel per number of workers.

    ``rows`` are :func:`mgpu.lesson08.zero.compare_stages`'s rows (``workers``, ``stage``, ``rank`` and
    the bytes of ``parameters``, ``gradients`` and ``optimizer state``)."""
    parts = ("parameters", "gradients", "optimizer state")
    counts = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(4.2 * len(counts), 3.2), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], counts):
        mine = [r for r in rows if r["workers"] == n and r["rank"] == 0]
        bottom = np.zeros(len(mine))
        for i, part in enumerate(parts):
            values = np.array([r[part] / 1e6 for r in mine])
            ax.bar([r["stage"] for r in mine], values, bottom=bottom, color=f"C{i}",
                   label="weights" if part == "parameters" else part)
            bottom += values
        ax.set_title(f"N = {n} workers", fontsize=10)
        ax.set_ylabel("MB held by one worker")
    axes[0][0].legend(fontsize=8)
    save_figure(fig, name)
    return fig
