"""Summaries of Horovod timelines: nested activities, fused tensors, unfinished files."""

import json

import pytest

from mgpu.runtime import timeline


def _trace():
    # Two tensors fused into one all-reduce: their intervals overlap.
    return [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_a"}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1},
        {"ph": "X", "name": "0", "ts": 10, "pid": 1, "dur": 0},
        {"ph": "E", "ts": 1_000_000, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 1_000_000, "pid": 1},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 1_100_000, "pid": 1},
        {"ph": "E", "ts": 1_400_000, "pid": 1},
        {"ph": "E", "ts": 1_500_000, "pid": 1},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 500_000, "pid": 2},
        {"ph": "E", "ts": 1_000_000, "pid": 2},
        {"ph": "B", "name": "ALLREDUCE", "ts": 1_000_000, "pid": 2},
        {"ph": "E", "ts": 1_500_000, "pid": 2},
        {"ph": "X", "name": "CUSTOM", "ts": 2_000_000, "pid": 2, "dur": 250_000},
    ]


def _write_unfinished(path, events):
    # Horovod writes "[" then one event per line with a trailing comma, and closes the list at exit.
    path.write_text("[\n" + "".join(json.dumps(e) + ",\n" for e in events))


def test_unfinished_file_is_read(tmp_path):
    _write_unfinished(tmp_path / "t.json", _trace())
    assert len(timeline.load_events(tmp_path / "t.json")) == len(_trace())


def test_activities_nest_and_fused_tensors_are_counted_once_in_wall_time(tmp_path):
    _write_unfinished(tmp_path / "t.json", _trace())
    summary = timeline.summarize(tmp_path / "t.json")
    acts = {a.name: a for a in summary["activities"]}
    assert summary["tensors"] == 2
    assert summary["span_s"] == pytest.approx(2.0)
    assert acts["NEGOTIATE_ALLREDUCE"].count == 2
    assert acts["NEGOTIATE_ALLREDUCE"].summed_s == pytest.approx(1.5)
    assert acts["NEGOTIATE_ALLREDUCE"].wall_s == pytest.approx(1.0)
    assert acts["ALLREDUCE"].summed_s == pytest.approx(1.0)
    assert acts["ALLREDUCE"].wall_s == pytest.approx(0.5)
    assert acts["GLOO_ALLREDUCE"].wall_s == pytest.approx(0.3)
    assert acts["CUSTOM"].wall_s == pytest.approx(0.25)
    assert "0" not in acts  # zero-length markers are not activities
    assert summary["activities"][0].name == "NEGOTIATE_ALLREDUCE"


def test_finished_file_and_event_list_give_the_same_summary(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(_trace()))
    from_file = timeline.summarize(tmp_path / "t.json")
    from_list = timeline.summarize(_trace())
    assert from_file == from_list


def test_what_follows_the_named_activity_is_left_out():
    # A script's own allgather after training: a long wait that is not part of training.
    after = [{"ph": "B", "name": "NEGOTIATE_ALLGATHER", "ts": 3_000_000, "pid": 3},
             {"ph": "E", "ts": 9_000_000, "pid": 3},
             {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 9_500_000, "pid": 1},
             {"ph": "E", "ts": 9_600_000, "pid": 1}]
    whole = timeline.summarize(_trace() + after)
    training = timeline.summarize(_trace() + after, before="NEGOTIATE_ALLGATHER")
    assert whole["activities"][0].name == "NEGOTIATE_ALLGATHER" and whole["span_s"] == pytest.approx(9.6)
    assert training == timeline.summarize(_trace())
    assert timeline.summarize(_trace(), before="NEGOTIATE_ALLGATHER") == timeline.summarize(_trace())
