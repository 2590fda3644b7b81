"""The child process that executes one submission with papermill (started by :mod:`autograder.sandbox`).

``python -m autograder.execute INPUT OUTPUT PARAMETERS_JSON --result-fd N`` runs the notebook with
the parameters injected, the kernel's working folder being the notebook's folder, no per-cell
time-out (the grader's clock is the only limit) and a generous kernel start-up time. It never
raises: what happened goes to file descriptor N as one JSON object ``{"status", "message",
"notebook"}``, where status is ``ok``, ``cell_error`` (a cell raised; papermill stopped there),
``kernel_died`` or ``error``. The grader trusts only that pipe, not files in the folder the
student's code can write to.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _first_error(notebook) -> str:
    """``cell grade_id failed: Name: value`` of the first cell that stopped the run ('' if none).

    Cells tagged ``raises-exception`` (the grader tags the test cells so that one failing test does
    not stop the others) do not stop the run; their errors are scored by nbgrader.
    """
    for index, cell in enumerate(notebook.get("cells", [])):
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if output.get("output_type") == "error":
                name = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"#{index + 1}"
                value = str(output.get("evalue", "")).strip().splitlines()
                return f"cell {name} failed: {output.get('ename')}: {value[0] if value else ''}"[:400]
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.execute")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("parameters", help="JSON object of papermill parameters")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--start-timeout", type=int, default=180)
    args = parser.parse_args(argv)

    import nbformat
    import papermill
    from papermill.exceptions import PapermillExecutionError

    result = {"status": "ok", "message": "", "notebook": None}
    try:
        papermill.execute_notebook(
            args.input, args.output, parameters=json.loads(args.parameters), kernel_name="python3",
            cwd=str(Path(args.input).resolve().parent), progress_bar=False, log_output=False,
            execution_timeout=None, start_timeout=args.start_timeout)
    except PapermillExecutionError as error:
        result.update(status="cell_error", message=f"{error.ename}: {error.evalue}"[:400])
    except Exception as error:  # noqa: BLE001 - every failure is reported, none is raised
        name = type(error).__name__
        dead = "DeadKernel" in name or "dead" in str(error).lower()
        result.update(status="kernel_died" if dead else "error", message=f"{name}: {error}"[:400])
    if os.path.exists(args.output):
        try:
            notebook = nbformat.read(args.output, as_version=4)
            result["notebook"] = nbformat.writes(notebook)
            if result["status"] == "cell_error":
                stopped_by = _first_error(notebook)
                if stopped_by:
                    result["message"] = stopped_by
                else:  # only tagged test cells failed: every cell ran
                    result.update(status="ok", message="")
        except Exception as error:  # noqa: BLE001
            result.update(status="error", message=f"executed notebook unreadable: {error}"[:400])
    with os.fdopen(args.result_fd, "w") as pipe:
        json.dump(result, pipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
