"""Read and summarise a Horovod timeline (``HOROVOD_TIMELINE=path horovodrun ...``).

Horovod writes the timeline as a Chrome trace: a JSON list of events, one "process" (``pid``) per
tensor it reduces, with ``B``/``E`` (begin/end) events for each activity the tensor goes through:
``NEGOTIATE_ALLREDUCE`` (waiting until every rank has the tensor ready), ``ALLREDUCE`` and, nested in
it, ``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE`` (or ``NCCL_ALLREDUCE``), ``MEMCPY_OUT_FUSION_BUFFER``.
A run that is stopped leaves the list unterminated; :func:`load_events` accepts that. The file opens
in chrome://tracing or https://ui.perfetto.dev.

:func:`summarize` gives, per activity, the number of occurrences, the time summed over tensors and
the wall-clock time during which at least one tensor was in it (tensors fused together overlap, so
the sum over tensors counts the same second several times).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


def load_events(path) -> list[dict]:
    """The trace's events; tolerates the missing ``]`` and trailing comma of an unfinished file."""
    text = Path(path).read_text().strip()
    if not text:
        return []
    text = text.rstrip(",")
    if not text.endswith("]"):
        text = text.rstrip().rstrip(",") + "]"
    return json.loads(text)


@dataclass
class Activity:
    name: str
    count: int
    summed_s: float   # over tensors
    wall_s: float     # union of the intervals


def intervals(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Begin/end pairs (seconds) per activity name, matched per tensor with a stack (they nest)."""
    stacks: dict[int, list[tuple[str, float]]] = {}
    found: dict[str, list[tuple[float, float]]] = {}
    for event in sorted((e for e in events if e.get("ph") in ("B", "E")), key=lambda e: e["ts"]):
        stack = stacks.setdefault(event["pid"], [])
        if event["ph"] == "B":
            stack.append((event["name"], event["ts"] / 1e6))
        elif stack:
            name, start = stack.pop()
            found.setdefault(name, []).append((start, event["ts"] / 1e6))
    for event in events:
        if event.get("ph") == "X" and event.get("dur", 0) > 0:
            found.setdefault(event["name"], []).append((event["ts"] / 1e6, (event["ts"] + event["dur"]) / 1e6))
    return found


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(path_or_events, before: str | None = None) -> dict:
    """``{"span_s", "tensors", "activities": [Activity, ...]}`` sorted by wall time, largest first.

    ``before`` names an activity (``"NEGOTIATE_ALLGATHER"``, say): only the events that began before
    its first occurrence count, so what a script does after training stays out of the summary.
    """
    events = path_or_events if isinstance(path_or_events, list) else load_events(path_or_events)
    if before is not None:
        starts = [e["ts"] for e in events if e.get("name") == before and e.get("ph") in ("B", "X")]
        if starts:
            cut = min(starts)
            events = [e for e in events if "ts" not in e or e["ts"] < cut]
    found = intervals(events)
    stamps = [e["ts"] for e in events if "ts" in e]
    span = (max(stamps) - min(stamps)) / 1e6 if stamps else 0.0
    tensors = {e["pid"] for e in events if e.get("ph") in ("B", "E")}
    activities = [Activity(name, len(spans), sum(b - a for a, b in spans), _union_length(spans))
                  for name, spans in found.items()]
    activities.sort(key=lambda a: -a.wall_s)
    return {"span_s": span, "tensors": len(tensors), "activities": activities}


#: The activities in which a collective library runs an all-reduce, one per backend.
ALLREDUCE_ACTIVITIES = ("NCCL_ALLREDUCE", "GLOO_ALLREDUCE", "MPI_ALLREDUCE", "CCL_ALLREDUCE")


def collective_calls(path_or_events, activity: str | None = None) -> int:
    """How many times Horovod ran ``activity`` (``GLOO_ALLREDUCE``, ``NCCL_ALLREDUCE``...), fused tensors once.

    Tensors fused into one buffer go through one call together: Horovod begins the activity for every
    one of them before it ends it for any, so their intervals overlap, while separate calls follow one
    another. The count is the number of groups of overlapping intervals. Without ``activity``, the
    first of :data:`ALLREDUCE_ACTIVITIES` the trace holds."""
    events = path_or_events if isinstance(path_or_events, list) else load_events(path_or_events)
    found = intervals(events)
    if activity is None:
        activity = next((a for a in ALLREDUCE_ACTIVITIES if a in found), ALLREDUCE_ACTIVITIES[1])
    calls, end = 0, float("-inf")
    for start, stop in sorted(found.get(activity, [])):
        if start >= end:
            calls += 1
        end = max(end, stop)
    return calls
