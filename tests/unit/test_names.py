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


def test_calibruns_limits_are_within_the_installed_mlflows():
    from mlflow.utils import validation

    from calibrun import tracking

    assert tracking.MAX_RUN_NAME <= 250  # runs.name is VARCHAR(250) in MLflow's SQL schema
    assert tracking.MAX_PARAM_VALUE <= validation.MAX_PARAM_VAL_LENGTH
    assert tracking.MAX_TAG_VALUE <= validation.MAX_TAG_VAL_LENGTH
    assert tracking.MAX_KEY <= validation.MAX_ENTITY_KEY_LENGTH
    assert tracking.MAX_DATASET_VALUE <= validation.MAX_DATASET_NAME_SIZE


def test_a_long_key_is_cut_with_a_hash_and_two_long_keys_stay_apart():
    from calibrun.tracking import fit_key

    assert fit_key("best_max_abs_error/batches:8") == "best_max_abs_error/batches:8"
    a, b = ("best/" + "k" * 300 + end for end in "AB")
    assert len(fit_key(a)) == len(fit_key(b)) == 250
    assert fit_key(a) != fit_key(b)
    assert fit_key(a).startswith("best/kkk")


def _sweep_config(*overrides: str):
    from omegaconf import OmegaConf

    return OmegaConf.create({"hydra": {"overrides": {"task": list(overrides)}, "sweeper": {"params": None}}})


def test_the_parent_runs_name_shows_each_swept_path_by_the_part_that_tells_it_apart():
    from calibrun.sweep import sweep_name

    folder = "/srv/" + "a_long_folder_of_calibration_data/" * 5
    paths = [f"{folder}{split}/calib.npy" for split in ("train", "val")]
    model = folder + "model.onnx"
    name = sweep_name(_sweep_config(f"model.path={model}", f"data.path={','.join(paths)}", "method=minmax,entropy",
                                    "hydra.sweep.dir=/somewhere/else"))
    assert len(name) <= 250, name
    for part in ("/train/calib.npy,", "/val/calib.npy", "model.onnx", "method=minmax,entropy"):
        assert part in name, name
    assert "somewhere" not in name


def test_the_parent_runs_best_value_metrics_of_long_paths_stay_apart():
    from calibrun.sweep import _metric_part

    folder = "/srv/" + "a_long_folder_of_calibration_data/" * 5
    paths = [f"{folder}{split}/calib.npy" for split in ("train", "val")]
    keys = {f"best_max_abs_error/{_metric_part('data.path')}:{_metric_part(p, paths)}" for p in paths}
    assert len(keys) == 2
    for key in keys:
        assert len(key) <= 250
        assert set(key) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. /:"), key


def test_the_parent_runs_name_keeps_the_command_lines_order_and_puts_the_swept_first_only_when_cut():
    from calibrun.sweep import sweep_name

    assert sweep_name(_sweep_config("batches=8", "method=minmax,entropy")) == "sweep batches=8 method=minmax,entropy"
    fixed = [f"quant.option_{i}=value_{i}_" + "z" * 50 for i in range(6)]  # each shown in 60 characters
    name = sweep_name(_sweep_config(*fixed, "method=minmax,entropy"))
    assert len(name) == 250
    assert name.startswith("sweep method=minmax,entropy quant.option_0=")
    assert name.endswith("…")
