"""From calibration to a certificate anyone can check: an official row calibrated on a real dataset
(a small fixture registered as real Fashion-MNIST inside this test only), a reference and an
unconverted submission graded on it, the reference's certificate verified from the command line and
in the browser page, a changed field, a flipped signature byte and a revocation caught by both, and
the row refused on other hardware."""

import base64
import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder import calibrate, certificates, certify, cohort, practice, verify_page
from autograder import course as course_mod
from autograder import grade as grading
from mgpu.runtime import data, synthetic
from test_verify_page import CHROMIUM, _open, browser_root  # noqa: F401  (browser_root: a fixture)

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(train_images=3000, val_images=500, test_images=1000)  # half the cpu row's: CI time


def _idx_gz(path: Path, array: np.ndarray) -> str:
    """``array`` as a gzip-compressed IDX file (Fashion-MNIST's format); its SHA-256."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes(), mtime=0))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def real_fixture(tmp_path, monkeypatch):
    """Generated images written as Fashion-MNIST's four files, registered as the official ones here only."""
    monkeypatch.setenv("MGPU_DATA_DIR", str(tmp_path / "data"))
    folder = tmp_path / "data" / "fashion_mnist"
    folder.mkdir(parents=True)
    x_train, y_train, x_test, y_test = synthetic.generate(seed=3)
    files = []
    for (name, url, _), array in zip(data.OFFICIAL_FILES["fashion_mnist"], (x_train, y_train, x_test, y_test)):
        files.append((name, url, _idx_gz(folder / name, array)))
    monkeypatch.setitem(data.OFFICIAL_FILES, "fashion_mnist", files)
    dataset = data.load("fashion_mnist", verbose=False)
    assert dataset.real and dataset.fingerprint.startswith("fashion_mnist:")
    return dataset


