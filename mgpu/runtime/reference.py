"""Reference measurements on a real GPU (``data/reference/``), for a notebook's GPU sentences on a
machine without one: each comes with the one line that says where it was measured.

A learner's own GPU measurement always takes precedence; these are shown instead of "skipped".
"""

from __future__ import annotations

import json
from functools import lru_cache

from mgpu.runtime import paths

REFERENCE_DIR = paths.ROOT / "data" / "reference"


@lru_cache(maxsize=None)
def load(name: str = "gpu_h100") -> dict:
    """The measurements in ``data/reference/<name>.json``."""
    path = REFERENCE_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no reference measurements at {path}: the course checkout is incomplete; "
                                "fetch it again (git checkout -- data/reference)")
    return json.loads(path.read_text())


def provenance(name: str = "gpu_h100") -> str:
    """One line: which GPU, which software, when (data/reference/README.md has the rest)."""
    ref = load(name)
    return (f"Reference numbers, not this machine's: one {ref['gpu']}, measured on 2026-11-26 with PyTorch "
            f"{ref['torch']} (data/reference/{name}.json).")


def call_costs(name: str = "gpu_h100", threads: int = 2) -> list[dict]:
    """Dense(2)'s prediction time per call by batch (microseconds): CPU with ``threads`` threads,
    GPU counting the copies, GPU with the input already on it."""
    rows = [r for r in load(name)["tiny_model"] if r["threads"] == threads]
    if not rows:
        raise ValueError(f"no tiny-model rows for {threads} threads in {name}")
    return [{"batch": r["batch"], "cpu_us": r["cpu_us"], "gpu_with_copies_us": r["gpu_with_copies_us"],
             "gpu_resident_us": r["gpu_resident_us"]} for r in rows]


def crossover(rows: list[dict], cpu: str, gpu: str) -> int | None:
    """The first batch of ``rows`` from which the GPU column is faster than the CPU column, or None
    (:func:`mgpu.runtime.measure.crossover_batch` on the two columns)."""
    from mgpu.runtime import measure

    return measure.crossover_batch({r["batch"]: r[cpu] for r in rows}, {r["batch"]: r[gpu] for r in rows})


def matmul_rows(name: str = "gpu_h100") -> list[dict]:
    """Square matmul TFLOP/s by size, one row per n: float32, float16 and bfloat16 (and TF32 where measured)."""
    rows: dict[int, dict] = {}
    for entry in load(name)["matmul"]:
        rows.setdefault(entry["n"], {"n": entry["n"]})[entry["dtype"]] = entry["tflops"]
    return [rows[n] for n in sorted(rows)]
