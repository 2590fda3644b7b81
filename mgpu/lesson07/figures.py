"""Notebook 07's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


def collective_costs(rows, fits, formula=None, name: str = "07_collective_costs"):
    """Seconds per call against message bytes, one panel per number of workers: each collective's
    measurements (points) and its fitted ``a + n / b`` (line); ``formula`` ``{workers: seconds(bytes)}``
    adds the ring all-reduce's formula (dashed) where given.

    ``rows`` are :func:`mgpu.lesson07.costs.time_collectives`'s rows; ``fits`` maps ``(op, workers)`` to a
    :class:`mgpu.lesson07.costs.Fit`."""
    counts = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.2 * len(counts), 3.9), squeeze=False, sharey=True)
    colours = {"allreduce": "tab:blue", "allgather": "tab:orange", "reducescatter": "tab:green",
               "broadcast": "tab:purple"}
    for ax, n in zip(axes[0], counts):
        for op, colour in colours.items():
            mine = sorted((r["bytes"], r["seconds"]) for r in rows if r["workers"] == n and r["op"] == op)
            if not mine:
                continue
            x, t = np.array(mine, float).T
            ax.plot(x, t * 1e3, "o", color=colour, ms=4)
            fit = fits[op, n]
            grid = np.geomspace(x.min(), x.max(), 50)
            ax.plot(grid, fit.seconds(grid) * 1e3, "-", color=colour, lw=1,
                    label=f"{op}: a={fit.latency_s * 1e6:.0f} us, b={fit.bandwidth_Bps / 1e9:.2f} GB/s, "
                          f"worst miss {fit.worst_miss:.1f}x")
            if op == "allreduce" and formula and n in formula:
                ax.plot(grid, np.asarray(formula[n](grid)) * 1e3, "--", color="k", lw=1,
                        label="ring formula, alpha and beta from 2 workers")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message (bytes)")
        ax.set_title(f"{n} workers (Gloo)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel("time per call (ms)")
    fig.suptitle("Collectives on Horovod: measured (points) and the fitted line time = a + n / b\n"
                 "(curved on these log-log axes: in the model, the latency a rules small messages, the slope 1/b large ones)",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
