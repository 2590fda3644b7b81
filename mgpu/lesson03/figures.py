"""Notebook 03's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


def _readable_log_axis(axis):
    """Ticks at 1, 2 and 5 times each power of ten, written as plain numbers, on a log axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_locator(NullLocator())


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
    from mgpu.lesson03.pipeline import FED

    # The float32 model's ceiling (timed beside every stage; a stage that changes the model times it as well).
    # A simulated accelerator has one rate; a real one is timed anew beside each stage, so the line is their median.
    ceilings = [r.reference_rate if r.reference_rate is not None else r.ceiling_rate for r in shown]
    ceiling = float(np.median(ceilings))
    ax.axvline(ceiling, color="tab:red", linestyle="--",
               label=f"{ceiling_label} ({ceiling:,.0f}/s)" if len(set(ceilings)) == 1 else
               f"{ceiling_label}, median over the stages ({ceiling:,.0f}/s)")
    ax.axvline(FED * ceiling, color="tab:red", linestyle=":", linewidth=1,
               label=f"fed: {FED:g}x of it or more")
    for yi, r in zip(y, shown):
        ax.text(r.train_rate, yi - 0.2, f" {r.fraction_of_reference:.2f}x", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    _readable_log_axis(ax.xaxis)
    ax.set_xlabel("images per second (log scale)")
    ax.set_title("Each stage of the input pipeline against the ceiling\n"
                 f"(the number beside each blue bar: training / the {ceiling_label}'s rate)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    height = 0.55 * len(shown) + 2.3
    fig.set_figheight(height)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1))  # the legend below the axes, clear of the bars
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
    _readable_log_axis(ax.yaxis)
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
                    label=f"{device}, Dense({width}) + Dense(2)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _readable_log_axis(ax.xaxis)
    _readable_log_axis(ax.yaxis)
    low, high = ax.get_ylim()
    if high / low < 10:  # less than a decade: widen it so that at least two ticks show
        middle = (low * high) ** 0.5
        ax.set_ylim(middle / 4, middle * 4)
    # finish_log_log's ending, after the scales are set (setting a scale again would reset the ticks)
    ax.set_xlabel("batch size (samples per call)")
    ax.set_ylabel("milliseconds per training call")
    ax.set_title("Tiny models: a fixed cost per call dominates", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig
