"""The figures' shared parts: what several lessons' ``figures`` modules draw with, and any figure that
two or more notebooks call. A figure one notebook calls lives in that lesson's ``figures``; every
figure is saved to ``build/figures/`` with :func:`mgpu.runtime.results.save_figure`."""

from __future__ import annotations

from mgpu.runtime.results import save_figure


def finish_log_log(fig, ax, name: str, xlabel: str, ylabel: str, title: str, legend_loc: str = "best"):
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
