"""Notebook 06's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


def async_staleness_distribution(staleness_by_workers: dict, name: str = "06_staleness"):
    """One histogram per worker count: the fraction of applied gradients at each staleness, with
    the measured mean and the N - 1 of Dean et al. (2012) marked."""
    counts = sorted(staleness_by_workers)
    fig, axes = plt.subplots(1, len(counts), figsize=(3.2 * len(counts), 2.9), squeeze=False)
    for ax, n in zip(axes[0], counts):
        values = np.asarray(staleness_by_workers[n], int)
        bins = np.arange(values.max() + 2) - 0.5
        ax.hist(values, bins=bins, weights=np.full(len(values), 1 / len(values)), color="tab:blue")
        ax.axvline(values.mean(), color="tab:red", lw=1.5, label=f"mean {values.mean():.2f}")
        ax.axvline(n - 1, color="k", ls="--", lw=1, label=f"N - 1 = {n - 1}")
        ax.set_xlabel("staleness (updates)")
        ax.set_title(f"{n} asynchronous workers", fontsize=10)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("fraction of applied gradients")
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def async_loss_curves(runs: dict, title: str, name: str = "06_sync_vs_async"):
    """Full-data loss against updates (left) and wall-clock seconds (right), one line per run.

    ``runs`` maps a label to ``(seconds, losses)``, both one value per update (index 0: the start).
    The axis stops at the highest loss, or at 1000 times the lowest if that is lower: a run past it
    ends in a cross at the top, labelled with its last loss in the left panel.
    """
    fig, (by_update, by_time) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    finite = [v for _, losses in runs.values() for v in np.asarray(losses, float) if np.isfinite(v)]
    top = min(max(finite), 1e3 * min(finite)) if finite else 1.0
    clipped = []
    for i, (label, (seconds, losses)) in enumerate(runs.items()):
        losses = np.asarray(losses, float)
        shown = np.where(np.isfinite(losses) & (losses <= top), losses, np.nan)
        for ax, x in ((by_update, np.arange(len(losses))), (by_time, np.asarray(seconds, float))):
            ax.plot(x, shown, color=f"C{i}", lw=1.2, label=label)
            if not (np.isfinite(losses[-1]) and losses[-1] <= top):
                ax.plot(x[-1], top, "x", color=f"C{i}", ms=8)
        if not (np.isfinite(losses[-1]) and losses[-1] <= top):
            clipped.append((i, label, len(losses) - 1, losses[-1]))
    longest = max(len(losses) for _, losses in runs.values()) - 1
    for i, label, last, loss in clipped:  # its last loss, written beside its cross (left panel)
        left = last < 0.6 * longest
        by_update.annotate(f"{label}: loss {loss:.2g}, off the scale", (last, top), fontsize=7, color=f"C{i}",
                           textcoords="offset points", xytext=(6 if left else -6, -12), ha="left" if left else "right")
    by_update.set_xlabel("updates applied to the weights")
    by_time.set_xlabel("wall-clock seconds")
    by_update.set_ylabel("loss on all the data")
    for ax in (by_update, by_time):
        ax.set_yscale("log")
        ax.set_ylim(top=top * 1.5)
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def ps_vs_ring_traffic(rows, name: str = "06_traffic"):
    """Bytes per synchronous step on the busiest link, parameter server against ring, by worker count.

    ``rows`` are :func:`mgpu.lesson06.async_sgd.traffic_per_worker` dicts (one per worker count), in bytes.
    """
    n = np.array([r["workers"] for r in rows])
    gradient = rows[0]["ps_worker_sends"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(n, [r["ps_server_receives"] / gradient for r in rows], "o-", color="tab:red",
            label="parameter server: the server's link receives N x")
    ax.plot(n, [r["ps_worker_sends"] / gradient for r in rows], "s:", color="tab:red", alpha=0.6,
            label="parameter server: each worker sends 1 x")
    ax.plot(n, [r["ring_worker_sends"] / gradient for r in rows], "o-", color="tab:blue",
            label="ring all-reduce: each worker sends 2(N-1)/N x")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(v) for v in n])
    ax.set_xlabel("workers N")
    ax.set_ylabel("gradients' worth of bytes per step")
    ax.set_title("Traffic of one synchronous step", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def straggler_step_times(configs: dict, name: str = "06_stragglers"):
    """Per configuration: each rank's device time per step (bars) and the synchronous step time
    (a black line over them), from :func:`mgpu.lesson06.async_sgd.straggler_study`."""
    labels = list(configs)
    ranks = len(configs[labels[0]]["device_s_per_rank"])
    width = 0.8 / ranks
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for r in range(ranks):
        ax.bar(np.arange(len(labels)) + (r - (ranks - 1) / 2) * width,
               [configs[k]["device_s_per_rank"][r] * 1e3 for k in labels], width,
               color=f"C{r}", label=f"rank {r}: device time")
    for i, k in enumerate(labels):
        step = configs[k]["step_s"] * 1e3
        ax.hlines(step, i - 0.45, i + 0.45, color="k", lw=2, label="measured step time" if i == 0 else None)
        ax.text(i, step, f"{step:.0f} ms\n{configs[k]['examples_per_s']:,.0f} ex/s", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("milliseconds per step")
    ax.set_ylim(top=max(c["step_s"] for c in configs.values()) * 1e3 * 1.35)
    ax.set_title("Synchronous SGD waits for the slowest rank", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    save_figure(fig, name)
    return fig
