"""How long do certificates take? Signing, issuing (JSON + PDF + PNG) and verifying, timed.

Makes a throw-away key pair in a temporary folder, then times on the wall clock:

- ``sign``: :func:`autograder.certificates.sign` alone (field check, canonical JSON, Ed25519), ``--signatures`` times;
- ``issue``: :func:`autograder.certificates.issue` (sign, draw the page, write the JSON, PDF and PNG
  atomically), ``--issues`` times after one untimed warm-up issue (importing matplotlib, loading fonts);
- ``verify_json`` and ``verify_pdf``: :func:`autograder.certificates.verify` from each file, ``--signatures`` times.

It prints the mean and median of each in milliseconds and writes them, with the files' sizes, to
``build/results/certificates_benchmark.json``.

    python benchmarks/certificates.py                          # 200 signatures, 20 issues
    python benchmarks/certificates.py --signatures 50 --issues 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _timed_ms(function, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signatures", type=int, default=200, help="signatures and verifications timed (200)")
    parser.add_argument("--issues", type=int, default=20, help="certificates issued, timed (20)")
    args = parser.parse_args(argv)

    import cryptography

    from autograder import certificates
    from mgpu.runtime import results

    fields = {
        "name": "Ada Lovelace", "student_id": "s1815", "course": certificates.COURSE_NAME,
        "course_id": "mgpu-2026", "assignment": "assessment", "accuracy": 0.8731, "target_accuracy": 0.85,
        "reached_seconds": 59.4, "time_budget_s": 90.0, "profile": "gpu", "workers": 4,
        "dataset": "fashion_mnist", "dataset_fingerprint": "sha256:3f2a9c0d11e4b7a8",
        "submission_sha256": "5e" * 32, "grader_version": certificates.grader_version(),
        "calibration": "calibrated on 4 x NVIDIA A100-SXM4-40GB 2026-11-26: 5 reference runs reached the target in 41-47 s",
    }
    with tempfile.TemporaryDirectory(prefix="certificates_benchmark_") as folder:
        folder = Path(folder)
        private_path, public_path = certificates.init_keys(folder / "keys")
        private_key = certificates.load_private_key(private_path)
        public_key = certificates.load_public_key(public_path)
        certificate = certificates.complete(fields)

        sign_ms = _timed_ms(lambda: certificates.sign(certificate, private_key), args.signatures)
        files = certificates.issue(fields, private_key, folder / "warm-up")
        issue_ms = _timed_ms(lambda: certificates.issue(fields, private_key, folder / "issued"), args.issues)
        checks = {}
        for label, path in (("json", files.json), ("pdf", files.pdf)):
            assert certificates.verify(path, public_key).valid, path
            checks[label] = _timed_ms(lambda: certificates.verify(path, public_key), args.signatures)
        sizes = {suffix: getattr(files, suffix).stat().st_size for suffix in ("json", "pdf", "png")}

    values = {"signatures": args.signatures, "issues": args.issues, "cryptography": cryptography.__version__,
              "load_average_1min": os.getloadavg()[0]}
    print(f"{'ms':<12} {'mean':>8} {'median':>8}   (n)")
    for label, times in (("sign", sign_ms), ("issue", issue_ms), ("verify_json", checks["json"]),
                         ("verify_pdf", checks["pdf"])):
        values[f"{label}_ms_mean"] = statistics.mean(times)
        values[f"{label}_ms_median"] = statistics.median(times)
        print(f"{label:<12} {statistics.mean(times):8.3f} {statistics.median(times):8.3f}   ({len(times)})")
    for suffix, size in sizes.items():
        values[f"{suffix}_bytes"] = size
    print(f"files: json {sizes['json']} B, pdf {sizes['pdf']} B, png {sizes['png']} B; "
          f"load average {values['load_average_1min']:.1f}")
    path = results.write_results("certificates_benchmark", values, dataset=None, smoke=False, seed=0)
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
