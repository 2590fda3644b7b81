"""Notebook 09's figures, one call each; every figure is also saved to ``build/figures/``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from mgpu.runtime.results import save_figure


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

    fig.legend(handles=[Patch(color=plt.cm.Blues(0.6), label="forward"),
                        Patch(color=plt.cm.Oranges(0.6), label="backward (recomputes the forward)"),
                        Patch(color="white", label="shade, light to dark: micro-batch 0, 1, 2, 3, then again")],
               fontsize=7, loc="lower left", ncol=3)  # below the panels: inside one it hides bars
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
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_figure(fig, name)
    return fig


def _label_bars(ax, bars: list, fontsize: float = 6.5) -> None:
    """Write each bar's micro-batch number inside it: across if it fits, upright if only that fits, else
    not at all (numbers of narrow bars would run together). ``bars``: ``(row, left_ms, width_ms, text)``."""
    ax.figure.canvas.draw()  # the axes' final size, to convert milliseconds to points
    x0, x1 = ax.get_xlim()
    points_per_ms = ax.get_window_extent().width * 72 / ax.figure.dpi / (x1 - x0)
    for row, left, width, text in bars:
        room = width * points_per_ms
        if room >= 0.62 * fontsize * len(text) + 1.5:
            ax.text(left + width / 2, row, text, ha="center", va="center", fontsize=fontsize)
        elif room >= 0.8 * fontsize:
            ax.text(left + width / 2, row, text, ha="center", va="center", fontsize=fontsize - 1, rotation=90)


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


def pipeline_schedules(timelines: dict, rows: list, stages: int, name: str = "09_pipeline_schedules"):
    """GPipe and 1F1B side by side: measured timelines, then the idle fraction against M for both schedules.

    ``timelines`` maps a panel title to a list of ``Interval``-like objects (``stage``, ``kind``,
    ``micro_batch``, ``start``, ``end``); ``rows`` holds dicts with ``schedule``, ``micro_batches``, ``idle``
    (on the modelled device) and ``stashed`` (the peak over stages). The last panel draws the measured idle
    fractions (points) and (N - 1)/(M + N - 1) (line), and the peak of stashed micro-batches (bars, right axis)."""
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(1, len(timelines) + 1, figsize=(4.6 * (len(timelines) + 1), 3.4),
                             gridspec_kw={"width_ratios": [1.3] * len(timelines) + [1]})
    labels = {}  # written once the layout is final: whether a number fits depends on the axes' size
    for ax, (title, intervals) in zip(axes, timelines.items()):
        for i in intervals:
            shade = 0.35 + 0.5 * (i.micro_batch % 4) / 3
            colour = plt.cm.Blues(shade) if i.kind == "F" else plt.cm.Oranges(shade)
            ax.barh(i.stage, (i.end - i.start) * 1e3, left=i.start * 1e3, height=0.7, color=colour,
                    edgecolor="black", linewidth=0.3)
            labels.setdefault(ax, []).append((i.stage, i.start * 1e3, (i.end - i.start) * 1e3, str(i.micro_batch)))
        ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
        ax.invert_yaxis()
        ax.set_xlabel("milliseconds since the step began")
        ax.set_title(title, fontsize=9)
    fig.legend(handles=[Patch(color=plt.cm.Blues(0.6), label="forward"),
                        Patch(color=plt.cm.Oranges(0.6), label="backward"),
                        Patch(color="white", label="shade, light to dark: micro-batch 0, 1, 2, 3, then again; its number where it fits")],
               fontsize=7, loc="lower left", ncol=3)
    ax = axes[-1]
    ms = sorted({r["micro_batches"] for r in rows})
    grid = np.geomspace(min(ms), max(ms), 100)
    ax.plot(grid, (stages - 1) / (grid + stages - 1), color="black", lw=1.2, label="(N-1)/(M+N-1)")
    twin = ax.twinx()
    for i, schedule in enumerate(sorted({r["schedule"] for r in rows})):
        mine = sorted((r for r in rows if r["schedule"] == schedule), key=lambda r: r["micro_batches"])
        beside = 0.88 if i == 0 else 1.12  # each schedule's point above its own bar: equal idles stay visible
        ax.plot([r["micro_batches"] * beside for r in mine], [r["idle"] for r in mine], "os"[i % 2], color=f"C{i}",
                label=f"{schedule}: measured idle", zorder=3)
        twin.bar([r["micro_batches"] * beside for r in mine], [r["stashed"] for r in mine],
                 width=[0.2 * r["micro_batches"] for r in mine], color=f"C{i}", alpha=0.25,
                 label=f"{schedule}: most stashed")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(v) for v in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("idle fraction (points)")
    twin.set_ylabel("most stashed on a stage (bars)")
    ax.set_title(f"N = {stages} stages on the modelled device", fontsize=9)
    handles = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=6, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    for labelled, bars in labels.items():
        _label_bars(labelled, bars)
    save_figure(fig, name)
    return fig
