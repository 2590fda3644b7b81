"""The notebook's test cells, run again by the grader in a clean Python process of its own.

A submission's code runs in the same kernel as the notebook's test cells, so it could change
what they see: replace ``assessment.read_run_facts``, install an IPython handler that swallows
every exception, and so on. The grader therefore ignores the outputs the test cells had in the
student's kernel. It runs their locked source (from the gradebook, hidden tests included) here,
in a fresh interpreter into which no student code was ever loaded, with only the locked context
cells (parameters with the grader's values, set-up) before them, and writes these outputs into
the executed notebook for nbgrader to score.

The pass treats everything the run left as hostile data. It runs inside the same sandbox as the
run (unprivileged, no network, the course hidden) with an allow-listed environment, in
``python -I`` (no current folder, user site or PYTHON* variable on the import path) from an empty
folder, so no module a run wrote can stand in for the grader's; it sees the data and only the
facts files the grader kept from the Horovod workers it started.

``python -m autograder.checks SPEC.json`` prints one JSON list: ``{"grade_id", "passed", "ename",
"evalue", "stdout"}`` per test, in order. SPEC holds ``context`` (sources), ``parameters`` (name ->
value) and ``tests`` (``[{"grade_id", "source"}]``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

#: Longest a clean test pass may take (the tests read a few small JSON files).
TIMEOUT_S = 120
MAX_STDOUT = 4000


def _run(spec: dict) -> list[dict]:
    namespace: dict = {"__name__": "__main__"}
    context = io.StringIO()
    with contextlib.redirect_stdout(context), contextlib.redirect_stderr(context):
        exec(compile(spec["context_before"], "<parameters>", "exec"), namespace)
        for name, value in spec["parameters"].items():
            namespace[name] = value
        for index, source in enumerate(spec["context"]):
            exec(compile(source, f"<context {index}>", "exec"), namespace)
    results = []
    for test in spec["tests"]:
        out = io.StringIO()
        result = {"grade_id": test["grade_id"], "passed": True, "ename": "", "evalue": "", "stdout": ""}
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                exec(compile(test["source"], f"<{test['grade_id']}>", "exec"), namespace)
        except Exception as error:  # noqa: BLE001 - a failing test is a result, not a crash
            result.update(passed=False, ename=type(error).__name__, evalue=str(error)[:MAX_STDOUT])
        result["stdout"] = out.getvalue()[:MAX_STDOUT]
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    print(json.dumps(_run(spec)))
    return 0


def run_tests(folder: Path, parameters_source: str, parameters: dict, context: list[str], tests: list[dict],
              *, hide=(), work_parent: Path | None = None, isolate: bool = True) -> list[dict]:
    """Run ``tests`` in a fresh sandboxed interpreter; a crash or time-out fails every test, with why.

    ``folder`` is a folder of the grader's holding what the tests may read; the pass starts in its
    empty subfolder ``empty/``.
    """
    from autograder import isolation, sandbox

    folder = Path(folder)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps({"context_before": parameters_source, "parameters": parameters,
                                     "context": context, "tests": tests}))
    env = isolation.run_environment(folder / "empty", "checks")
    code, stdout, stderr = sandbox.run_isolated(isolation.trusted_python("autograder.checks", str(spec_path)),
                                                folder, cwd=folder / "empty", timeout_s=TIMEOUT_S, env=env, hide=hide,
                                                work_parent=work_parent, isolate=isolate)
    results, why = None, ""
    if code is None:
        why = f"the grader's test pass took more than {TIMEOUT_S} s"
    elif code != 0:
        why = (stderr.strip().splitlines() or ["no output"])[-1]
    else:
        try:
            results = json.loads(stdout.strip().splitlines()[-1])
            if not (isinstance(results, list) and [r.get("grade_id") for r in results]
                    == [t["grade_id"] for t in tests]):
                results, why = None, "the grader's test pass printed no result"
        except (ValueError, IndexError, AttributeError):
            why = "the grader's test pass printed no result"
    if results is None:
        return [{"grade_id": t["grade_id"], "passed": False, "ename": "GraderTestError",
                 "evalue": f"the test could not run: {why}"[:MAX_STDOUT], "stdout": ""} for t in tests]
    return results


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
