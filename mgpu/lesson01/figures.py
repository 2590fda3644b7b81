"""Notebook 01's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.plotting import finish_log_log
from mgpu.runtime.results import save_figure


_RUN_COLOURS = ("black", "tab:red", "tab:orange", "tab:green", "tab:blue", "tab:purple")


def _run_label(batch_size: int, n: int) -> str:
    if batch_size >= n:
        return f"GD (batch {n})"
    return "SGD, batch 1" if batch_size == 1 else f"minibatch {batch_size}"


def _parameter_grid(x, y, centre, half_width, points=160):
    from mgpu.lesson01 import sgd

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
    # A large batch's path and cloud lie almost on GD's: GD's path goes under the others, wide, and on the
    # zoom GD is a hollow circle with the largest minibatch's small cloud drawn over it.
    order = sorted(zip(runs, _RUN_COLOURS), key=lambda pair: pair[0].batch_size)
    largest_sgd = max((run.batch_size for run in runs if run.batch_size < n), default=None)
    for run, colour in order:
        label = _run_label(run.batch_size, n)
        gd = run.batch_size >= n
        axes[0].plot(run.params[:, 0], run.params[:, 1], color=colour, linewidth=3.0 if gd else 0.9,
                     alpha=1.0 if gd else 0.8, zorder=2 if gd else 3, label=label)
        if gd:
            axes[1].scatter(run.params[late:, 0], run.params[late:, 1], s=60, facecolors="none",
                            edgecolors=colour, linewidths=1.2, zorder=2.5)
        else:
            top = run.batch_size == largest_sgd
            axes[1].scatter(run.params[late:, 0], run.params[late:, 1], s=3, color=colour,
                            alpha=0.9 if top else 0.5, zorder=3 if top else 2)
        axes[1].plot([], [], marker="o", color=colour, markerfacecolor="none" if gd else colour,
                     linestyle="none", markersize=5, label=label)
    axes[0].plot(*optimum, marker="*", color="gold", markeredgecolor="black", markersize=14,
                 linestyle="none", label="minimum")
    axes[1].plot(*optimum, marker="+", color="black", markersize=16, mew=0.8, linestyle="none",
                 zorder=2.6, label="minimum")
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
    # Below float64's rounding of L the excess loss is 0 or noise: drawn on that level, not left off the log axis.
    rounding = np.finfo(float).eps * abs(optimum_loss)
    for run, colour in zip(runs, _RUN_COLOURS):
        excess = np.maximum(run.losses - optimum_loss, rounding)
        label = _run_label(run.batch_size, n)
        axes[0].plot(np.arange(len(excess)), excess, color=colour, linewidth=1, label=label)
        axes[1].plot(np.maximum(run.examples, 1), excess, color=colour, linewidth=1, label=label)
    for ax in axes:
        ax.axhline(rounding, color="tab:gray", linestyle=":", linewidth=1,
                   label="rounding of L: lower values drawn on it" if ax is axes[0] else None)
        ax.set_yscale("log")
        ax.set_ylabel("excess loss L(w, b) - L*")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("parameter updates")
    axes[0].set_title("Excess loss per update", fontsize=10)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("examples whose gradient was computed (log scale)")
    axes[1].set_title("Excess loss per example processed", fontsize=10)
    axes[0].legend(fontsize=8, loc="center right")
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
    ax.set_ylabel("E[f(θ_t)]  (mean over chains)")
    ax.set_title(f"f = h θ²/2, batch {batch_size}: fast descent, then a floor set by the step", fontsize=10)
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
    return finish_log_log(fig, ax, name, "predicted E[f] = step·s² / (2B(2 - step·h))",
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
    return finish_log_log(fig, ax, name, "SGD step t", "E[f(θ_t)]  (mean over chains)",
                           "A decaying step keeps improving, as O(1/t)", "lower left")


def saddle_escape(gd_path, sgd_paths, sgd_final, name: str = "01_saddle"):
    """GD and SGD paths on x² + y⁴/4 - y²/2 from (1, 0), and where the SGD runs ended."""
    from mgpu.lesson01 import sgd

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
    ax.axvline(gd_path[-1, 0, 1], color="black", linewidth=2.5, label="GD (one run, no noise)")
    ax.set_xlabel("final y")
    ax.set_ylabel("runs")
    ax.set_title("Where the runs ended", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
