"""The notebook's test cells, run again by the grader in a clean Python process of its own.

A submission's code runs in the same kernel as the notebook's test cells, so it could change
what they see: replace ``assessment.read_run_facts``, install an IPython handler that swallows
every exception, and so on. The grader therefore ignores the outputs the test cells had in the
student's kernel. It runs their locked source (from the gradebook, hidden tests included) here,
in a fresh interpreter into which no student code was ever loaded, with only the locked context
cells (parameters with the grader's values, set-up) before them, and writes these outputs into
the executed notebook for nbgrader to score.

``python -m autograder.checks SPEC.json`` prints one JSON list: ``{"grade_id", "passed", "ename",
"evalue", "stdout"}`` per test, in order. SPEC holds ``context`` (sources), ``parameters`` (name ->
value) and ``tests`` (``[{"grade_id", "source"}]``); the working folder is the run's folder.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
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


def run_tests(work: Path, parameters_source: str, parameters: dict, context: list[str], tests: list[dict],
              env: dict[str, str]) -> list[dict]:
    """Run ``tests`` in a new interpreter in ``work``; a crash or time-out fails every test, with why."""
    spec_path = Path(work).parent / f".checks-{Path(work).name}.json"
    spec_path.write_text(json.dumps({"context_before": parameters_source, "parameters": parameters,
                                     "context": context, "tests": tests}))
    try:
        done = subprocess.run([sys.executable, "-m", "autograder.checks", str(spec_path)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        results = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
        why = (done.stderr.strip().splitlines() or ["no output"])[-1] if results is None else ""
    except subprocess.TimeoutExpired:
        results, why = None, f"the grader's test pass took more than {TIMEOUT_S} s"
    except (ValueError, IndexError):
        results, why = None, "the grader's test pass printed no result"
    finally:
        spec_path.unlink(missing_ok=True)
    if results is None:
        return [{"grade_id": t["grade_id"], "passed": False, "ename": "GraderTestError",
                 "evalue": f"the test could not run: {why}"[:MAX_STDOUT], "stdout": ""} for t in tests]
    return results


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
