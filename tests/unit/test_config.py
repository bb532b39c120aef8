"""Compose tests for conf/ + calibrun.config: defaults, every group option, the lab preset's sweep, and the
type errors (compose time) and value errors (validate) that must name the key at fault.

Uses Hydra's compose API only (no app run, no onnxruntime work); each test initialises and clears Hydra.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from calibrun import config as calibrun_config
from calibrun.config import calibration_spec, quant_options, tracking_enabled, validate
from calibrun.core.errors import CalibrunError
from calibrun.quant.calibrate import CalibrationSpec

CONF_DIR = str((Path(__file__).resolve().parents[2] / "conf").resolve())
NOW_DIR = re.compile(r"^\$\{now:%Y-%m-%d\}/\$\{now:%H-%M-%S\}-\$\{calibrun\.sweep_id:\}$")  # + a unique suffix


@pytest.fixture
def hydra_ctx():
    """A fresh Hydra context on conf/ for this test only; cleared afterwards (and before, in case)."""
    calibrun_config.register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        yield
    assert not GlobalHydra.instance().is_initialized()


def make(*overrides: str, hydra_config: bool = False) -> DictConfig:
    return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)


def error_chain(exc: BaseException) -> str:
    """The message of the exception and all its causes (Hydra wraps OmegaConf's ValidationError)."""
    parts = []
    while exc is not None:
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------- defaults


def test_default_config_values(hydra_ctx):
    cfg = make(hydra_config=True)
    assert cfg.calibration.name == "match"
    assert cfg.calibration.factor == 1.0
    assert cfg.calibration.seed == 4242
    assert cfg.format.name == "qdq"
    assert cfg.method.name == "minmax"
    assert cfg.model.name == "lab"
    assert cfg.model.path is None
    assert cfg.data.name == "lab"
    assert cfg.batches == 64
    assert cfg.eval.seed == 777
    assert cfg.eval.rows == 256
    assert cfg.cache.enabled is True
    assert cfg.cache.dir == ".calibrun-cache"
    assert cfg.tracking.name == "local"
    assert cfg.tracking.uri is None
    assert cfg.tracking.experiment == "calibrun"
    assert tracking_enabled(cfg)
    assert cfg.report.dir is None
    assert cfg.ort.intra_op_threads == 0
    assert quant_options(cfg).format == "qdq"
    validate(cfg)


def test_default_hydra_settings(hydra_ctx):
    cfg = make(hydra_config=True)
    assert cfg.hydra.job.name == "calibrun"
    assert cfg.hydra.job.chdir is False
    sweep = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)
    assert sweep["dir"].startswith("multirun/")
    assert NOW_DIR.match(sweep["dir"].removeprefix("multirun/")), sweep["dir"]
    assert sweep["subdir"] == "${hydra.job.num}"
    run = OmegaConf.to_container(cfg.hydra.run, resolve=False)
    assert run["dir"].startswith("outputs/")
    assert NOW_DIR.match(run["dir"].removeprefix("outputs/")), run["dir"]
    assert cfg.hydra.callbacks.calibrun._target_ == "calibrun.sweep.SweepCallback"
    # No sweep without the preset.
    assert cfg.hydra.sweeper.params is None


def test_default_config_is_typed_by_schema(hydra_ctx):
    cfg = make()
    assert OmegaConf.get_type(cfg) is calibrun_config.Config
    assert OmegaConf.get_type(cfg.calibration) is calibrun_config.CalibrationConf
    assert OmegaConf.get_type(cfg.method) is calibrun_config.MethodConf
    assert OmegaConf.is_struct(cfg)


# --------------------------------------------------------------------------------------------- groups


@pytest.mark.parametrize(("option", "factor"), [("narrow", 0.2), ("match", 1.0), ("wide", 10.0)])
def test_calibration_option(hydra_ctx, option, factor):
    cfg = make(f"calibration={option}")
    assert cfg.calibration.name == option
    assert cfg.calibration.factor == factor
    assert cfg.calibration.seed == 4242
    validate(cfg)


@pytest.mark.parametrize("option", ["qdq", "qoperator"])
def test_format_option(hydra_ctx, option):
    cfg = make(f"format={option}")
    assert cfg.format.name == option
    assert quant_options(cfg).format == option
    validate(cfg)


