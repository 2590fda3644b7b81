"""Results files: flat JSON, atomic, always with the dataset fingerprint."""

import json
import math

import numpy as np
import pytest

from mgpu.runtime import results


class _FakeDataset:
    name = "synthetic-v1-seed0"
    fingerprint = "synthetic-v1-seed0:0123456789abcdef"


@pytest.fixture(autouse=True)
def build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MGPU_BUILD_DIR", str(tmp_path))
    return tmp_path


def test_flat_json_with_fingerprint_smoke_and_seed(build_dir):
    path = results.write_results("02_batch_size", {
        "b_crit": np.float32(512.0), "throughput_by_batch": {16: 100.5, 64: 300},
        "slope": math.nan, "ok": np.bool_(True),
    }, dataset=_FakeDataset(), smoke=True, seed=3)
    assert path == build_dir / "results" / "02_batch_size.json"
    record = json.loads(path.read_text())
    assert record["dataset_fingerprint"] == _FakeDataset.fingerprint
    assert record["smoke"] is True and record["seed"] == 3
    assert record["b_crit"] == 512.0 and record["slope"] is None and record["ok"] is True
    assert record["throughput_by_batch"] == {"16": 100.5, "64": 300}
    assert [p.name for p in path.parent.iterdir()] == ["02_batch_size.json"]  # no temporary left


def test_nested_or_odd_values_are_refused(build_dir):
    with pytest.raises(ValueError, match="one-level object"):
        results.write_results("x", {"a": [1, 2]}, smoke=False, seed=0)
    with pytest.raises(ValueError, match="plain numbers"):
        results.write_results("x", {"a": {"b": {"c": 1}}}, smoke=False, seed=0)
    with pytest.raises(ValueError, match="reserved"):
        results.write_results("x", {"seed": 1}, smoke=False, seed=0)
    assert not (build_dir / "results" / "x.json").exists()


def test_without_a_dataset_the_fingerprint_is_null(build_dir):
    record = json.loads(results.write_results("y", {"v": 1}, smoke=False, seed=0).read_text())
    assert record["dataset"] is None and record["dataset_fingerprint"] is None
