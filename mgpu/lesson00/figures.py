"""Notebook 00's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


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