# The options each method's yaml sets, as onnxruntime's create_calibrator sees them.
METHOD_OPTIONS = {
    "minmax": {"symmetric": False, "moving_average": False, "per_channel": False},
    "entropy": {"symmetric": False, "num_bins": 2048, "num_quantized_bins": 128},
    "percentile": {"symmetric": True, "num_bins": 2048, "percentile": 99.999},
    "distribution": {"num_bins": 2048, "scenario": "same"},
}
# Histogram methods hold a chunk's activations at once: they default to one batch a chunk (flat memory).
METHOD_CHUNK = {"minmax": 16, "entropy": 1, "percentile": 1, "distribution": 1}


@pytest.mark.parametrize("option", sorted(METHOD_OPTIONS))
def test_method_option(hydra_ctx, option):
    cfg = make(f"method={option}")
    assert cfg.method.name == option
    assert cfg.method.chunk == METHOD_CHUNK[option]
    validate(cfg)
    spec = calibration_spec(cfg)
    assert isinstance(spec, CalibrationSpec)
    assert spec.method == option
    assert spec.chunk == METHOD_CHUNK[option]
    options = spec.calibrator_options()
    assert options.items() >= METHOD_OPTIONS[option].items(), options


@pytest.mark.parametrize(("option", "enabled"), [("on", True), ("off", False)])
def test_cache_option(hydra_ctx, option, enabled):
    cfg = make(f"cache={option}")
    assert cfg.cache.enabled is enabled
    assert cfg.cache.dir == ".calibrun-cache"
    validate(cfg)


@pytest.mark.parametrize(("option", "enabled"), [("local", True), ("off", False)])
def test_tracking_option(hydra_ctx, option, enabled):
    cfg = make(f"tracking={option}")
    assert cfg.tracking.name == option
    assert cfg.tracking.uri is None
    assert cfg.tracking.experiment == "calibrun"
    assert tracking_enabled(cfg) is enabled
    validate(cfg)


def test_tracking_server_without_uri_fails_validate(hydra_ctx):
    cfg = make("tracking=server")
    assert cfg.tracking.name == "server"
    with pytest.raises(CalibrunError, match=r"tracking\.uri"):
        validate(cfg)


def test_tracking_server_with_uri_passes(hydra_ctx):
    cfg = make("tracking=server", "tracking.uri=http://127.0.0.1:5000")
    assert cfg.tracking.uri == "http://127.0.0.1:5000"
    assert tracking_enabled(cfg)
    validate(cfg)


@pytest.mark.parametrize("path", [None, ""], ids=["unset", "empty"])
def test_model_file_without_path_fails_validate(hydra_ctx, path):
    overrides = ["model=file"] if path is None else ["model=file", "model.path=''"]
    cfg = make(*overrides)
    assert cfg.model.name == "file"
    with pytest.raises(CalibrunError, match=r"model\.path"):
        validate(cfg)


@pytest.mark.parametrize(("overrides", "key", "add"), [
    (["model.path=/models/m.onnx"], "model.path", "add model=file"),
    (["model=digits", "model.path=/models/m.onnx"], "model.path", "add model=file"),
    (["data.path=/data/calib.npz"], "data.path", "data=npy or data=images"),
    (["eval_data.path=/data/eval.npz"], "eval_data.path", "eval_data=npy or eval_data=images"),
], ids=["model-lab", "model-digits", "data-lab", "eval-lab"])
def test_a_path_the_chosen_source_would_ignore_is_refused(hydra_ctx, overrides, key, add):
    """`model.path=m.onnx` without `model=file` used to run the lab's MLP and fail on the user's data with a shape
    error about input 'x' (a helper session's first command on an unseen model): the path is named instead."""
    cfg = make(*overrides)
    with pytest.raises(CalibrunError) as err:
        validate(cfg)
    assert str(err.value).startswith(f"config {key}: is read only with ")
    assert add in str(err.value)


def test_model_file_with_path_passes(hydra_ctx, tmp_path):
    path = str(tmp_path / "model.onnx")
    Path(path).write_bytes(b"")  # validate checks that it is there (what it holds is checked when it is opened)
    cfg = make("model=file", f"model.path={path}")
    assert cfg.model.name == "file"
    assert cfg.model.path == path
    validate(cfg)


# --------------------------------------------------------------------------------------------- lab preset

LAB_PARAMS = {"calibration": "narrow,match,wide", "batches": "1,8,64,512", "format": "qdq,qoperator"}


