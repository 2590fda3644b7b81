"""`python -m mgpu.runtime.course --check`: every notebook for every seed, failures carried on past and tabled."""

import nbformat
import pytest

from mgpu.runtime import course


def _notebook(path, body):
    nb = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell("smoke = False\nseed = 0")
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_check_runs_each_seed_in_its_own_folder_and_tables_every_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MGPU_BUILD_DIR", str(tmp_path / "build"))
    notebooks = [
        _notebook(tmp_path / "01_fine.ipynb", "import os\nprint('seed', seed, os.environ['MGPU_BUILD_DIR'])"),
        _notebook(tmp_path / "02_prints.ipynb", "print('variant 3: FAILED' if seed == 1 else 'all rows ran')"),
        _notebook(tmp_path / "03_raises.ipynb", "assert seed != 0, 'the effect was not seen'"),
    ]
    assert course.check(notebooks, [0, 1], smoke=True) == 1
    table = (tmp_path / "build" / "course-check" / "table.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in table.splitlines()[2:]}
    assert "FAILED" not in "".join(rows["01_fine"])
    assert "FAILED" not in rows["02_prints"][0] and "variant 3: FAILED" in rows["02_prints"][1]
    assert "the effect was not seen" in rows["03_raises"][0] and "FAILED" not in rows["03_raises"][1]
    for seed in (0, 1):  # each seed's executed copies in its own folder, which the kernel was told
        executed = tmp_path / "build" / "course-check" / f"seed{seed}" / "notebooks" / "01_fine.ipynb"
        assert f"seed {seed} {executed.parents[1]}" in executed.read_text()
    assert "2 failed" in capsys.readouterr().out
    assert course.check(notebooks[:1], [0, 1], smoke=True) == 0


def test_notebooks_are_named_by_number_or_path(tmp_path, capsys):
    assert course.by_number("03").name.startswith("03_") and course.by_number("3") == course.by_number("03")
    assert course.by_number("notebooks/03_input_pipeline.ipynb") == course.by_number("03")
    assert course.main(["99", "--smoke"]) == 2 and "no such notebook" in capsys.readouterr().err


@pytest.mark.slow
def test_course_carries_on_past_a_failure_and_ends_with_one_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MGPU_BUILD_DIR", str(tmp_path / "build"))
    notebooks = [
        _notebook(tmp_path / "01_raises.ipynb", "raise RuntimeError('the ring lost a chunk')"),
        _notebook(tmp_path / "02_prints.ipynb", "print('step 3: FAILED')"),
        _notebook(tmp_path / "03_fine.ipynb", "print('all good', seed)"),
    ]
    assert course.main([str(p) for p in notebooks] + ["--smoke", "--seed", "5"]) == 1
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("0")}
    assert "FAILED: RuntimeError: the ring lost a chunk" in rows["01_raises.ipynb"]
    assert "FAILED: step 3: FAILED" in rows["02_prints.ipynb"]
    assert rows["03_fine.ipynb"].endswith("passed")  # it ran although two notebooks before it failed
    assert "all good 5" in (tmp_path / "build" / "notebooks" / "03_fine.ipynb").read_text()
    assert "2 failed" in out and "carrying on with the next notebook" in err
    assert course.main([str(notebooks[2]), "--smoke"]) == 0


def test_claims_are_read_from_the_results(tmp_path, monkeypatch):
    results_file = tmp_path / "x.json"
    monkeypatch.setitem(course.CLAIMS, "99_x", [
        course.Claim("four workers at least 3x one", lambda r: r["speedup"]["4"] >= 3.0),
        course.Claim("ran", lambda r: r["ran"], full_only=False),
    ])
    results_file.write_text('{"speedup": {"4": 3.4}, "ran": true}')
    assert course.claims_failed("99_x", results_file, smoke=False) == []
    results_file.write_text('{"speedup": {"4": 2.9}, "ran": true}')
    assert course.claims_failed("99_x", results_file, smoke=False) == [
        "claim did not hold: four workers at least 3x one"]
    assert course.claims_failed("99_x", results_file, smoke=True) == []  # too short a run for that claim
    results_file.write_text('{"ran": true}')
    assert "claim not checked (KeyError" in course.claims_failed("99_x", results_file, smoke=False)[0]
    assert "no results" in course.claims_failed("99_x", tmp_path / "missing.json", smoke=True)[0]
    assert course.claims_failed("00_none", results_file, smoke=False) == []
