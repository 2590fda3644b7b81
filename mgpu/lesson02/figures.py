"""Notebook 02's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


_MOMENTUM_COLOURS = {0.0: "tab:blue", 0.9: "tab:red"}


def _readable_log_axis(axis):
    """Ticks at 1, 2 and 5 times each power of ten, written as plain numbers, on a log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def _log2_batch_axis(ax, batch_sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(batch_sizes), [str(b) for b in batch_sizes])
    ax.minorticks_off()
    ax.set_xlabel("batch size B")


def throughput_vs_batch(throughput: dict, name: str = "02_throughput"):
    """Images per second against batch size, with the line a per-step-overhead-free machine would follow."""
    batches = sorted(throughput)
    rates = [throughput[b] for b in batches]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(batches, rates, "o-", color="tab:blue", label="measured (Throughput callback)")
    ideal = [rates[0] * b / batches[0] for b in batches]
    ax.plot(batches, ideal, "--", color="gray", label="if images/s grew with B")
    ax.set_yscale("log")
    ax.set_ylim(min(rates) / 2, max(rates) * 3)
    _log2_batch_axis(ax, batches)
    ax.set_ylabel("training images / s")
    ax.set_title("Training throughput against the batch size", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def time_to_accuracy_runs(runs, target: float, name: str = "02_time_to_accuracy"):
    """Validation accuracy against wall time per batch size; seconds and epochs to the target."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    colours = plt.cm.viridis(np.linspace(0, 0.85, len(runs)))
    for run, colour in zip(runs, colours):
        epochs = len(run.val_accuracy)
        axes[0].plot(run.wall_times, run.val_accuracy, "o-", ms=3 if epochs > 1 else 6, color=colour,
                     label=f"B = {run.batch_size} ({epochs} epoch{'' if epochs == 1 else 's'})")
    axes[0].axhline(target, color="black", ls=":", label=f"target {target:.2f}")
    axes[0].set_xlabel("wall time since training began (s)")
    axes[0].set_ylabel("test accuracy")
    axes[0].set_title("Accuracy against time (StopAtAccuracy ends each run)", fontsize=10)
    axes[0].legend(fontsize=8)
    batches = [r.batch_size for r in runs]
    axes[1].plot(batches, [r.seconds for r in runs], "o-", color="tab:blue", label="seconds to target")
    axes[1].set_ylabel("seconds to target", color="tab:blue")
    twin = axes[1].twinx()
    twin.plot(batches, [r.epochs for r in runs], "s--", color="tab:red", label="epochs to target")
    twin.set_ylabel("epochs to target", color="tab:red")
    twin.set_ylim(0, max(r.epochs for r in runs) * 1.2)
    axes[1].set_ylim(0, max(r.seconds for r in runs) * 1.2)
    _log2_batch_axis(axes[1], batches)
    axes[1].set_title("Time and epochs to the target", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def steps_to_target_regimes(batch_sizes, steps: dict, fits: dict, best_lrs: dict,
                            name: str = "02_steps_to_target"):
    """S(B) per momentum with the fitted S_min (1 + B_crit / B), and the best learning rate per B.

    ``steps``, ``fits`` (``(S_min, B_crit)``) and ``best_lrs`` are keyed by momentum.
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    b = np.asarray(batch_sizes, float)
    dense = np.geomspace(b.min(), b.max(), 200)
    for mu in steps:
        colour = _MOMENTUM_COLOURS.get(mu, "tab:green")
        s_min, b_crit = fits[mu]
        label = "plain SGD" if mu == 0 else f"momentum {mu:g}"
        ax.plot(b, steps[mu], "o", color=colour, label=f"{label}: measured")
        ax.plot(dense, s_min * (1 + b_crit / dense), "-", color=colour, alpha=0.7,
                label=f"fit: S_min = {s_min:.0f}, B_crit = {b_crit:.0f}")
        ax.axvline(b_crit, color=colour, ls=":", alpha=0.7)
    first = steps[min(steps)][0]
    ax.plot(b, first * b[0] / b, "--", color="gray", label="perfect scaling (S halves when B doubles)")
    ax.set_yscale("log")
    ax.set_ylim(min(min(v) for v in steps.values()) / 2, max(max(v) for v in steps.values()) * 2)
    _log2_batch_axis(ax, batch_sizes)
    ax.set_ylabel("steps to the target loss (best LR)")
    ax.set_title("Steps to the target against the batch size (best LR per B)", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    ax = axes[1]
    for mu in best_lrs:
        colour = _MOMENTUM_COLOURS.get(mu, "tab:green")
        label = "plain SGD" if mu == 0 else f"momentum {mu:g}"
        ax.plot(b, best_lrs[mu], "o-", color=colour, label=label)
    ax.set_yscale("log", base=2)
    _log2_batch_axis(ax, batch_sizes)
    ax.set_ylabel("best effective LR  lr / (1 - momentum)")
    ax.set_title("The best learning rate at each batch size", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def noise_scale_run(run, b_crit: float, target_loss: float, pooled=(), name: str = "02_noise_scale"):
    """B_simple and the held-out loss at each checkpoint of one training run, against B_crit.

    ``pooled``: ``(step, value, label)`` triples for pooled estimates, drawn as stars.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    steps = np.maximum(run.steps, 0.5)  # step 0 drawn at 0.5 on the log axis
    ax.plot(steps, run.b_simple, "o-", color="tab:purple", lw=1, ms=4,
            label="B_simple = tr(Sigma) / |G|^2 at one checkpoint")
    for (step, value, label), colour in zip(pooled, ("tab:olive", "tab:green", "darkgreen")):
        ax.plot([max(step, 0.5)], [value], "*", ms=14, color=colour, label=f"{label}: {value:.0f}")
    ax.axhline(b_crit, color="tab:blue", ls="--", label=f"B_crit from the S(B) fit: {b_crit:.0f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _readable_log_axis(ax.xaxis)
    _readable_log_axis(ax.yaxis)
    ax.set_xlabel("training step (step 0 drawn at 0.5)")
    ax.set_ylabel("batch size")
    twin = ax.twinx()
    twin.plot(steps, run.eval_loss, "s:", color="tab:gray", ms=3, label="held-out loss (right axis)")
    twin.axhline(target_loss, color="tab:gray", lw=0.8, label=f"target loss {target_loss}")
    twin.set_ylabel("held-out loss", color="tab:gray")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax.set_title("The gradient noise scale during one training run", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def scaling_rules_and_warmup(study: dict, base_batch: int, warmup_batch: int,
                             name: str = "02_linear_scaling"):
    """Accuracy after a fixed epoch budget per (rule, warm-up) against B; the warm-ups at one batch."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.6, 1]})
    styles = {"linear/gradual": ("tab:green", "o-"), "linear/constant": ("tab:orange", "^--"),
              "linear/none": ("tab:red", "v--"), "sqrt/gradual": ("tab:purple", "s-"),
              "none/none": ("tab:gray", "d-")}
    ax = axes[0]
    for key, values in study.items():
        colour, style = styles.get(key, ("black", "o-"))
        rule, warm = key.split("/")
        batches = sorted(values)
        warm_text = "no warm-up" if warm == "none" else f"{warm} warm-up"
        ax.plot(batches, [values[b] for b in batches], style, color=colour,
                label=f"{rule} scaling, {warm_text}" if rule != "none" else "no LR scaling")
    base = study["linear/gradual"][base_batch]
    ax.axhline(base, color="black", lw=0.8, ls=":", label=f"batch {base_batch} (the base)")
    _log2_batch_axis(ax, sorted(study["linear/gradual"]))
    ax.set_ylabel("test accuracy after the fixed epoch budget")
    ax.set_title("LR scaling with a fixed number of epochs", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1]
    keys = ["linear/none", "linear/constant", "linear/gradual"]
    values = [study[k][warmup_batch] for k in keys]
    ax.bar(["none", "constant", "gradual"], values, color=["tab:red", "tab:orange", "tab:green"])
    for i, v in enumerate(values):
        ax.text(i, v + 0.01, f"{v:.3f}", ha="center", fontsize=8)
    ax.axhline(base, color="black", lw=0.8, ls=":", label=f"batch {base_batch} (the base)")
    ax.set_ylim(0, 1)
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Warm-up at batch {warmup_batch} (linear scaling)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def sharp_vs_flat(alphas, train_loss, test_accuracy, sharpness: dict, accuracies: dict,
                  name: str = "02_sharp_vs_flat"):
    """Keskar's 1-D plot f(a x_LB + (1 - a) x_SB), the epsilon-sharpness and the test accuracies."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [1.5, 1, 1]})
    ax = axes[0]
    ax.plot(alphas, train_loss, "-", color="tab:blue", label="training loss")
    ax.set_yscale("log")
    _readable_log_axis(ax.yaxis)
    ax.set_xlabel("a  (0 = small-batch solution, 1 = large batch after as many updates)")
    ax.set_ylabel("training loss (log)", color="tab:blue")
    for a in (0, 1):
        ax.axvline(a, color="gray", lw=0.8, ls=":")
    twin = ax.twinx()
    twin.plot(alphas, test_accuracy, "--", color="tab:red", label="test accuracy")
    twin.set_ylabel("test accuracy", color="tab:red")
    twin.set_ylim(0, 1)
    ax.set_title("Along the line between the two solutions", fontsize=10)
    ax = axes[1]
    labels = list(sharpness)
    ticks = [k.replace(", ", "\n") for k in labels]
    ax.bar(ticks, [sharpness[k] for k in labels], color=["tab:blue", "tab:orange", "tab:red"][: len(labels)])
    for i, k in enumerate(labels):
        ax.text(i, sharpness[k], f"{sharpness[k]:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("epsilon-sharpness (x100, relative)")
    ax.set_title("Sharpness of each solution", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax = axes[2]
    labels = list(accuracies)
    values = [accuracies[k] for k in labels]
    ax.bar([k.replace(", ", "\n") for k in labels], values, color=["tab:blue", "tab:orange", "tab:red"][: len(labels)])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("test accuracy")
    ax.set_title("Generalization", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