def lab_jobs(params) -> list[list[str]]:
    """The job override lists, exactly as Hydra's BasicSweeper builds them from hydra.sweeper.params."""
    strings = [f"{key}={value}" for key, value in params.items()]
    parsed = OverridesParser.create().parse_overrides(strings)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


def test_lab_preset_sweeper_params(hydra_ctx):
    cfg = make("experiment=lab", hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=True)
    assert {key: str(value) for key, value in params.items()} == LAB_PARAMS
    # The preset only sets the sweep: the config itself is still the default one.
    assert cfg.calibration.name == "match"
    assert cfg.batches == 64
    assert cfg.format.name == "qdq"
    validate(cfg)


def test_lab_preset_expands_to_24_distinct_jobs(hydra_ctx):
    cfg = make("experiment=lab", hydra_config=True)
    jobs = lab_jobs(cfg.hydra.sweeper.params)
    assert len(jobs) == 24
    as_dicts = [dict(item.split("=", 1) for item in job) for job in jobs]
    triples = {(d["calibration"], d["batches"], d["format"]) for d in as_dicts}
    expected = set(itertools.product(["narrow", "match", "wide"], ["1", "8", "64", "512"], ["qdq", "qoperator"]))
    assert triples == expected


def test_lab_preset_every_job_composes_and_validates(hydra_ctx):
    factors = {"narrow": 0.2, "match": 1.0, "wide": 10.0}
    cfg = make("experiment=lab", hydra_config=True)
    seen = set()
    for job in lab_jobs(cfg.hydra.sweeper.params):
        job_cfg = make("experiment=lab", *job)
        wanted = dict(item.split("=", 1) for item in job)
        assert job_cfg.calibration.name == wanted["calibration"]
        assert job_cfg.calibration.factor == factors[wanted["calibration"]]
        assert job_cfg.batches == int(wanted["batches"])
        assert job_cfg.format.name == wanted["format"]
        validate(job_cfg)
        seen.add((job_cfg.calibration.name, job_cfg.batches, job_cfg.format.name))
    assert len(seen) == 24


# --------------------------------------------------------------------------------------------- type errors


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("batches=abc", "batches"),
        ("calibration.factor=x", "calibration.factor"),
        ("eval.rows=1.5", "eval.rows"),
        ("method.chunk=no", "method.chunk"),
        ("method.symmetric=maybe", "method.symmetric"),
    ],
)
def test_type_error_fails_at_compose_naming_key(hydra_ctx, override, key):
    with pytest.raises(ConfigCompositionException) as info:
        make(override)
    assert key in str(info.value)
    # OmegaConf's own error (the cause) names the full key too, not only the echoed override.
    assert f"full_key: {key}" in error_chain(info.value)


@pytest.mark.parametrize(
    ("override", "group"),
    [("calibration=foo", "calibration"), ("format=xyz", "format"), ("method=nope", "method")],
)
def test_unknown_group_option_fails_at_compose(hydra_ctx, override, group):
    with pytest.raises((MissingConfigException, ConfigCompositionException)) as info:
        make(override)
    message = str(info.value)
    assert f"'{group}/{override.split('=')[1]}'" in message
    assert f"Available options in '{group}'" in message


@pytest.mark.parametrize(("override", "key"), [("foo=1", "foo"), ("calibration.bar=1", "calibration.bar")])
def test_unknown_key_is_rejected(hydra_ctx, override, key):
    with pytest.raises(ConfigCompositionException) as info:
        make(override)
    assert f"'{key}'" in str(info.value)


# --------------------------------------------------------------------------------------------- value errors



