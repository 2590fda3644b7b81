"""Notebook 05's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


def accuracy_vs_time(logs: dict, target: float | None = None, diverged=(), name: str = "05_accuracy_vs_time"):
    """Validation accuracy against wall time (left) and epochs (right), one line per CSV log.

    ``logs`` maps a label to a :class:`~mgpu.runtime.callbacks.WallClockCSVLogger` file; runs named in
    ``diverged`` end with a cross. ``target`` draws the accuracy to reach.
    """
    from mgpu.lesson05.recipes import read_log

    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for i, (label, path) in enumerate(logs.items()):
        rows = read_log(path)
        seconds = [r["wall_time"] for r in rows]
        epochs = [r.get("epochs_done", r["epoch"] + 1) for r in rows]
        accuracy = [r["val_accuracy"] for r in rows]
        # The first run (the reference) is drawn thicker; after matplotlib's ten colours, dashes.
        style = dict(color=f"C{i}", lw=2.2 if i == 0 else 1.4, ls="-" if i < 10 else "--",
                     marker="o", ms=3, label=label)
        for ax, x in ((by_time, seconds), (by_epoch, epochs)):
            ax.plot(x, accuracy, **style)
            if label in diverged and x:
                ax.plot(x[-1], accuracy[-1], "x", color=f"C{i}", ms=10, mew=2.5)
    for ax, xlabel in ((by_time, "seconds since the first step ended"), (by_epoch, "epoch")):
        if target is not None:
            ax.axhline(target, color="k", ls=":", lw=1, label=f"target {target:g}" if ax is by_epoch else None)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_time.set_ylabel("validation accuracy")
    stopped = any(label in diverged for label in logs)
    by_time.set_title("accuracy against wall time" + (" (x: diverged, stopped)" if stopped else ""), fontsize=10)
    by_epoch.set_title("the same runs against epochs", fontsize=10)
    by_epoch.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def warmup_first_steps(runs: dict, name: str = "05_warmup_first_steps", uniform_loss: float | None = None):
    """Learning rate (top) and training loss (bottom) over the first steps, one line per run.

    ``runs`` maps a label to ``{"lr": [...], "loss": [...]}`` (``RecipeRun.first_steps``);
    ``uniform_loss`` (ln of the number of classes) draws a uniform guess's loss.
    """
    from matplotlib.ticker import LogFormatter

    fig, (lr_ax, loss_ax) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for i, (label, steps) in enumerate(runs.items()):
        x = np.arange(1, len(steps["loss"]) + 1)
        lr_ax.plot(x, steps["lr"], color=f"C{i}", label=label)
        loss = np.asarray(steps["loss"], dtype=float)
        loss_ax.plot(x, np.where(np.isfinite(loss), loss, np.nan), color=f"C{i}", label=label)
        if not np.all(np.isfinite(loss)):
            first_bad = int(np.argmax(~np.isfinite(loss)))
            loss_ax.axvline(first_bad + 1, color=f"C{i}", ls=":", lw=1)
    lr_ax.set_ylabel("learning rate")
    lr_ax.legend(fontsize=8)
    loss_ax.set_ylabel("training loss\n(each step's, rank 0)")
    loss_ax.set_yscale("log")
    # Plain numbers on the log axis (2.2, not 2.2 x 10^0), however narrow its range.
    loss_ax.yaxis.set_major_formatter(LogFormatter())
    loss_ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    if uniform_loss is not None:
        loss_ax.axhline(uniform_loss, color="k", ls=":", lw=1, label=f"uniform guess (ln of the classes: {uniform_loss:.2f})")
        loss_ax.legend(fontsize=8)
    loss_ax.set_xlabel("step")
    for ax in (lr_ax, loss_ax):
        ax.grid(alpha=0.3)
    lr_ax.set_title("the first steps with and without warm-up", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
