"""calibrun.result.JobResult: result.json's object, read and written in one fixed key order, nothing lost."""

from __future__ import annotations

import json

import pytest

from calibrun.result import JobResult

OK = {"status": "ok", "params": {"calibration": "match", "batches": 2}, "metrics": {"max_abs_error": 0.5, "span": 6.2},
      "ops": {"Add": 2}, "cache_key": "abc", "preparation": ["inferred shapes"],
      "exclusions": {"nodes_to_exclude": ["n"], "mapped": {}}, "eval_source": {"name": "lab", "seed": 777, "rows": 32},
      "used": {"eval_rows": 32}, "task": {"name": "none", "reason": "r"},
      "files": {"int8": "int8.onnx", "int8_sha256": "00"}, "diagnosis": {"overall": "sound"},
      "analysis": {"metric": "max_abs_error"}, "mlflow": {"run_id": "r1"}}


def test_a_completed_record_round_trips_byte_for_byte():
    text = json.dumps(OK, indent=2)
    assert json.dumps(JobResult.from_json(json.loads(text)).to_json(), indent=2) == text


def test_keys_come_out_in_one_order_whatever_order_they_came_in():
    shuffled = dict(reversed(list(OK.items())))
    assert list(JobResult.from_json(shuffled).to_json()) == list(OK)


def test_a_failed_record_holds_status_error_params_and_its_run():
    record = JobResult.failed("bad input", {"batches": 2}, mlflow={"run_id": "r"}).to_json()
    assert record == {"status": "failed", "error": "bad input", "params": {"batches": 2}, "mlflow": {"run_id": "r"}}
    assert list(record) == ["status", "error", "params", "mlflow"]
    assert not JobResult.from_json(record).ok


def test_keys_this_version_does_not_know_are_kept_after_the_known_ones():
    record = {"future": [1, 2], **OK}
    result = JobResult.from_json(record)
    assert result.extra == {"future": [1, 2]}
    assert list(result.to_json()) == [*OK, "future"]


@pytest.mark.parametrize(("record", "problem"), [
    ([], "is not a JSON object"),
    ({"status": "done"}, "has no valid status (got 'done')"),
    ({**OK, "metrics": None}, "has no 'metrics' object"),
    ({**OK, "files": []}, "has no 'files' object"),
    ({**OK, "metrics": {"max_abs_error": True}}, "has no numeric metrics.max_abs_error"),
    ({**OK, "metrics": {}}, "has no numeric metrics.max_abs_error"),
    ({**OK, "files": {"int8": 3}}, "names no int8 model (files.int8)"),
])
def test_a_record_no_reader_could_use_is_refused_naming_why(record, problem):
    with pytest.raises(ValueError, match="^" + __import__("re").escape(problem) + "$"):
        JobResult.from_json(record)


def test_write_and_read_through_a_file(tmp_path):
    path = tmp_path / "result.json"
    JobResult.from_json(OK).write(path)
    assert json.loads(path.read_text()) == OK
    assert JobResult.read(path).to_json() == OK