@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        pytest.param(["batches=0"], "batches", id="batches=0"),
        pytest.param(["batches=-5"], "batches", id="batches=-5"),
        pytest.param(["calibration.factor=0"], "calibration.factor", id="calibration.factor=0"),
        pytest.param(["calibration.factor=-1"], "calibration.factor", id="calibration.factor=-1"),
        pytest.param(["calibration.factor=inf"], "calibration.factor", id="calibration.factor=inf"),
        pytest.param(["calibration.factor=-inf"], "calibration.factor", id="calibration.factor=-inf"),
        pytest.param(["calibration.factor=nan"], "calibration.factor", id="calibration.factor=nan"),
        pytest.param(["calibration.seed=-1"], "calibration.seed", id="calibration.seed=-1"),
        pytest.param(["eval.rows=0"], "eval.rows", id="eval.rows=0"),
        pytest.param(["eval.seed=-1"], "eval.seed", id="eval.seed=-1"),
        pytest.param(["cache.wait=-1"], "cache.wait", id="cache.wait=-1"),  # -1: filelock would wait for ever
        pytest.param(["cache.wait=nan"], "cache.wait", id="cache.wait=nan"),
        pytest.param(["method.chunk=0"], "method.chunk", id="method.chunk=0"),
        pytest.param(["ort.intra_op_threads=-1"], "ort.intra_op_threads", id="ort.intra_op_threads=-1"),
        pytest.param(["method=percentile", "method.percentile=0"], "method.percentile",
                     id="percentile-method.percentile=0"),
        pytest.param(["method=percentile", "method.percentile=101"], "method.percentile",
                     id="percentile-method.percentile=101"),
        pytest.param(["method=entropy", "method.num_bins=0"], "method.num_bins", id="entropy-method.num_bins=0"),
        pytest.param(["method.moving_average=true", "method.averaging_constant=2"], "method.averaging_constant",
                     id="method.averaging_constant=2"),
        pytest.param(["+foo=1"], "foo", id="added-unknown-key"),
        pytest.param(["+calibration.facter=2"], "calibration.facter", id="added-typo-key"),
    ],
)
def test_value_error_fails_validate_naming_key(hydra_ctx, overrides, key):
    cfg = make(*overrides)  # composes: the type is right, only the value is wrong
    with pytest.raises(CalibrunError) as info:
        validate(cfg)
    assert key in str(info.value)


@pytest.mark.parametrize("value", ["0", "-1", "101", "inf"])
def test_percentile_out_of_range_is_rejected(hydra_ctx, value):
    """Out-of-range percentiles are rejected, in-range ones pass."""
    cfg = make("method=percentile", f"method.percentile={value}")
    assert not 0 < cfg.method.percentile <= 100
    with pytest.raises(CalibrunError, match="percentile"):
        validate(cfg)


@pytest.mark.parametrize("value", ["100", "99.9", "0.5"])
def test_percentile_in_range_passes(hydra_ctx, value):
    cfg = make("method=percentile", f"method.percentile={value}")
    validate(cfg)
    assert calibration_spec(cfg).calibrator_options()["percentile"] == float(value)


# --------------------------------------------------------------------------------------------- upper bounds


@pytest.mark.parametrize(
    ("overrides", "key", "bound"),
    [
        pytest.param(["batches=100001"], "batches", "100000", id="batches-over-bound"),
        pytest.param(["batches=1000000000"], "batches", "100000", id="batches=10**9"),
        pytest.param(["eval.rows=1000001"], "eval.rows", "1000000", id="eval.rows-over-bound"),
        pytest.param(["ort.intra_op_threads=100000"], "ort.intra_op_threads", "256", id="threads=100000"),
        pytest.param(["calibration.seed=4294967296"], "calibration.seed", "4294967295", id="calibration.seed=2**32"),
        pytest.param(["eval.seed=99999999999999999999"], "eval.seed", "4294967295", id="eval.seed-huge"),
        pytest.param(["calibration.factor=1e39"], "calibration.factor", "1e+30", id="factor=1e39"),
        pytest.param(["calibration.factor=1e-40"], "calibration.factor", "1e-30", id="factor=1e-40"),
        pytest.param(["data=images", "data.path=.", "data.crop=[48]"], "data.crop", "[height, width]",
                     id="crop-one-value"),
        pytest.param(["data=images", "data.path=.", "data.crop=[0,192]"], "data.crop", "16384", id="crop-zero"),
        pytest.param(["data=images", "data.path=.", "data.crop=abc"], "data.crop", "[height, width]",
                     id="crop-word"),
        pytest.param(["data=images", "data.path=.", "data.crop=[300,400]"], "data.crop", "data.resize=256",
                     id="crop-wider-than-resize"),
        pytest.param(["eval_data=images", "eval_data.path=.", "eval_data.resize=100000"], "eval_data.resize",
                     "16384", id="resize-huge"),
        pytest.param(["data=images", "data.path=.", "data.letterbox=true", "data.pad_value=2"], "data.pad_value",
                     "0..1", id="pad-value-2"),
        pytest.param(["data=images", "data.path=.", "data.std=[0.2,nan,0.2]"], "data.std", "finite",
                     id="std-nan"),
        pytest.param(["data=images", "data.path=.", "data.resize_mode=crop"], "data.resize_mode",
                     "shorter, stretch, letterbox", id="resize-mode-word"),
        pytest.param(["eval_data=images", "eval_data.path=.", "eval_data.channels=rgba"], "eval_data.channels",
                     "rgb, bgr", id="channels-rgba"),
        pytest.param(["data=images", "data.path=.", "data.layout=chw"], "data.layout", "nchw, nhwc", id="layout-chw"),
        pytest.param(["data=images", "data.path=.", "data.letterbox=true", "data.resize_mode=stretch"],
                     "data.letterbox", "data.resize_mode=stretch", id="letterbox-and-stretch"),
    ],
)
def test_value_over_its_bound_fails_validate_naming_key_and_bound(hydra_ctx, overrides, key, bound):
    cfg = make(*overrides)
    with pytest.raises(CalibrunError) as info:
        validate(cfg)
    message = str(info.value)
    assert message.startswith(f"config {key}")
    assert bound in message
    assert "\n" not in message


