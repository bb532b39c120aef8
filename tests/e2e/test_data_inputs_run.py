"""A stateful model end to end (docs/data.md): `python -m calibrun` quantises a recurrent step with a state input
[2, N, 4] (rows on axis 1) and an int64 scalar `sr`, without any graph surgery, and a trained model exported for one row
at a time runs a row per run; the in-process tests of feeding
inputs are in tests/unit/test_data_inputs.py, the bad inputs in test_bad_inputs.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import run_python
from tests.modelzoo import save, stateful_model

pytestmark = pytest.mark.slow  # subprocesses of the CLI

ROWS = 40


def test_a_stateful_model_with_an_int64_scalar_quantises_and_the_scalar_enters_the_cache_key(tmp_path):
    model = save(stateful_model(), tmp_path / "vad.onnx")
    rng = np.random.default_rng(7)
    calib, evaluation = tmp_path / "calib.npz", tmp_path / "eval.npz"
    # calibration: `sr` as a 0-d array in the file (3 batches: 16, 16 and 8 rows); evaluation: `sr` from the config
    np.savez(calib, input=rng.normal(size=(ROWS, 8)).astype(np.float32),
             state=rng.normal(size=(2, ROWS, 4)).astype(np.float32), sr=np.array(16000, np.int64))
    np.savez(evaluation, input=rng.normal(size=(ROWS, 8)).astype(np.float32),
             state=rng.normal(size=(2, ROWS, 4)).astype(np.float32))
    common = ["model=file", f"model.path={model}", "data=npy", f"data.path={calib}", "eval_data=npy",
              f"eval_data.path={evaluation}", "eval_data.inputs.sr.value=16000", "batches=3", "tracking=off",
              f"cache.dir={tmp_path / 'cache'}"]
    proc = run_python(["-m", "calibrun", *common, "recommend=off", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "ok"
    used = result["used"]
    assert used["calibration_rows"] == ROWS
    assert used["calibration_batches"] == 3
    assert used["eval_rows"] == ROWS
    assert used["eval_batches"] == 3
    inputs = {entry["name"]: entry for entry in used["calibration_source"]["inputs"]}
    assert inputs["state"]["batch_shape"] == [2, 16, 4]
    assert inputs["state"]["batch_axis"] == 1
    assert inputs["sr"]["dtype"] == "int64"
    assert inputs["sr"]["constant"]["value"] == 16000
    assert used["diagnostics_rows"] == ROWS  # the diagnostics split the state's rows on axis 1 too
    metrics = result["metrics"]
    assert "out.stateN.sqnr_db" in metrics
    assert "out.output.sqnr_db" in metrics
    assert 0 < metrics["input_scale"] < 0.1  # the float input `input` (N(0, 1) rows) is the primary input
    int8 = onnx.load(str(tmp_path / "run" / "int8.onnx"))
    assert [i.name for i in int8.graph.input] == ["input", "state", "sr"]  # no graph surgery

    # a sweep over the scalar (a key of an input the schema does not name): the same value hits the cache, another
    # one calibrates again under another key
    sweep = run_python(["-m", "calibrun", "-m", *common[:3], "data.inputs.sr.value=16000,8000", *common[3:],
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    same, other = (json.loads((tmp_path / "sweep" / job / "result.json").read_text()) for job in ("0", "1"))
    assert same["metrics"]["cache_hit"] == 1
    assert same["cache_key"] == result["cache_key"]
    assert other["metrics"]["cache_hit"] == 0
    assert other["cache_key"] != result["cache_key"]


def test_a_model_of_integer_inputs_only_quantises_from_its_data(tmp_path):
    """Token ids in (int64, the model's only input), float activations computed from them: no float input to pin a
    scale on, and still a quantised model, a verdict and the measurements."""
    from tests.modelzoo import int_input_model

    model = save(int_input_model(), tmp_path / "ids.onnx")
    rng = np.random.default_rng(3)
    data = tmp_path / "ids.npz"
    np.savez(data, ids=rng.integers(0, 20, size=(ROWS, 4)).astype(np.int64))
    proc = run_python(["-m", "calibrun", "model=file", f"model.path={model}", "data=npy", f"data.path={data}",
                       "eval_data=npy", f"eval_data.path={data}", "batches=3", "tracking=off", "recommend=off",
                       "calibration=wide", f"cache.dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"],
                      tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the wide calibration's factor 10 multiplies float inputs: here it changes nothing, and says so
    assert "calibration.factor=10 changes nothing here: it multiplies float inputs, and the model has none " \
           "(its inputs: 'ids' (INT64 [N, 4]))" in proc.stderr
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["metrics"]["input_scale"] is None  # the int64 input stays as it is
    assert result["metrics"]["quantize_nodes"] >= 1  # the activations computed from it are quantised
    assert result["verdict"]["metric"] == "out.y.sqnr_db"
    assert result["used"]["calibration_source"]["inputs"][0]["dtype"] == "int64"


def test_a_model_exported_for_one_row_at_a_time_runs_a_row_per_run(tmp_path):
    """khmersm's trained transformer declares [batch, seq] inputs but fails on two rows (its attention Reshapes were
    traced with one): the job finds that after its first try failed, pins the model's batch axes to 1 in a copy, keeps
    each input's batch axis (axis 0, not the seq axis a pinned shape would leave free) and runs the rows one per run,
    with no line of onnxruntime's own on stderr. The rows are char ids drawn from its vocabulary (no Khmer text ships
    in a package the tests use): what is asserted is how they are run and that the verdict is the one the test
    computes from both models, not what it says of the words."""
    from tests.trained import KHMERSM, khmersm_model, package_file

    model = khmersm_model()
    vocabulary = json.loads(package_file(*KHMERSM, "khmersm/config.json").read_text(encoding="utf-8"))["char2id"]
    ids = np.array(sorted(v for v in vocabulary.values() if v >= 2), np.int64)  # not <pad> or <unk>
    rng = np.random.default_rng(3)
    calib, evaluation = tmp_path / "calib.npz", tmp_path / "eval.npz"
    for path, rows in ((calib, 24), (evaluation, 20)):
        x = rng.choice(ids, (rows, 40))
        np.savez(path, x=x, mask=np.ones_like(x, bool))
    proc = run_python(["-m", "calibrun", "model=file", f"model.path={model}", "data=npy", f"data.path={calib}",
                       "eval_data=npy", f"eval_data.path={evaluation}", "tracking=off", "recommend=off",
                       f"cache.dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("fails on two rows at once and runs one") == 1
    assert "[E:onnxruntime" not in proc.stderr
    assert proc.stderr.count("evaluating the data's 20 rows (eval.rows is 256 by default)") == 1  # said once, not again
    run = tmp_path / "run"
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["preparation"][-1].startswith("pinned each input's batch axis to one row")
    used = result["used"]
    assert (used["calibration_rows"], used["calibration_batches"], used["calibration_rows_per_batch"]) == (24, 24, 1)
    assert (used["eval_rows"], used["eval_batches"]) == (20, 20)
    assert result["eval_source"]["inputs"] == {"x": {"batch_axis": 0}, "mask": {"batch_axis": 0}}
    assert used["diagnostics_rows"] == 20
    pinned = Path(result["files"]["fp32"])  # the pinned copy, made once per prepared model in the cache
    assert pinned.parent == tmp_path / "cache" / "models"
    assert pinned.name.endswith("-one-row.onnx")
    assert (pinned.parent / (pinned.name + ".data")).is_file()  # khmersm keeps its weights in a data file

    import onnxruntime as ort

    def emissions(path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        with np.load(evaluation) as data:
            return np.concatenate([session.run(None, {"x": data["x"][i:i + 1], "mask": data["mask"][i:i + 1]})[0]
                                   for i in range(len(data["x"]))]).astype(np.float64)

    ref, got = emissions(model), emissions(run / "int8.onnx")
    sqnr = 10 * np.log10(np.square(ref).mean() / np.square(ref - got).mean())
    assert result["verdict"]["metric"] == "out.emissions.sqnr_db"
    assert result["verdict"]["value"] == pytest.approx(sqnr, abs=0.01)


@pytest.mark.parametrize(("names", "key"), [(("input.1", "sr.1", "out"), "sr.1"), (("input_1:0", "sr:0", "out:0"),
                                                                                   "sr_0")], ids=["dotted", "colon"])
def test_input_names_of_exporters_are_set_from_the_command_line(tmp_path, names, key):
    """PyTorch's exports name inputs `input.1` (the config nests a dotted key: joined back), tf2onnx's `input_1:0`
    (no override key can hold ':': written `sr_0`); the constant reaches the model either way."""
    from onnx import TensorProto, helper, numpy_helper

    x, sr, out = names
    rng = np.random.default_rng(4)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", [x, "w"], ["m"]), helper.make_node("Cast", [sr], ["s"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["m", "s"], [out])], "g",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info(sr, TensorProto.INT64, [])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 4])], [weight])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    rows = rng.normal(size=(48, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", **{x: rows[:32]})
    np.savez(tmp_path / "eval.npz", **{x: rows[32:]})
    proc = run_python(["-m", "calibrun", "model=file", f"model.path={model}", "data=npy",
                       f"data.path={tmp_path / 'calib.npz'}", "eval_data=npy",
                       f"eval_data.path={tmp_path / 'eval.npz'}", f"data.inputs.{key}.value=2",
                       f"eval_data.inputs.{key}.value=2", "tracking=off", "recommend=off",
                       f"cache.dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    inputs = {entry["name"]: entry for entry in result["used"]["calibration_source"]["inputs"]}
    assert inputs[sr]["constant"]["value"] == 2
    assert f"output {out!r}" in result["verdict"]["because"]  # named as the model names it, not as a metric key
