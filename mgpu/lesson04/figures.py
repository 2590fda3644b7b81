"""Notebook 04's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


def ring_allreduce_steps(steps, name: str = "04_ring_allreduce"):
    """One panel per ring step: which workers' contributions each worker's copy of each chunk holds.

    ``steps`` come from :func:`mgpu.lesson04.allreduce.ring_allreduce_steps` run on inputs where worker i
    holds ``2.0 ** i`` everywhere, so a chunk's value names the workers summed into it.
    """
    n = len(steps[0].chunks)
    fig, axes = plt.subplots(1, len(steps), figsize=(2.3 * len(steps), 2.9), squeeze=False)
    for ax, st in zip(axes[0], steps):
        counts = np.array([[bin(int(round(c[0]))).count("1") for c in worker] for worker in st.chunks])
        ax.imshow(counts, cmap="Blues", vmin=0, vmax=n)
        for w in range(n):
            for c in range(n):
                ax.text(c, w, counts[w, c], ha="center", va="center", fontsize=8,
                        color="white" if counts[w, c] > n / 2 else "black")
        for i, j, c in st.sends:
            ax.annotate("", xy=(c + 0.3, j - 0.35 if j > i else j + 0.35), xytext=(c + 0.3, i),
                        arrowprops=dict(arrowstyle="->", color="tab:red", lw=0.8))
        ax.set_xticks(range(n), [str(c) for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"w{w}" for w in range(n)], fontsize=7)
        title = "start" if st.phase == "start" else f"{st.phase}\nstep s = {st.step}"
        ax.set_title(f"{title}\nsent/worker: {int(st.bytes_sent[0])} B", fontsize=7)
        ax.set_xlabel("chunk", fontsize=7)
    fig.suptitle(f"Ring all-reduce: how many workers' inputs each copy of each chunk holds ({n}: all of them; "
                 "red: this step's sends)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def scaling(images_per_s: dict, name: str = "04_scaling", real_cores: dict | None = None,
            label: str = "measured"):
    """Speed-up against the number of workers, with the ideal line, and the scaling efficiency.

    ``images_per_s`` is the lesson's measurement (``label``); ``real_cores``, if given, the same runs
    on the machine's cores alone, drawn beside it.
    """
    workers = sorted(images_per_s)
    series = {label: images_per_s, **({"real cores alone": real_cores} if real_cores else {})}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.plot(workers, workers, "k--", lw=0.8, label="ideal (N x one worker)")
    colours = ("tab:blue", "tab:gray")  # the same series, the same colour, in both panels
    for (text, rates), style, colour in zip(series.items(), ("o-", "s:"), colours):
        left.plot(workers, [rates[w] / rates[workers[0]] * workers[0] for w in workers], style, color=colour,
                  label=text)
    left.set_xlabel("workers (Horovod processes)")
    left.set_ylabel("speed-up over one worker (ratio of images/s)")
    left.set_xticks(workers)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    left.set_title("Speed-up", fontsize=10)
    width = 0.8 / len(series)
    top = 1.0
    for k, ((text, rates), colour) in enumerate(zip(series.items(), colours)):
        eff = [rates[w] / (w * rates[workers[0]] / workers[0]) for w in workers]
        top = max(top, *eff)
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(workers))]
        right.bar(xs, eff, width=width, color=colour, label=text)
        for x, e in zip(xs, eff):
            right.text(x, e, f"{e:.2f}", ha="center", va="bottom", fontsize=8)
    right.set_xticks(range(len(workers)), [str(w) for w in workers])
    right.axhline(1.0, color="k", ls="--", lw=0.8)
    right.set_xlabel("workers")
    right.set_ylabel("scaling efficiency: speed-up / N")
    right.set_ylim(0, 1.3 * top)  # room for every bar, its label and the legend
    right.legend(fontsize=7, loc="upper left", ncol=2)
    right.set_title("Efficiency", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def step_time_split(rows: dict, name: str = "04_step_split"):
    """Stacked bars: milliseconds per step in gradient computation and in the all-reduce."""
    labels = list(rows)
    compute = np.array([rows[k][0] for k in labels]) * 1e3
    reduce_ = np.array([rows[k][1] for k in labels]) * 1e3
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(labels, compute, label="compute gradients (forward + backward)")
    ax.bar(labels, reduce_, bottom=compute, label="all-reduce gradients")
    for i, (c, r) in enumerate(zip(compute, reduce_)):
        ax.text(i, c + r, f"{r / (c + r):.0%} comm.", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("milliseconds per step (median)")
    ax.set_title("Where a 4-worker step goes", fontsize=10)
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def weight_divergence(spreads: dict, name: str = "04_divergence"):
    """Largest weight difference between ranks at the end of training, per variant (log scale)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = list(spreads)
    # A spread of exactly 0 has no place on a log scale: no bar, a label at the bottom.
    values = [spreads[k] if spreads[k] > 0 else np.nan for k in labels]
    xs = np.arange(len(labels))
    ax.bar(xs, values, color=["tab:green" if not v > 1e-6 else "tab:red" for v in values])
    for x, v in zip(xs, values):
        ax.text(x, v if v > 0 else 1e-12, f"{v:.2g}" if v > 0 else "0: identical\n(no bar)", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(xs, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_yscale("log")
    ax.set_ylim(1e-13, 10)
    ax.set_ylabel("max |w_rank - w_rank0| after training")
    ax.set_title("Do the ranks hold the same model?", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def timeline_activities(summary: dict, name: str = "04_timeline"):
    """Horizontal bars: wall-clock seconds of each Horovod activity in a timeline."""
    acts = [a for a in summary["activities"] if a.wall_s > 0][::-1]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(acts) + 1.2))
    ax.barh([a.name for a in acts], [a.wall_s for a in acts])
    ax.set_xlabel(f"seconds with at least one tensor in the activity (trace spans {summary['span_s']:.1f} s)")
    ax.set_title("Horovod timeline of one 4-worker run", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
