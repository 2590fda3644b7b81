"""The cohort's reports: ``grades.csv`` and ``report.html``, written atomically.

The HTML page has one row per student (pass/fail with the reason, score, measured accuracy and
time, the notebook's run time) and a plot of every student's measured held-out accuracy against
the grader's clock, with the target and the budget drawn in. All numbers come from the grader's
records (``autograder/<assignment>/<student>.json``), never from the students' outputs.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
import tempfile
from pathlib import Path

CSV_COLUMNS = ["student", "passed", "outcome_passed", "score", "max_score", "accuracy", "reached_seconds",
               "notebook_seconds", "total_seconds", "run_status", "reason", "profile", "workers",
               "target_accuracy", "time_budget_s", "horovod_workers_seen", "copied_from", "certificate",
               "certificate_note", "submission_sha256", "graded_at"]


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Characters a run's text may carry that would hide or disguise what a report says: control
#: characters (NUL, escape sequences) and Unicode's invisible formatting (bidirectional overrides,
#: zero-width characters).
_HIDDEN = {c: None for c in [*range(0, 9), *range(11, 32), 127, *range(0x80, 0xA0), 0x200B, 0x200C, 0x200D,
                             0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF]}


def printable(text) -> str:
    """``text`` as a report shows it: hidden characters removed (newlines and tabs kept)."""
    return str(text).translate(_HIDDEN)


def _cell(value):
    """A CSV cell: printable, and text a spreadsheet would run as a formula (=, +, -, @) quoted."""
    if not isinstance(value, str):
        return value
    value = printable(value)
    return "'" + value if value[:1] in ("=", "+", "-", "@") else value


def csv_text(records: list[dict], refused: list[dict] = ()) -> str:
    """One row per graded student, then one per notebook the import refused (run_status ``not imported``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for record in sorted(records, key=lambda r: r["student"]):
        row = {k: record.get(k) for k in CSV_COLUMNS}
        row["copied_from"] = " ".join(record.get("copied_from") or [])
        writer.writerow({k: _cell(v) for k, v in row.items()})
    for entry in refused:
        writer.writerow({k: _cell(v) for k, v in {"student": entry["name"], "passed": False,
                                                  "run_status": "not imported",
                                                  "reason": entry.get("reason", "")}.items()})
    return buffer.getvalue()


def accuracy_plot_png(records: list[dict], target: float | None, budget: float | None) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for record in sorted(records, key=lambda r: r["student"]):
        points = [(e["seconds"], e["accuracy"]) for e in record.get("epochs", []) if e.get("accuracy") is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=record["student"])
    if target is not None:
        ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target:.2f}")
    if budget is not None:
        ax.axvline(budget, color="r", linestyle=":", linewidth=1, label=f"budget {budget:.0f} s")
    ax.set_xlabel("grader's clock since the notebook started (s)")
    ax.set_ylabel("held-out accuracy (measured by the grader)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _html(text) -> str:
    return html.escape(printable(text))


def _refused_html(refused: list[dict]) -> str:
    if not refused:
        return ""
    rows = "".join(f"<tr><td>{_html(e['name'])}</td><td>{_html(e.get('reason', ''))}</td></tr>"
                   for e in refused)
    return (f"<h2>Not imported ({len(refused)})</h2><p>Notebooks the last <code>--submissions</code> import "
            f"left out; nothing of them is in the gradebook.</p>\n<table><tr><th>file</th><th>why</th></tr>"
            f"{rows}</table>\n")


def _number(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def html_text(records: list[dict], profile, refused: list[dict] = ()) -> str:
    records = sorted(records, key=lambda r: r["student"])
    passed = sum(1 for r in records if r.get("passed"))
    png = base64.b64encode(accuracy_plot_png(records, profile.target_accuracy, profile.time_budget_s)).decode()
    rows = []
    for r in records:
        verdict = "pass" if r.get("passed") else "fail"
        rows.append(
            f"<tr class='{verdict}'><td>{_html(r['student'])}</td><td>{verdict}</td>"
            f"<td>{_html(r.get('reason') or '')}</td>"
            f"<td>{_number(r.get('score'), 1)} / {_number(r.get('max_score'), 1)}</td>"
            f"<td>{_number(r.get('accuracy'), 3)}</td><td>{_number(r.get('reached_seconds'), 0)}</td>"
            f"<td>{_number(r.get('notebook_seconds'), 0)}</td>"
            f"<td>{_html(r.get('certificate') or r.get('certificate_note') or '')}</td></tr>")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Assessment report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}
tr.pass td:nth-child(2){{color:#070;font-weight:bold}} tr.fail td:nth-child(2){{color:#a00;font-weight:bold}}</style>
</head><body>
<h1>Assessment: {passed} of {len(records)} passed</h1>
<p>Profile <b>{html.escape(profile.name)}</b>, {profile.workers} workers, dataset {html.escape(profile.dataset)}:
held-out accuracy &ge; {profile.target_accuracy:.3f} for 2 consecutive epochs within
{profile.time_budget_s:.0f} s on the grader's clock. Accuracy and times are the grader's own measurements.</p>
<table><tr><th>student</th><th>verdict</th><th>reason</th><th>score</th><th>best accuracy</th>
<th>target reached at (s)</th><th>notebook run (s)</th><th>certificate</th></tr>
{''.join(rows)}
</table>
{_refused_html(refused)}<h2>Held-out accuracy of each saved epoch against the grader's clock</h2>
<img alt="accuracy vs time" src="data:image/png;base64,{png}">
</body></html>
"""


def refused_imports(folder: Path) -> list[dict]:
    """What the last ``--submissions`` import left out (``import/refused.json``: name and reason)."""
    try:
        entries = json.loads((Path(folder) / "import" / "refused.json").read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)]


def write_reports(folder: Path, records: list[dict], profile, refused: list[dict] = ()) -> tuple[Path, Path]:
    """``grades.csv`` and ``report.html``; ``refused`` lists the notebooks an import left out."""
    folder = Path(folder)
    csv_path, html_path = folder / "grades.csv", folder / "report.html"
    write_atomically(csv_path, csv_text(records, refused))
    write_atomically(html_path, html_text(records, profile, refused))
    return csv_path, html_path