def _verify_cli(course_dir: Path, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", "verify", str(path), "--course", str(course_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_calibrate_grade_certify_and_verify_on_a_real_dataset(tmp_path, real_fixture, browser_root):
    course = course_mod.copy_course(tmp_path / "course")
    subprocess.run([sys.executable, "-m", "autograder", "keys", "init", "--course", str(course.root)], cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    # 1. Calibrate an official row: two reference runs through the real grader.
    row, path = calibrate.calibrate(course.root, "gpu", 2, "fashion_mnist", 2, **SIZES, log=lambda *a, **k: None)
    assert path == calibrate.rows_path(course.root) and row["official"] is True
    runs = row["calibration"]["runs"]
    assert len(runs) == 2 and all(r["reached_target_s"] > 0 for r in runs)
    assert row["target_accuracy"] <= min(r["streak_accuracy"] for r in runs) - 0.02 + 1e-9
    slowest = max(r["reached_target_s"] for r in runs)
    assert row["time_budget_s"] >= max(1.5 * slowest, slowest + calibrate.START_SLACK_S)
    assert row["calibration"]["dataset"] == {"name": "fashion_mnist", "fingerprint": real_fixture.fingerprint,
                                             "real": True}
    assert json.loads(path.read_text())["rows"] == [row]

    # 2. Grade a reference submission on it, and practise an unconverted one on it (practice is the same
    # grading, in a private copy of the course).
    profile, calibration = calibrate.resolve_profile(course.root, "gpu", 2)
    assert profile.official and calibration == row["calibration"] and "calibrated on" in profile.calibration
    notebooks = cohort.demo_notebooks(course.root)
    folder = course.root / "submitted" / "reference" / "assessment"
    folder.mkdir(parents=True)
    nbformat.write(notebooks["reference"], folder / "assessment.ipynb")
    [verdict] = grading.grade_course(course.root, "assessment", profile, progress=False, log=lambda *a, **k: None)
    assert verdict.passed, (verdict.reason, verdict.epochs, runs)
    assert verdict.calibration == profile.calibration
    nbformat.write(notebooks["unconverted"], tmp_path / "unconverted.ipynb")
    practised = practice.practice(tmp_path / "unconverted.ipynb", profile, work_root=tmp_path / "practice",
                                  log=lambda *a, **k: None)  # in this process: the real-data fixture is registered here
    said = practice.summary(practised)
    assert not practised.passed and said.startswith("FAIL on profile gpu (2 workers): ")
    for words in cohort.EXPECTED["unconverted"][1]:  # the reasons the real grader gives it
        assert words in said, said
    assert said.endswith("practice only: no certificate, nothing recorded in the course's gradebook")
    assert list((tmp_path / "practice").iterdir()) == []  # the private copy is gone

    # 3. Certify: the reference only, carrying the row's calibration.
    assert certify.issue_certificates(course.root, "assessment", profile, log=lambda *a: None) == ["reference"]
    record = json.loads((course.root / "autograder" / "assessment" / "reference.json").read_text())
    folder = course.root / "autograder" / "assessment" / "certificates"
    genuine = folder / f"{record['certificate']}.json"
    document = json.loads(genuine.read_text())
    assert document["certificate"]["calibration"] == profile.calibration
    assert document["certificate"]["dataset_fingerprint"] == real_fixture.fingerprint

    # 4. Verified from the command line and in the page; one change, one flipped byte, a revocation caught by both.
    changed = json.loads(genuine.read_text())
    changed["certificate"]["time_budget_s"] += 60.0
    flipped = json.loads(genuine.read_text())
    signature = bytearray(base64.b64decode(flipped["signature"]))
    signature[5] ^= 0x01
    flipped["signature"] = base64.b64encode(bytes(signature)).decode()
    cases = {"genuine": genuine}
    for name, doc in (("changed", changed), ("flipped", flipped)):
        cases[name] = tmp_path / f"{name}.json"
        cases[name].write_text(json.dumps(doc, indent=2))
    cli = {name: _verify_cli(course.root, p) for name, p in cases.items()}
    assert cli["genuine"].returncode == 0 and cli["genuine"].stdout.startswith("VALID: ")
    assert "calibrated on" in cli["genuine"].stdout
    for name in ("changed", "flipped"):
        assert cli[name].returncode == 1 and "INVALID: the signature does not match" in cli[name].stdout
    public_key = certificates.load_public_key(course.root / ".keys" / certificates.PUBLIC_KEY_FILE)
    page = verify_page.write_page(tmp_path / "verify.html", public_key, {})
    expected = {"genuine": "valid", "changed": "tampered", "flipped": "tampered"}
    if CHROMIUM:  # the page must agree where a browser is installed (.ci/run installs one)
        for name, p in cases.items():
            fragment = "cert=" + base64.urlsafe_b64encode(p.read_bytes()).decode().rstrip("=")
            assert _open(browser_root, page, fragment).verdict == expected[name], name
    subprocess.run([sys.executable, "-m", "autograder", "revoke", record["certificate"], "--reason", "copied work",
                    "--course", str(course.root)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    revoked = _verify_cli(course.root, genuine)
    assert revoked.returncode == 1 and "revoked: copied work" in revoked.stdout
    if CHROMIUM:
        page = verify_page.write_page(tmp_path / "verify.html", public_key,
                                      certificates.read_revocations(certificates.default_revocation_list(course.root)))
        fragment = "cert=" + base64.urlsafe_b64encode(genuine.read_bytes()).decode().rstrip("=")
        assert _open(browser_root, page, fragment).verdict == "revoked"

    # 5. The official row on other hardware: refused, with the override named (here: the row says it was
    # measured on two T4s; the command line compares with this machine).
    other = {"gpus": ["Tesla T4", "Tesla T4"], "cpu": "Intel Xeon", "cores": 16, "summary": "2 x Tesla T4"}
    with pytest.raises(calibrate.CalibrationError, match="this machine is 2 x Tesla T4.*--allow-other-hardware"):
        calibrate.resolve_profile(course.root, "gpu", 2, here=other)
    calibrate.write_row(course.root, {**row, "calibration": {**row["calibration"], "hardware": other}})
    command = [sys.executable, "-m", "autograder", "grade", str(course.root), "--profile", "gpu", "--workers", "2",
               "--no-progress"]
    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "calibrated on 2 x Tesla T4" in refused.stderr and "--allow-other-hardware" in refused.stderr
    allowed = subprocess.run(command + ["--allow-other-hardware"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "calibrated on 2 x Tesla T4" in allowed.stderr  # it says which calibration it grades with
