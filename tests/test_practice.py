"""``python -m autograder practice``: bad input and the summary (a real practice run is in test_calibration_e2e)."""

import os
import subprocess
import sys
from pathlib import Path


from autograder import practice

ROOT = Path(__file__).resolve().parents[1]


def _practice(*args, build_dir):
    env = dict(os.environ, MGPU_BUILD_DIR=str(build_dir))
    return subprocess.run([sys.executable, "-m", "autograder", "practice", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


# A notebook practised end to end through the command line, on a calibrated official row, with the
# real grader's reasons: tests/test_calibration_e2e.py.


def test_bad_input_gets_one_line_naming_the_fix(tmp_path):
    missing = _practice(tmp_path / "nowhere.ipynb", build_dir=tmp_path)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "pass the path of your assessment.ipynb" in missing.stderr
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert "is not a notebook" in _practice(text, build_dir=tmp_path).stderr
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{ not json")
    done = _practice(broken, build_dir=tmp_path)
    assert done.returncode == 2 and "not a readable notebook" in done.stderr
    unknown = _practice(broken, "--profile", "tpu", build_dir=tmp_path)
    assert unknown.returncode == 2 and "unknown profile 'tpu'" in unknown.stderr


def test_the_summary_says_what_the_grader_would_say():
    from autograder.grade import Verdict

    verdict = Verdict(student="you", assignment="assessment", submission_sha256="", passed=True, reasons=[],
                      accuracy=0.83, reached_seconds=41.0, profile="cpu", workers=2, target_accuracy=0.8,
                      time_budget_s=90, score=3, max_score=3, notebook_seconds=55, isolation="namespaces",
                      epochs=[{"epoch": 0, "seconds": 20.0, "accuracy": 0.64, "rejected": ""},
                              {"epoch": 1, "seconds": 31.0, "accuracy": None, "rejected": "a pickle"}])
    text = practice.summary(verdict)
    assert text.splitlines()[0] == "PASS on profile cpu (2 workers): every check held"
    assert "best 0.830, target 0.800 for two epochs in a row, reached at 41 s (budget 90 s)" in text
    assert "epoch 1: not measured at 31 s (rejected: a pickle)" in text
    assert text.endswith("practice only: no certificate, nothing recorded in the course's gradebook")
