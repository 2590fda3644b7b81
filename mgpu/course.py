"""Execute the course's notebooks headless with papermill, as `make course` and the tests do.

``python -m mgpu.course [--smoke] [--seed N] [NOTEBOOK ...]`` runs every notebook in
``notebooks/`` (or the ones named) with its ``smoke`` and ``seed`` parameters set, writes the
executed copies to ``build/notebooks/`` and prints how long each took. Each notebook writes its own
figures and ``build/results/<stem>.json``.

``python -m mgpu.course --check --seeds 0 1`` (``make course-check``) is the course's own test of
the setting learners run: every notebook for every seed, each seed in its own build folder
(``build/course-check/seed<N>/``), carrying on past a failure. A notebook fails on an exception
(a check that did not hold raises) or on a printed ``FAILED`` line. It prints one table (notebook
by seed: seconds, or the failure), writes it to ``build/course-check/table.md`` and exits 1 if
anything failed.
"""

from __future__ import annotations

import argparse
import os
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


def printed_failures(executed: Path) -> list[str]:
    """The lines an executed notebook printed that report a failure (``FAILED``), in order."""
    import nbformat

    lines = []
    for cell in nbformat.read(executed, as_version=4).cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                lines += [line.strip() for line in output.get("text", "").splitlines() if "FAILED" in line]
    return lines


def check(notebooks: list[Path], seeds: list[int], *, smoke: bool) -> int:
    """Run every notebook for every seed, carry on past failures, print and save the table."""
    root = paths.build_dir() / "course-check"
    cells: dict[str, dict[int, str]] = {nb.stem: {} for nb in notebooks}
    failed = 0
    saved = os.environ.get("MGPU_BUILD_DIR")
    try:
        for seed in seeds:
            os.environ["MGPU_BUILD_DIR"] = str(root / f"seed{seed}")  # the kernels inherit it
            for notebook in notebooks:
                print(f"== seed {seed}: {notebook.name} (smoke={smoke})", flush=True)
                started = time.monotonic()
                try:
                    executed = run_notebook(notebook, smoke=smoke, seed=seed, progress=False)
                    problem = next(iter(printed_failures(executed)), None)
                except Exception as error:  # papermill's error ends with the failing cell's exception
                    text = str(error).strip()
                    problem = text.splitlines()[-1] if text else type(error).__name__
                seconds = time.monotonic() - started
                failed += problem is not None
                cells[notebook.stem][seed] = f"{seconds:.0f} s" + (f", FAILED: {problem[:200]}" if problem else "")
                print(f"   {cells[notebook.stem][seed]}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("MGPU_BUILD_DIR", None)
        else:
            os.environ["MGPU_BUILD_DIR"] = saved
    table = ["| notebook | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|" + "---|" * len(seeds)]
    table += [f"| {stem} | " + " | ".join(row[s] for s in seeds) + " |" for stem, row in cells.items()]
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(["", *table, "", f"{failed} failed; executed copies under {root}/seed<N>/notebooks/"]))
    return 1 if failed else 0


def by_number(name: str) -> Path:
    """A notebook named by its number ("03", "3") or by its path."""
    if name.isdigit():
        found = [p for p in course_notebooks() if p.name.startswith(f"{int(name):02d}_")]
        if found:
            return found[0]
    return Path(name).resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.course", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="paths, or numbers such as 03 (default: every notebook)")
    parser.add_argument("--smoke", action="store_true", help="the few-minutes setting (CI)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true",
                        help="run every notebook for each of --seeds, carry on past failures, print a table")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="with --check (default: 0 1)")
    args = parser.parse_intermixed_args(argv)  # notebooks may come before or after the options
    notebooks = [by_number(name) for name in args.notebooks] or course_notebooks()
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.check:
        return check(notebooks, args.seeds, smoke=args.smoke)
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
