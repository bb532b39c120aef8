"""Issue 25, item 5: run names stay unique and faithful; every name and value calibrun writes fits MLflow's
limits, the whole value kept as an artifact."""

from __future__ import annotations

import itertools
from pathlib import Path

from calibrun.tracking import Tracker
from calibrun.tracking.record import run_name
from tests.stores import fresh_mlflow_store

# MLflow's limits (mlflow/utils/validation.py; tag values: 5000 on older servers)
MAX_RUN_NAME, MAX_PARAM_VALUE, MAX_TAG_VALUE = 250, 6000, 5000


def names(swept: dict[str, list[str]], values: bool = True) -> list[str]:
    """The run name of every job of a sweep over `swept` (key -> values); `values`: the job knows the sweep's
    values of each key (as it does from the parent run's record)."""
    keys = list(swept)
    extra = (swept,) if values else ()
    return [run_name(None, [f"{k}={v}" for k, v in zip(keys, combo, strict=True)], keys, *extra)
            for combo in itertools.product(*swept.values())]


def test_a_value_with_slashes_is_kept_whole():
    (name,) = names({"quant.nodes_to_exclude": ["[/model/backbone/Conv]"]}, values=False)
    assert name == "quant.nodes_to_exclude=[/model/backbone/Conv]"


def test_data_and_eval_data_paths_are_told_apart():
    (name,) = names({"data.path": ["data/calib.npz"], "eval_data.path": ["data/eval/calib.npz"]}, values=False)
    assert name == "data.path=data/calib.npz eval_data.path=data/eval/calib.npz"


def test_long_paths_keep_the_part_that_tells_them_apart():
    folder = "/datasets/" + "very_long_folder_name/" * 6
    paths = [f"{folder}{split}/calib.npz" for split in ("train", "val", "test")]
    shown = names({"data.path": paths, "calibration": ["narrow", "match"]})
    assert len(set(shown)) == len(shown) == 6
    for name, (path, calibration) in zip(shown, itertools.product(paths, ["narrow", "match"]), strict=True):
        split = path.rsplit("/", 2)[1]
        assert f"/{split}/calib.npz" in name, name  # the distinguishing folder and the file name
        assert name.endswith(calibration)
        assert len(name) < len(path)


def test_values_that_differ_only_deep_inside_a_long_middle_stay_unique():
    values = ["x" * 150 + c + "y" * 150 for c in "AB"]
    shown = names({"quant.nodes_to_exclude": values})
    assert len(set(shown)) == 2


def test_a_name_never_exceeds_mlflows_250_characters():
    swept = {f"quant.option_{i}": [f"value_{i}_" + "z" * 90] for i in range(8)}
    (name,) = names(swept, values=False)
    assert len(name) <= MAX_RUN_NAME
    assert name.startswith("quant.option_0=")
    assert "quant.option_7=" in name


def test_long_names_tags_and_params_fit_and_the_whole_value_is_kept(tmp_path):
    tracker = Tracker(fresh_mlflow_store(tmp_path), "limits")
    long_tag, long_param = "t" * 3000 + "MIDDLE" + "t" * 3000, "p" * 4000 + "MIDDLE" + "p" * 4000
    run_id = tracker.start_run("n" * 400, {"calibrun.swept.quant.nodes_to_exclude": long_tag})
    tracker.log(run_id, params={"quant.nodes_to_exclude": long_param}, tags={"calibrun.error": long_tag})
    tracker.finish(run_id)
    run = tracker.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert len(run.info.run_name) <= MAX_RUN_NAME
    assert len(run.data.tags["calibrun.error"]) <= MAX_TAG_VALUE
    assert len(run.data.params["quant.nodes_to_exclude"]) <= MAX_PARAM_VALUE
    kept = {a.path for a in tracker.client.list_artifacts(run_id, "full_values/params")}
    assert kept == {"full_values/params/quant.nodes_to_exclude.txt"}
    path = tracker.client.download_artifacts(run_id, "full_values/params/quant.nodes_to_exclude.txt", str(tmp_path))
    assert Path(path).read_text() == long_param
    tags = {a.path for a in tracker.client.list_artifacts(run_id, "full_values/tags")}
    assert "full_values/tags/calibrun.error.txt" in tags