@pytest.mark.parametrize("override", ["batches=1e30", "eval.rows=1e30", "batches=1e9", "ort.intra_op_threads=1e6"])
def test_huge_counts_written_as_floats_never_reach_the_work(hydra_ctx, override):
    """Hydra parses 1e30 as a float: the int schema either refuses it at compose time or converts it, and then
    the upper bound refuses it; either way, one message naming the key."""
    key = override.split("=")[0]
    try:
        cfg = make(override)
    except ConfigCompositionException as exc:
        message = str(exc)
    else:
        with pytest.raises(CalibrunError, match=f"^config {re.escape(key)}: must be in") as info:
            validate(cfg)
        message = str(info.value)
    assert key in message


@pytest.mark.parametrize(
    "overrides",
    [
        ["batches=100000", "eval.rows=1000000", "ort.intra_op_threads=256", "calibration.seed=4294967295",
         "eval.seed=0", "calibration.factor=1e30"],
        ["calibration.factor=1e-30"],
        ["data=images", "data.path=.", "data.crop=[48,192]"],
        ["data=images", "data.path=.", "data.crop=[48,48]", "data.resize=48"],
        ["eval_data=images", "eval_data.path=.", "eval_data.crop=[416,416]", "eval_data.letterbox=true",
         "eval_data.pad_value=0.447", "eval_data.resize=1"],
        ["eval_data=images", "eval_data.path=.", "eval_data.resize_mode=stretch", "eval_data.crop=[48,320]",
         "eval_data.channels=bgr", "eval_data.layout=nhwc"],
        ["data=npy", "data.path=.", "++data.inputs.sr.value=16000", "++data.inputs.state.batch_axis=1",
         "++eval_data.inputs.sr.value=[1,2]"],
    ],
    ids=["every-bound-itself", "smallest-factor", "crop-pair", "square-pair", "letterbox", "image-modes",
         "inputs"],
)
def test_values_at_their_bounds_pass(hydra_ctx, overrides):
    validate(make(*overrides))


def test_image_mean_and_std_default_to_the_one_imagenet_constant(hydra_ctx):
    from calibrun.data.images import IMAGENET_MEAN, IMAGENET_STD, ImageTransform

    cfg = make("data=images", "data.path=.", "eval_data=images", "eval_data.path=y")
    for key in ("data", "eval_data"):
        assert list(cfg[key].mean) == list(IMAGENET_MEAN)
        assert list(cfg[key].std) == list(IMAGENET_STD)
    assert ImageTransform().mean == IMAGENET_MEAN
    assert ImageTransform().std == IMAGENET_STD
    conf = Path(CONF_DIR)
    for path in [*conf.glob("data/*.yaml"), *conf.glob("eval_data/*.yaml")]:  # not repeated in the yaml files
        assert "0.485" not in path.read_text()
        assert "0.229" not in path.read_text()
    assert list(make("data=images", "data.path=.", "data.mean=[0.5,0.5,0.5]").data.mean) == [0.5, 0.5, 0.5]


# --- issue 25: sweeps over paths, sources checked before any work, typos, options of another method ---


@pytest.mark.parametrize(("overrides", "swept"), [
    (["data=npy"], ["data.path"]),
    (["eval_data=images"], ["eval_data.path"]),
    (["model=file"], ["model.path"]),
])
def test_the_sweeps_config_waits_for_the_jobs_on_a_swept_path(hydra_ctx, overrides, swept):
    """`data.path=a.npy,b.npy` leaves data.path unset in the sweep's own config (Hydra applies a swept value to
    each job only): the sweep's check must not refuse it; each job's config is checked in full."""
    cfg = make(*overrides)
    with pytest.raises(CalibrunError, match=re.escape(swept[0])):
        validate(cfg)
    validate(cfg, swept)


