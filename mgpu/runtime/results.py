"""A notebook's headline numbers and figures, written where runs can be compared.

Each notebook writes one flat JSON file, ``build/results/<notebook-stem>.json``, that always records
the dataset fingerprint (or null when the notebook used no dataset), the ``smoke`` flag, the
``seed`` and, for a notebook of the course, ``prose_words`` (the words of its markdown cells, the
course's budget); figures go to ``build/figures/``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mgpu.runtime import paths


def prose_words(notebook: str | os.PathLike) -> int:
    """The words of a notebook's prose: its markdown cells, without fenced code blocks."""
    import nbformat

    words = 0
    for cell in nbformat.read(notebook, as_version=4).cells:
        if cell.cell_type != "markdown":
            continue
        fenced = False
        for line in cell.source.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                words += len(line.split())
    return words


def _flat_value(key: str, value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity
    if isinstance(value, dict):
        if not all(isinstance(v, (int, float, str, bool, type(None))) for v in value.values()):
            raise ValueError(f"results[{key!r}]: an object may only hold plain numbers, strings or null")
        return {str(k): _flat_value(key, v) for k, v in value.items()}
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if not isinstance(value, (int, float, str, bool, type(None))):
        raise ValueError(f"results[{key!r}] is a {type(value).__name__}: use numbers, strings, bools, "
                         "null or a one-level object")
    return value


def write_results(stem: str, values: dict[str, Any], *, dataset=None, smoke: bool, seed: int) -> Path:
    """Write ``build/results/<stem>.json`` atomically and return its path.

    ``dataset`` is a :class:`mgpu.runtime.data.Dataset` (its name and fingerprint are recorded) or None.
    """
    record = {
        "notebook": stem,
        "dataset": getattr(dataset, "name", None),
        "dataset_fingerprint": getattr(dataset, "fingerprint", None),
        "smoke": bool(smoke),
        "seed": int(seed),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    notebook = paths.ROOT / "notebooks" / f"{stem}.ipynb"
    if notebook.is_file():
        record["prose_words"] = prose_words(notebook)
    for key, value in values.items():
        if key in record:
            raise ValueError(f"results key {key!r} is reserved")
        record[key] = _flat_value(key, value)
    folder = paths.results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stem}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, target)
    return target


def save_figure(fig, name: str) -> Path:
    """Save a matplotlib figure as ``build/figures/<name>.png`` (and keep showing it inline)."""
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.png"
    fig.savefig(target, dpi=120, bbox_inches="tight")
    return target
