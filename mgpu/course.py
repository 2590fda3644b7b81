"""Execute the course's notebooks headless with papermill, as `make course` and the tests do.

``python -m mgpu.course [--smoke] [--seed N] [NOTEBOOK ...]`` runs every notebook in
``notebooks/`` (or the ones named) with its ``smoke`` and ``seed`` parameters set, writes the
executed copies to ``build/notebooks/`` and prints how long each took. Each notebook writes its own
figures and ``build/results/<stem>.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mgpu import paths

NOTEBOOKS_DIR = paths.ROOT / "notebooks"


def course_notebooks() -> list[Path]:
    """The course's notebooks in the order a learner takes them."""
    return sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def run_notebook(notebook: Path, *, smoke: bool, seed: int = 0, output_dir: Path | None = None,
                 parameters: dict | None = None, progress: bool = True) -> Path:
    """Execute one notebook with papermill; returns the executed copy's path.

    Raises papermill's PapermillExecutionError (with the failing cell) when a cell fails.
    """
    import papermill

    output_dir = output_dir or paths.build_dir() / "notebooks"
    output_dir.mkdir(parents=True, exist_ok=True)
    output = output_dir / notebook.name
    papermill.execute_notebook(
        str(notebook), str(output),
        parameters={"smoke": smoke, "seed": seed, **(parameters or {})},
        kernel_name="python3", cwd=str(notebook.parent), progress_bar=progress,
        log_output=False,
    )
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.course", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in notebooks/")
    parser.add_argument("--smoke", action="store_true", help="the few-minutes setting (CI)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    notebooks = [p.resolve() for p in args.notebooks] or course_notebooks()
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    timings = []
    for notebook in notebooks:
        print(f"== {notebook.name} (smoke={args.smoke}, seed={args.seed})", flush=True)
        started = time.monotonic()
        try:
            output = run_notebook(notebook, smoke=args.smoke, seed=args.seed)
        except Exception as error:  # papermill's errors name the failing cell
            print(f"FAILED {notebook.name} after {time.monotonic() - started:.0f} s: "
                  f"{str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__}"
                  f"\n  executed copy with the error: {paths.build_dir() / 'notebooks' / notebook.name}",
                  file=sys.stderr)
            return 1
        timings.append((notebook.name, time.monotonic() - started))
        print(f"   done in {timings[-1][1]:.0f} s -> {output}", flush=True)
    print("\n".join(["", "notebook                          seconds"]
                    + [f"{name:<33} {seconds:7.0f}" for name, seconds in timings]))
    print(f"results: {paths.results_dir()}  figures: {paths.figures_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