def test_a_missing_or_unreadable_source_is_refused_before_any_work(hydra_ctx, tmp_path):
    with pytest.raises(CalibrunError, match=r"^config data\.path: .*nothere\.npy not found$"):
        validate(make("data=npy", f"data.path={tmp_path / 'nothere.npy'}"))
    with pytest.raises(CalibrunError, match=r"^config eval_data\.path: .*nothere not found$"):
        validate(make("eval_data=images", f"eval_data.path={tmp_path / 'nothere'}"))
    with pytest.raises(CalibrunError, match=r"^config model\.path: .* is not a file"):
        validate(make("model=file", f"model.path={tmp_path}"))
    if os.geteuid() != 0:  # root reads everything
        locked = tmp_path / "locked.npy"
        locked.write_bytes(b"")
        locked.chmod(0)
        with pytest.raises(CalibrunError, match="not readable"):
            validate(make("data=npy", f"data.path={locked}"))


def test_a_sweeps_missing_path_is_refused_before_any_job(hydra_ctx, tmp_path):
    from calibrun.sweep import check_swept_paths, sweep_values

    here = tmp_path / "a.npy"
    here.write_bytes(b"")
    cfg = make("data=npy", hydra_config=True)
    cfg.hydra.overrides.task = ["data=npy", f"data.path={here},{tmp_path / 'b.npy'}"]
    assert sweep_values(cfg) == {"data.path": [str(here), str(tmp_path / "b.npy")]}
    with pytest.raises(CalibrunError, match=r"^config data\.path: .*b\.npy not found$"):
        check_swept_paths(cfg)


@pytest.mark.parametrize(("typo", "meant"), [
    ("batchs", "batches"), ("calibration.factr", "calibration.factor"), ("data.pth", "data.path"),
    ("methd", "method"), ("factor", "calibration.factor"), ("eval.row", "eval.rows"),
])
def test_a_typo_names_the_closest_valid_keys(typo, meant):
    from calibrun.__main__ import check_keys

    assert calibrun_config.close_keys(typo)[0] == meant
    for override in (f"{typo}=3", f"+{typo}=3", f"++{typo}=3"):  # Hydra's "+key" advice ends here too
        message = check_keys(["-m", override])
        assert message.startswith(f"config {typo}: is not a calibrun setting; did you mean {meant}"), message


def test_settings_groups_and_hydra_keys_pass_the_typo_check():
    from calibrun.__main__ import check_keys

    assert check_keys(["-m", "batches=1,2", "data.path=x", "+experiment=lab", "experiment=lab", "hydra.job.chdir=true",
                       "hydra/launcher=joblib", "method=entropy", "method.num_bins=512", "cluster=ray",
                       "eval_data.resize=8", "--cfg", "job"]) is None


def test_an_option_of_a_method_that_is_not_selected_is_refused(hydra_ctx):
    with pytest.raises(CalibrunError, match=r"^config method\.percentile: is not an option of method=entropy "
                                            r"\(only of method=percentile\)"):
        validate(make("method=entropy", "method.percentile=200"))
    with pytest.raises(CalibrunError, match=r"method\.num_bins: is not an option of method=minmax"):
        validate(make("method.num_bins=512"))
    validate(make("method=percentile", "method.percentile=99.9"))
    validate(make("method=entropy", "method.num_bins=512", "method.symmetric=true"))
    # a sweep over methods (`method=entropy,percentile method.percentile=99.9`) sets it for the methods that read it
    validate(make("method.percentile=99.9"), swept=["method"])
    validate(make("method=entropy", "method.percentile=99.9"), sweep_job=True)
    # ... but a swept option of a method the sweep does not select is refused before any job
    with pytest.raises(CalibrunError, match="method.percentile"):
        validate(make("method=entropy"), swept=["method.percentile"])


def test_the_digits_data_calibrun_makes_on_first_use_need_not_exist_yet(hydra_ctx, tmp_path):
    validate(make("experiment=digits", f"cache.dir={tmp_path / 'cache'}"))  # exported by the job (model=digits)
    with pytest.raises(CalibrunError, match="data.path"):
        validate(make("experiment=digits", f"cache.dir={tmp_path / 'cache'}", f"data.path={tmp_path / 'x.npz'}"))
