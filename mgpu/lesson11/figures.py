"""Notebook 11's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt

from mgpu.runtime.results import save_figure


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
        top = max((y for line in ax.get_lines() for y in line.get_ydata()), default=1.0)
        ax.set_ylim(0, 1.3 * top)  # room above the highest line for the legend
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper right" if ax is left else "best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, name)
    return fig


def batching_delay_tradeoff(measured: dict, predicted: dict, throughput: dict, no_batching: dict,
                            name: str = "11_batching_delay", sent: dict | None = None):
    """Mean latency (left, log scale) and throughput (right) against the batcher's delay, one colour per rate.

    ``measured``, ``predicted`` and ``throughput`` are ``{rate: {delay_ms: value}}`` (latencies in ms);
    ``no_batching`` is ``{rate: mean latency in ms without batching}``, drawn as a dotted level; ``sent``,
    ``{rate: requests per second actually sent}``, is drawn as a dashed level on the right.
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
        right.plot(delays, [throughput[rate][d] for d in delays], "-o", color=colour,
                   label=f"rate {rate:.0f} req/s" + (f", {sent[rate]:.0f} sent (dashed)" if sent and rate in sent else ""))
        if sent and rate in sent:
            right.axhline(sent[rate], color=colour, ls="--", lw=1)
    left.plot([], [], "k:", lw=1, label="no batching (same colour)")
    left.set_yscale("log")
    left.set_ylabel("mean latency (ms, log scale)")
    left.set_title("Latency against the batching delay; without batching, the top load queues", fontsize=10)
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
