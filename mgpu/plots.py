"""The course's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np

from mgpu.results import save_figure


def _finish_log_log(fig, ax, name: str, xlabel: str, ylabel: str, title: str, legend_loc: str = "best"):
    """The shared ending of the log-log figures: axes, labels, legend, grid, then save."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc=legend_loc)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def show_examples(dataset, per_class: int = 8, seed: int = 0, name: str | None = None):
    """A grid of training images: one row per class, ``per_class`` random examples each."""
    rng = np.random.default_rng(seed)
    classes = dataset.num_classes
    fig, axes = plt.subplots(classes, per_class, figsize=(per_class * 0.9, classes * 0.95))
    for label in range(classes):
        indices = np.flatnonzero(dataset.y_train == label)
        chosen = rng.choice(indices, size=min(per_class, len(indices)), replace=False)
        for column in range(per_class):
            ax = axes[label, column]
            ax.set_xticks([])
            ax.set_yticks([])
            if column < len(chosen):
                image = dataset.x_train[chosen[column]]
                ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=255)
            if column == 0:
                ax.set_ylabel(dataset.class_names[label], rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle(f"{dataset.name}: {per_class} training examples per class", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name or f"examples_{dataset.name}")
    return fig


def bar_per_rank(values, ylabel: str, title: str, name: str):
    """One bar per Horovod rank (e.g. what each worker received from an all-reduce)."""
    fig, ax = plt.subplots(figsize=(4.5, 2.8))
    ranks = np.arange(len(values))
    ax.bar(ranks, values, color="tab:blue")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


# --------------------------------------------------------------------------------------------
# Notebook 01: GD vs SGD (the numbers come from mgpu.sgd)
# --------------------------------------------------------------------------------------------

_RUN_COLOURS = ("black", "tab:red", "tab:orange", "tab:green", "tab:blue", "tab:purple")


def _run_label(batch_size: int, n: int) -> str:
    if batch_size >= n:
        return f"GD (batch {n})"
    return "SGD, batch 1" if batch_size == 1 else f"minibatch {batch_size}"


def _parameter_grid(x, y, centre, half_width, points=160):
    from mgpu import sgd

    w = np.linspace(centre[0] - half_width[0], centre[0] + half_width[0], points)
    b = np.linspace(centre[1] - half_width[1], centre[1] + half_width[1], points)
    ww, bb = np.meshgrid(w, b)
    return ww, bb, sgd.linear_loss(ww, bb, x, y)


def linear_neuron_surface(x, y, optimum, start, name: str = "01_loss_surface"):
    """The data with its least-squares line, and the loss L(w, b) as contours and as a 3-D surface."""
    optimum, start = np.asarray(optimum), np.asarray(start)
    half = np.abs(start - optimum) * 1.3 + 0.5
    ww, bb, loss = _parameter_grid(x, y, optimum, half)
    fig = plt.figure(figsize=(14, 4.4))
    ax = fig.add_subplot(1, 3, 1)
    ax.scatter(x, y, s=4, alpha=0.35, color="tab:gray", label=f"{len(x)} examples")
    line = np.linspace(x.min(), x.max(), 2)
    ax.plot(line, optimum[0] * line + optimum[1], color="tab:red",
            label=f"least squares: y = {optimum[0]:.2f} x {optimum[1]:+.2f}")
    ax.set_xlabel("input x")
    ax.set_ylabel("target y")
    ax.set_title("The data and the best linear neuron", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax = fig.add_subplot(1, 3, 2)
    levels = np.quantile(loss, np.linspace(0, 1, 22) ** 2)
    contours = ax.contour(ww, bb, loss, levels=levels, cmap="viridis", linewidths=0.8)
    fig.colorbar(contours, ax=ax, label="loss L(w, b)")
    ax.plot(*optimum, marker="*", color="tab:red", markersize=12, linestyle="none", label="minimum")
    ax.plot(*start, marker="o", color="black", linestyle="none", label="start of training")
    ax.set_xlabel("weight w")
    ax.set_ylabel("bias b")
    ax.set_title("Loss surface, contours", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax = fig.add_subplot(1, 3, 3, projection="3d")
    ax.plot_surface(ww, bb, loss, cmap="viridis", linewidth=0, antialiased=True, alpha=0.9)
    ax.set_xlabel("weight w")
    ax.set_ylabel("bias b")
    ax.set_zlabel("loss L(w, b)")
    ax.set_title("Loss surface, 3-D: a bowl", fontsize=10)
    ax.view_init(elev=30, azim=-130)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def trajectories_on_surface(x, y, optimum, runs, name: str = "01_trajectories"):
    """Left: the paths of GD, SGD and minibatch SGD over the loss contours. Right: a zoom on the
    minimum with the positions of each run's second half of updates (the cloud SGD settles into)."""
    optimum = np.asarray(optimum)
    start = runs[0].params[0]
    n = len(x)
    half = np.abs(start - optimum) * 1.3 + 0.5
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    late = len(runs[0].params) // 2
    spread = np.max([np.max(np.abs(run.params[late:] - optimum), axis=0) for run in runs], axis=0) * 1.1
    for ax, window in zip(axes, (half, spread)):
        ww, bb, loss = _parameter_grid(x, y, optimum, window)
        levels = np.quantile(loss, np.linspace(0, 1, 18) ** 2)
        ax.contour(ww, bb, loss, levels=levels, colors="lightgray", linewidths=0.8)
        ax.set_xlim(ww.min(), ww.max())
        ax.set_ylim(bb.min(), bb.max())
        ax.set_xlabel("weight w")
        ax.set_ylabel("bias b")
    order = sorted(zip(runs, _RUN_COLOURS), key=lambda pair: pair[0].batch_size)  # GD drawn last, on top
    for run, colour in order:
        label = _run_label(run.batch_size, n)
        gd = run.batch_size >= n
        axes[0].plot(run.params[:, 0], run.params[:, 1], color=colour, linewidth=2.0 if gd else 0.9,
                     alpha=1.0 if gd else 0.8, label=label)
        axes[1].scatter(run.params[late:, 0], run.params[late:, 1], s=12 if gd else 3, color=colour,
                        alpha=1.0 if gd else 0.5, zorder=3 if gd else 2)
        axes[1].plot([], [], marker="o", color=colour, linestyle="none", markersize=5, label=label)
    axes[0].plot(*optimum, marker="*", color="gold", markeredgecolor="black", markersize=14,
                 linestyle="none", label="minimum")
    axes[1].plot(*optimum, marker="+", color="black", markersize=16, mew=1.5, linestyle="none",
                 zorder=4, label="minimum")
    axes[0].plot(*start, marker="o", color="black", linestyle="none", label="start")
    updates = len(runs[0].losses) - 1
    axes[0].set_title(f"Paths: {updates} updates each, step size {runs[0].lr:g}", fontsize=10)
    axes[1].set_title(f"Zoom on the minimum: positions during updates {late}..{updates}", fontsize=10)
    axes[0].legend(fontsize=8, loc="upper right")
    axes[1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def loss_per_update(runs, optimum_loss: float, name: str = "01_loss_per_update"):
    """Excess loss L - L* of each run against updates and against examples used (log scales)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    n = max(run.batch_size for run in runs)
    for run, colour in zip(runs, _RUN_COLOURS):
        excess = run.losses - optimum_loss
        label = _run_label(run.batch_size, n)
        axes[0].plot(np.arange(len(excess)), excess, color=colour, linewidth=1, label=label)
        axes[1].plot(np.maximum(run.examples, 1), excess, color=colour, linewidth=1, label=label)
    for ax in axes:
        ax.set_yscale("log")
        ax.set_ylabel("excess loss L(w, b) - L*")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("parameter updates")
    axes[0].set_title("Excess loss per update", fontsize=10)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("examples whose gradient was computed (log scale)")
    axes[1].set_title("Excess loss per example processed", fontsize=10)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def gradient_noise_vs_batch(batch_sizes, measured, predicted, name: str = "01_gradient_noise"):
    """Minibatch gradient variance against the batch size, measured and predicted (log-log)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(batch_sizes, predicted, color="tab:gray", linewidth=2, label="predicted tr(Σ)/B · (n-B)/(n-1)")
    ax.plot(batch_sizes, measured, "o", color="tab:red", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batch_sizes, [str(int(b)) for b in batch_sizes])
    ax.set_xlabel("batch size B (log scale)")
    ax.set_ylabel("E |g_B - g|²  (gradient variance)")
    ax.set_title("Minibatch gradient noise at the minimum", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def gd_rates(distance_curves, lrs, predicted_rates, lr_limit: float, name: str = "01_gd_rate"):
    """GD's distance to the minimum per step for several step sizes, with the predicted rates."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(lrs)))
    for distances, lr, rate, colour in zip(distance_curves, lrs, predicted_rates, colours):
        steps = np.arange(len(distances))
        ax.plot(steps, distances, color=colour, linewidth=2,
                label=f"step {lr:.3f} = {lr / lr_limit:.2f} × 2/λmax")
        ratio = distances / distances[0]
        anchor = int(np.argmax(ratio > 1e3)) if ratio[-1] > 1 else int(np.argmax(ratio < 1e-3))
        ax.plot(steps, distances[anchor] * rate ** (steps - anchor), color="black", linestyle=":", linewidth=1)
    ax.plot([], [], color="black", linestyle=":", label="predicted rate max|1 - step·λ| per step")
    ax.set_yscale("log")
    ax.set_ylim(1e-14, 1e6)
    ax.set_xlabel("GD step t")
    ax.set_ylabel("distance to the minimum |θ_t - θ*|")
    ax.set_title("Gradient descent on the linear neuron: linear convergence (or divergence)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def noise_ball(mean_loss, lrs, batch_size: int, predicted, grid_lrs, grid_batches, grid_measured,
               grid_predicted, burn_in: int, name: str = "01_noise_ball"):
    """Left: mean loss of constant-step SGD over time for several steps at one batch size, with the
    predicted noise balls. Right: measured against predicted stationary loss over the whole grid."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(lrs)))
    for curve, lr, level, colour in zip(mean_loss, lrs, predicted, colours):
        steps = np.arange(1, len(curve))
        ax.plot(steps, curve[1:], color=colour, linewidth=1.2, label=f"step {lr:g}")
        ax.axhline(level, color=colour, linestyle="--", linewidth=1)
    ax.plot([], [], color="black", linestyle="--", linewidth=1, label="predicted noise ball")
    ax.axvspan(burn_in, mean_loss.shape[-1] - 1, color="tab:gray", alpha=0.12, label="averaging window")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("SGD step t")
    ax.set_ylabel("E[f(x_t)]  (mean over chains)")
    ax.set_title(f"f = h x²/2, batch {batch_size}: fast descent, then a floor set by the step", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    ax = axes[1]
    markers = ("o", "s", "^", "D", "v")
    for batch, marker in zip(np.unique(grid_batches), markers):
        pick = grid_batches == batch
        ax.scatter(grid_predicted[pick], grid_measured[pick], marker=marker, s=45,
                   c=np.log(grid_lrs[pick]), cmap="viridis", vmin=np.log(grid_lrs.min()),
                   vmax=np.log(grid_lrs.max()), edgecolors="black")
        ax.scatter([], [], marker=marker, s=45, color="white", edgecolors="black", label=f"batch {int(batch)}")
    span = np.array([grid_predicted.min() / 2, grid_predicted.max() * 2])
    ax.plot(span, span, color="black", linewidth=1, label="measured = predicted")
    ax.fill_between(span, span * 0.8, span * 1.2, color="tab:gray", alpha=0.2, label="±20%")
    return _finish_log_log(fig, ax, name, "predicted E[f] = step·s² / (2B(2 - step·h))",
                           "measured stationary E[f]",
                           "Every (step, batch) of the grid; colour = step size (darker: smaller)", "upper left")


def decaying_step_loss(decaying_loss, decaying_expected, constant_loss, constant_lr, label: str,
                  fit_range, slope: float, name: str = "01_decaying_step"):
    """Mean loss of SGD with a decaying step against a constant one (log-log), with the fitted slope."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    steps = np.arange(1, len(decaying_loss))
    ax.plot(steps, constant_loss[1:], color="tab:orange", linewidth=1.2,
            label=f"constant step {constant_lr:g}: stalls at its noise ball")
    ax.plot(steps, decaying_loss[1:], color="tab:blue", linewidth=1.2, label=f"decaying step {label}")
    ax.plot(steps, decaying_expected[1:], color="black", linestyle=":", linewidth=1.2,
            label="exact E[f] of the decaying step")
    lo, hi = fit_range
    ax.axvspan(lo, hi, color="tab:blue", alpha=0.08, label=f"fit range: slope {slope:.2f}")
    return _finish_log_log(fig, ax, name, "SGD step t", "E[f(x_t)]  (mean over chains)",
                           "A decaying step keeps improving, as O(1/t)", "lower left")


def saddle_escape(gd_path, sgd_paths, sgd_final, name: str = "01_saddle"):
    """GD and SGD paths on x² + y⁴/4 - y²/2 from (1, 0), and where the SGD runs ended."""
    from mgpu import sgd

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1.4, 1]})
    ax = axes[0]
    xs, ys = np.meshgrid(np.linspace(-1.2, 1.2, 200), np.linspace(-1.6, 1.6, 200))
    contours = ax.contour(xs, ys, sgd.saddle_loss(xs, ys), levels=np.linspace(-0.25, 1.5, 15),
                          cmap="viridis", linewidths=0.8)
    fig.colorbar(contours, ax=ax, label="f(x, y)")
    for k in range(sgd_paths.shape[1]):
        ax.plot(sgd_paths[:, k, 0], sgd_paths[:, k, 1], color="tab:red", linewidth=0.7, alpha=0.6,
                label="SGD runs" if k == 0 else None)
    ax.plot(gd_path[:, 0, 0], gd_path[:, 0, 1], color="black", linewidth=2.5, label="GD")
    ax.plot(0, 0, marker="x", color="black", markersize=12, mew=2, linestyle="none", label="saddle point")
    ax.plot([0, 0], [-1, 1], marker="*", color="gold", markeredgecolor="black", markersize=14,
            linestyle="none", label="minima")
    ax.plot(1, 0, marker="o", color="black", linestyle="none", label="start (1, 0)")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title("GD slides into the saddle; SGD's noise pushes it off", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[1]
    ax.hist(sgd_final[:, 1], bins=np.linspace(-1.3, 1.3, 105), color="tab:red", alpha=0.8, label=f"{len(sgd_final)} SGD runs")
    ax.axvline(gd_path[-1, 0, 1], color="black", linewidth=2.5, label="GD (every run)")
    ax.set_xlabel("final y")
    ax.set_ylabel("runs")
    ax.set_title("Where the runs ended", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


# --------------------------------------------------------------------------------------------
# Notebook 02: what batch size does (the numbers come from mgpu.keras_runs, mgpu.batch_study,
# mgpu.noise_scale and mgpu.sharpness)
# --------------------------------------------------------------------------------------------

_MOMENTUM_COLOURS = {0.0: "tab:blue", 0.9: "tab:red"}


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
        axes[0].plot(run.wall_times, run.val_accuracy, "o-", ms=3, color=colour, label=f"B = {run.batch_size}")
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
    ax.axhline(base, color="black", lw=0.8, ls=":")
    ax.set_ylim(0, 1)
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Warm-up at batch {warmup_batch} (linear scaling)", fontsize=10)
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
    ax.set_xlabel("a  (0 = small-batch solution, 1 = large batch after as many updates)")
    ax.set_ylabel("training loss (log)", color="tab:blue")
    for a in (0, 1):
        ax.axvline(a, color="gray", lw=0.8, ls=":")
    twin = ax.twinx()
    twin.plot(alphas, test_accuracy, "--", color="tab:red", label="test accuracy")
    twin.set_ylabel("test accuracy", color="tab:red")
    twin.set_ylim(0, 1)
    ax.set_title("f(a x_LB + (1 - a) x_SB)", fontsize=10)
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
    ax.set_ylim(min(values) - 0.05, max(values) + 0.03)
    ax.set_ylabel("test accuracy")
    ax.set_title("Generalization", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


# ---- Notebook 03: the input pipeline ------------------------------------------------------------

def show_jpegs(folder, count: int = 6, name: str = "03_jpeg_examples"):
    """A few of the generated JPEG files at their stored size, with their pixel size and bytes."""
    fig, axes = plt.subplots(1, count, figsize=(2.2 * count, 2.6))
    from PIL import Image

    for ax, path, relative in zip(axes, folder.paths(), folder.files):
        with Image.open(path) as picture:
            image = np.asarray(picture.convert("RGB"))
        ax.imshow(image)
        ax.set_title(f"{image.shape[1]}x{image.shape[0]}\n{os.path.getsize(path) / 1024:.0f} KiB", fontsize=8)
        ax.set_xlabel(relative.split("/")[1].split("_", 1)[1], fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("The JPEG files the pipelines read", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def pipeline_stages(results, name: str = "03_pipeline_stages", ceiling_label: str = "float32 model's compute ceiling"):
    """Images/s per stage: the pipeline alone, training fed by it, and the compute ceiling (``ceiling_label``
    names it: the modelled device, where the stages were timed on one)."""
    shown = [r for r in results if r.train_rate is not None]
    labels = [r.stage.summary for r in shown]
    y = np.arange(len(shown))
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(shown) + 1.6))
    ax.barh(y + 0.2, [r.pipeline_rate for r in shown], height=0.38, color="tab:gray",
            label="pipeline alone (no training)")
    ax.barh(y - 0.2, [r.train_rate for r in shown], height=0.38, color="tab:blue", label="training fed by it")
    # The float32 model's ceiling (timed beside every stage; a stage that changes the model times it as well).
    ceiling = float(np.median([r.reference_rate if r.reference_rate is not None else r.ceiling_rate for r in shown]))
    ax.axvline(ceiling, color="tab:red", linestyle="--",
               label=f"{ceiling_label}, median over the stages ({ceiling:,.0f}/s)")
    for yi, r in zip(y, shown):
        ax.text(r.train_rate, yi - 0.2, f" {r.fraction_of_reference:.2f}x", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("images per second (log scale)")
    ax.set_title("Each stage of the input pipeline against the compute ceiling\n"
                 f"(x: training over the {ceiling_label} of each stage)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def models_vs_pipelines(results, ceilings: dict, name: str = "03_models_vs_pipelines"):
    """Pipeline-alone rates per stage against the images/s each model needs (its ceiling)."""
    shown = [r for r in results if r.pipeline_rate is not None]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    x = np.arange(len(shown))
    ax.plot(x, [r.pipeline_rate for r in shown], "o-", color="tab:gray", label="what the pipeline delivers")
    for (label, ceiling), colour in zip(ceilings.items(), ("tab:red", "tab:purple", "tab:green")):
        ax.axhline(ceiling, color=colour, linestyle="--", label=f"{label} needs {ceiling:,.0f}/s")
    ax.set_xticks(x, [r.stage.name for r in shown], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("images per second (log scale)")
    ax.set_title("Below a model's line, the pipeline starves it", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def call_overhead(table: dict, name: str = "03_call_overhead"):
    """Seconds per training call against batch size, one line per device and model width."""
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {0: "-", 1: "--"}
    for d, (device, widths) in enumerate(table.items()):
        for width, row in widths.items():
            batches = sorted(row)
            ax.plot(batches, [row[b] * 1e3 for b in batches], styles.get(d, ":"), marker="o",
                    label=f"{device}, Dense({width})")
    return _finish_log_log(fig, ax, name, "batch size (samples per call)", "milliseconds per training call",
                           "Tiny models: a fixed cost per call dominates")


# ---- Notebook 04


def ring_allreduce_steps(steps, name: str = "04_ring_allreduce"):
    """One panel per ring step: which workers' contributions each worker's copy of each chunk holds.

    ``steps`` come from :func:`mgpu.allreduce.ring_allreduce_steps` run on inputs where worker i
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
        title = "start" if st.phase == "start" else f"{st.phase}\nstep {st.step + 1}"
        ax.set_title(f"{title}\nsent/worker: {int(st.bytes_sent[0])} B", fontsize=7)
        ax.set_xlabel("chunk", fontsize=7)
    fig.suptitle("Ring all-reduce: number of workers summed into each copy of each chunk "
                 "(red: this step's sends)", fontsize=9)
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
    left.set_ylabel("speed-up over one worker (images/s)")
    left.set_xticks(workers)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    left.set_title("Speed-up", fontsize=10)
    width = 0.8 / len(series)
    for k, ((text, rates), colour) in enumerate(zip(series.items(), colours)):
        eff = [rates[w] / (w * rates[workers[0]] / workers[0]) for w in workers]
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(workers))]
        right.bar(xs, eff, width=width, color=colour, label=text)
        for x, e in zip(xs, eff):
            right.text(x, e, f"{e:.2f}", ha="center", va="bottom", fontsize=8)
    right.set_xticks(range(len(workers)), [str(w) for w in workers])
    right.axhline(1.0, color="k", ls="--", lw=0.8)
    right.set_xlabel("workers")
    right.set_ylabel("scaling efficiency: speed-up / N")
    right.set_ylim(0, 1.2)
    right.legend(fontsize=7, loc="lower left")
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
    values = [max(spreads[k], 1e-12) for k in labels]
    ax.bar(labels, values, color=["tab:green" if v < 1e-6 else "tab:red" for v in values])
    for i, v in enumerate(values):
        ax.text(i, v, "0 (identical)" if spreads[labels[i]] == 0 else f"{v:.2g}", ha="center",
                va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(1e-13, 10)
    ax.set_ylabel("max |w_rank - w_rank0| after training")
    ax.set_title("Do the 4 ranks hold the same model?", fontsize=10)
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


# ---- Notebook 05: accuracy at scale ------------------------------------------------------------------


def accuracy_vs_time(logs: dict, target: float | None = None, diverged=(), name: str = "05_accuracy_vs_time"):
    """Validation accuracy against wall time (left) and epochs (right), one line per CSV log.

    ``logs`` maps a label to a :class:`~mgpu.callbacks.WallClockCSVLogger` file; runs named in
    ``diverged`` end with a cross. ``target`` draws the accuracy to reach.
    """
    from mgpu.recipes import read_log

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
    for ax, xlabel in ((by_time, "wall time since training began (s)"), (by_epoch, "epoch")):
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


def warmup_first_steps(runs: dict, name: str = "05_warmup_first_steps"):
    """Learning rate (top) and training loss (bottom) over the first steps, one line per run.

    ``runs`` maps a label to ``{"lr": [...], "loss": [...]}`` (``RecipeRun.first_steps``).
    """
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
    loss_ax.set_ylabel("training loss\n(running mean in the epoch)")
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step")
    for ax in (lr_ax, loss_ax):
        ax.grid(alpha=0.3)
    lr_ax.set_title("the first steps with and without warm-up", fontsize=10)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


# ---- Notebook 06: asynchronous SGD, parameter servers, stragglers


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
    A run whose loss stopped being finite ends in a cross at the top of the axis.
    """
    fig, (by_update, by_time) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    finite = [v for _, losses in runs.values() for v in np.asarray(losses, float) if np.isfinite(v)]
    top = min(max(finite), 1e3 * min(finite)) if finite else 1.0
    for i, (label, (seconds, losses)) in enumerate(runs.items()):
        losses = np.asarray(losses, float)
        shown = np.where(np.isfinite(losses) & (losses <= top), losses, np.nan)
        for ax, x in ((by_update, np.arange(len(losses))), (by_time, np.asarray(seconds, float))):
            ax.plot(x, shown, color=f"C{i}", lw=1.2, label=label)
            if not (np.isfinite(losses[-1]) and losses[-1] <= top):
                ax.plot(x[-1], top, "x", color=f"C{i}", ms=8)
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

    ``rows`` are :func:`mgpu.async_sgd.traffic_per_worker` dicts (one per worker count), in bytes.
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
    (a black line over them), from :func:`mgpu.async_sgd.straggler_study`."""
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


# ---- Notebook 09: model and pipeline parallelism -------------------------------------------------


def pipeline_bubble(timelines: dict, sweep: list, name: str = "09_pipeline_bubble"):
    """Measured pipeline schedules and the bubble against the number of micro-batches.

    ``timelines`` maps a panel title to ``(stages, intervals)``, each interval a
    ``(stage, kind, micro_batch, start_s, end_s)`` tuple (kind "F" or "B"); ``sweep`` holds dicts with
    ``stages``, ``micro_batches`` and the measured ``idle`` fraction. The last panel draws the measured
    idle fractions as points and GPipe's (N - 1)/(M + N - 1) as lines, one colour per N.
    """
    fig, axes = plt.subplots(1, len(timelines) + 1, figsize=(4.6 * (len(timelines) + 1), 3.4),
                             gridspec_kw={"width_ratios": [1.3] * len(timelines) + [1]})
    for ax, (title, (stages, intervals)) in zip(axes, timelines.items()):
        start = min(i[3] for i in intervals)
        for stage, kind, micro, t0, t1 in intervals:
            colour = plt.cm.Blues(0.35 + 0.5 * (micro % 4) / 3) if kind == "F" else plt.cm.Oranges(0.35 + 0.5 * (micro % 4) / 3)
            ax.barh(stage, (t1 - t0) * 1e3, left=(t0 - start) * 1e3, height=0.7, color=colour, edgecolor="black", linewidth=0.3)
        ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
        ax.invert_yaxis()
        ax.set_xlabel("milliseconds since the step began")
        ax.set_title(title, fontsize=9)
    from matplotlib.patches import Patch

    axes[0].legend(handles=[Patch(color=plt.cm.Blues(0.6), label="forward"),
                            Patch(color=plt.cm.Oranges(0.6), label="backward (recomputes the forward)")],
                   fontsize=7, loc="lower right")
    ax = axes[-1]
    for i, n in enumerate(sorted({r["stages"] for r in sweep})):
        rows = sorted((r for r in sweep if r["stages"] == n), key=lambda r: r["micro_batches"])
        m = np.array([r["micro_batches"] for r in rows])
        grid = np.geomspace(m.min(), m.max(), 100)
        ax.plot(grid, (n - 1) / (grid + n - 1), color=f"C{i}", lw=1.2, label=f"N = {n}: (N-1)/(M+N-1)")
        ax.plot(m, [r["idle"] for r in rows], "o", color=f"C{i}", label=f"N = {n}: measured")
    ax.set_xscale("log", base=2)
    ax.set_xticks(m, [str(v) for v in m])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("idle fraction of the devices")
    ax.set_title("Measured idle fraction (points), GPipe's bubble (lines)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def hybrid_parallelism(replicas: int, stages: int, micro_batches: int, name: str = "09_hybrid_parallelism"):
    """Hybrid data + pipeline parallelism: a grid of replicas x stages devices, with what flows where."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig, ax = plt.subplots(figsize=(1.9 * replicas + 2.2, 1.1 * stages + 1.4))
    for r in range(replicas):
        for s in range(stages):
            x, y = 1.9 * r, -1.1 * s
            ax.add_patch(Rectangle((x, y), 1.3, 0.7, facecolor=plt.cm.tab10(s % 10), alpha=0.35, edgecolor="black"))
            ax.text(x + 0.65, y + 0.35, f"device {r * stages + s}\nstage {s}", ha="center", va="center", fontsize=7)
            if s + 1 < stages:
                ax.add_patch(FancyArrowPatch((x + 0.45, y), (x + 0.45, y - 0.4), arrowstyle="-|>", mutation_scale=8,
                                             color="tab:blue"))
                ax.add_patch(FancyArrowPatch((x + 0.85, y - 0.4), (x + 0.85, y), arrowstyle="-|>", mutation_scale=8,
                                             color="tab:orange"))
        ax.text(1.9 * r + 0.65, 0.95, f"replica {r}\n1/{replicas} of the batch,\n{micro_batches} micro-batches",
                ha="center", va="bottom", fontsize=7)
    for s in range(stages):
        y = -1.1 * s + 0.35
        ax.plot([1.3, 1.9 * (replicas - 1)], [y, y], color="tab:red", ls="--", lw=1)
    ax.plot([], [], color="tab:blue", label="activations (forward)")
    ax.plot([], [], color="tab:orange", label="their gradients (backward)")
    ax.plot([], [], color="tab:red", ls="--", label="all-reduce of one stage's gradients")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlim(-0.2, 1.9 * replicas)
    ax.set_ylim(-1.1 * stages + 0.9, 1.7)
    ax.axis("off")
    ax.set_title(f"{replicas} replicas x {stages} pipeline stages = {replicas * stages} devices", fontsize=9)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


# ---- Notebook 11


def prediction_call_times(table: dict, name: str = "11_prediction_calls"):
    """Milliseconds per prediction call against batch size, on linear axes: ``{device: {path: {batch: s}}}``.

    ``model.predict`` gets its own panel on the left: it is tens of times slower than the other paths.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    styles = ["-", "--", ":"]
    for d, (device, paths) in enumerate(table.items()):
        for path, row in paths.items():
            batches = sorted(row)
            ax = left if path == "model.predict" else right
            ax.plot(batches, [row[b] * 1e3 for b in batches], styles[d % len(styles)], marker="o",
                    label=f"{path} on {device}")
    for ax, title in ((left, "model.predict: a fixed cost per call"),
                      (right, "the same prediction without predict's machinery")):
        ax.set_xlabel("batch size (samples per call)")
        ax.set_ylabel("milliseconds per call")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def batching_delay_tradeoff(measured: dict, predicted: dict, throughput: dict, no_batching: dict,
                            name: str = "11_batching_delay"):
    """Mean latency (left, log scale) and throughput (right) against the batcher's delay, one colour per rate.

    ``measured``, ``predicted`` and ``throughput`` are ``{rate: {delay_ms: value}}`` (latencies in ms);
    ``no_batching`` is ``{rate: mean latency in ms without batching}``, drawn as a dotted level.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, rate in enumerate(sorted(measured)):
        colour = plt.cm.viridis(i / max(1, len(measured) - 1) * 0.85)
        delays = sorted(measured[rate])
        left.plot(delays, [measured[rate][d] for d in delays], "-o", color=colour, label=f"{rate:.0f} req/s, measured")
        if rate in predicted:
            left.plot(delays, [predicted[rate][d] for d in delays], "--", color=colour, label="queueing model")
        if rate in no_batching:
            left.axhline(no_batching[rate], color=colour, ls=":", lw=1)
        right.plot(delays, [throughput[rate][d] for d in delays], "-o", color=colour, label=f"{rate:.0f} req/s offered")
    left.plot([], [], "k:", lw=1, label="no batching (same colour)")
    left.set_yscale("log")
    left.set_ylabel("mean latency (ms, log scale)")
    left.set_title("Waiting adds to latency; without batching, the top load queues", fontsize=10)
    right.set_ylabel("requests answered per second")
    right.set_ylim(bottom=0)
    right.set_title("Throughput: requests answered per second against the rate sent", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("batcher's maximum queue delay (ms)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
