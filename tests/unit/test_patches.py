"""calibrun.core.patches: each patch of Hydra's, MLflow's or onnxruntime's internals keeps every record the same,
applies only to the versions it was written for, and CALIBRUN_PATCHES=off turns them all off.

- compose_faster: Hydra's compositions of a sweep's jobs give the same configs with it as without
  it, and a cached config file is never shared between two compositions.
- compose_once: Hydra's composition only to read hydra.mode is skipped when it cannot be set;
  the mode Hydra picks is the same.
- commit_without_fsync: the store's SQLite connections run synchronous=NORMAL, in WAL mode.
- rewire_by_membership: onnxruntime's quantiser changes the same node inputs and writes the same bytes;
  index_initializer_lookups: its index answers as the linear scan, and every quantisation path writes the same bytes.
The quick exit (calibrun.__main__) on a real tracked sweep: tests/e2e/test_quick_exit.py.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from functools import partial
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from mlflow import MlflowClient
from omegaconf import OmegaConf

from calibrun import __main__ as app
from calibrun import tracking
from calibrun.config import register
from calibrun.core import patches
from calibrun.lab.model import write_lab_model
from tests.stores import fresh_mlflow_store

JOBS = [["calibration=narrow", "batches=1", "format=qdq"], ["calibration=wide", "batches=64", "format=qoperator"],
        ["method=entropy", "method.num_bins=512", "model=lab"], ["experiment=lab", "calibration=match"]]


def _compose_all(loader: ConfigLoaderImpl) -> list[str]:
    master = loader.load_configuration("config", ["hydra.sweep.dir=/tmp/x"], RunMode.MULTIRUN)
    return [OmegaConf.to_yaml(loader.load_sweep_config(master, job)) for job in JOBS]


def _classes():
    """Hydra's config source classes as Hydra uses them (its plugin discovery imports its core plugins again)."""
    plugins = "hydra._internal.core_plugins."
    return (importlib.import_module(plugins + "importlib_resources_config_source").ImportlibResourcesConfigSource,
            importlib.import_module(plugins + "structured_config_source").StructuredConfigSource)


@pytest.fixture
def loader(monkeypatch):
    """A ConfigLoaderImpl on calibrun's configs (plugins discovered); Hydra's classes restored after the test."""
    register()
    GlobalHydra.instance().clear()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://calibrun.conf"))
    loader.load_configuration("config", [], RunMode.RUN)
    files, structured = _classes()
    monkeypatch.setattr(files, "_read_config", files._read_config)
    monkeypatch.setattr(structured, "__deepcopy__", None, raising=False)
    monkeypatch.delattr(structured, "__deepcopy__")
    return loader


def test_compose_faster_gives_the_same_configs(loader):
    before = _compose_all(loader)
    patches.compose_faster()
    ImportlibResourcesConfigSource, StructuredConfigSource = _classes()
    assert hasattr(StructuredConfigSource, "__deepcopy__")
    assert getattr(ImportlibResourcesConfigSource._read_config, "calibrun_cached", False)
    patched = ImportlibResourcesConfigSource._read_config
    patches.compose_faster()  # twice (a second sweep in the process): still one layer
    assert ImportlibResourcesConfigSource._read_config is patched
    after = _compose_all(loader)
    assert after == before
    assert "calibration:\n  name: narrow" in after[0]
    assert "name: qoperator" in after[1]


def test_a_cached_config_file_is_not_shared_between_compositions(loader):
    patches.compose_faster()
    source = next(s for s in loader.repository.sources if s.path == "calibrun.conf")
    first = source.load_config("calibration/narrow.yaml")
    first.config.factor = 123.0  # a composition merging into (or editing) what it loaded
    first.header["package"] = "changed"
    second = source.load_config("calibration/narrow.yaml")
    assert second.config.factor != 123.0
    assert second.header.get("package") != "changed"
    assert second.config is not first.config


def test_the_structured_source_copy_shares_the_config_store(loader):
    patches.compose_faster()
    source = next(s for s in loader.repository.sources if isinstance(s, _classes()[1]))
    copied = copy.deepcopy(source)
    assert copied is not source
    assert copied.store is source.store
    assert copied.load_config("hydra/config").config == source.load_config("hydra/config").config


def test_compose_faster_before_hydra_discovers_its_plugins_still_holds_after(tmp_path):
    """calibrun.__main__ applies compose_faster before Hydra runs, and Hydra's plugin discovery defines the config
    source classes anew: the classes Hydra uses afterwards must be the changed ones (a fresh process: this one has
    discovered its plugins already)."""
    import subprocess
    import sys

    code = ("import importlib\n"
            "from calibrun.core.patches import compose_faster\n"
            "compose_faster()\n"
            "from hydra.core.plugins import Plugins\n"
            "Plugins.instance()\n"
            "p = 'hydra._internal.core_plugins.'\n"
            "s = importlib.import_module(p + 'structured_config_source').StructuredConfigSource\n"
            "f = importlib.import_module(p + 'importlib_resources_config_source').ImportlibResourcesConfigSource\n"
            "print(hasattr(s, '__deepcopy__'), getattr(f._read_config, 'calibrun_cached', False))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]


def test_tracker_connections_commit_without_fsync(tmp_path):
    uri = fresh_mlflow_store(tmp_path)
    tracker = tracking.Tracker(uri, "speed")
    run_id = tracker.start_run("r", {})
    tracker.log(run_id, params={"a": 1}, metrics={"m": 2.0})
    tracker.finish(run_id)
    engine = tracker.client._tracking_client.store.engine
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "wal"
    assert MlflowClient(uri).get_run(run_id).data.metrics == {"m": 2.0}


def test_logging_a_model_does_not_map_every_installed_file_and_a_mismatch_still_warns(tmp_path, monkeypatch):
    """MLflow's requirement check maps every installed distribution's files (~0.3 s); calibrun's pins of installed
    versions skip it (patches.check_pins_cheaply); a pin that is not installed still gets MLflow's warning."""
    import logging

    from mlflow.utils import environment, requirements_utils

    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)  # as in a fresh process
    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)
    mapped = []
    real = requirements_utils.importlib_metadata.packages_distributions
    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions",
                        lambda: mapped.append(1) or real())
    tracker = tracking.open_tracker(fresh_mlflow_store(tmp_path), "calibrun")
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    assert tracker.log_model(run_id, write_lab_model(tmp_path / "lab.onnx"), "int8")
    tracker.finish(run_id)
    assert mapped == []

    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("mlflow.utils.requirements_utils").addHandler(handler)
    try:
        environment.warn_dependency_requirement_mismatches(["onnx==0.0.1"])
    finally:
        logging.getLogger("mlflow.utils.requirements_utils").removeHandler(handler)
    assert mapped == [1]
    assert any("onnx" in w and "0.0.1" in w for w in warnings), warnings


def test_compose_each_job_once_gives_the_same_configs_and_keeps_none_after_launch(loader, monkeypatch):
    """A sweep's validation pass composes each job and the launcher composes it again; with the patch the second
    composition is the first one's config (the same yaml), handed out once and then forgotten."""
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", ConfigLoaderImpl.load_sweep_config)
    master = loader.load_configuration("config", ["hydra.sweep.dir=/tmp/x"], RunMode.MULTIRUN)
    plain = [OmegaConf.to_yaml(loader.load_sweep_config(master, job)) for job in JOBS]
    patches.compose_each_job_once()
    patched = ConfigLoaderImpl.load_sweep_config
    patches.compose_each_job_once()  # twice: still one layer
    assert ConfigLoaderImpl.load_sweep_config is patched
    validated = [loader.load_sweep_config(master, job) for job in JOBS]
    launched = [loader.load_sweep_config(master, job) for job in JOBS]
    assert [a is b for a, b in zip(validated, launched, strict=True)] == [True] * len(JOBS)
    assert [OmegaConf.to_yaml(c) for c in launched] == plain
    again = loader.load_sweep_config(master, JOBS[0])  # handed out once: a third composition is a new config
    assert again is not launched[0]
    assert OmegaConf.to_yaml(again) == plain[0]


@pytest.mark.parametrize("keep", [256, 1])
def test_compose_by_group_choice_gives_the_same_configs_and_composes_each_choice_once(keep, loader, monkeypatch):
    """Jobs that choose the same groups share their defaults list and merged config: each still gets its own
    config, the same yaml as Hydra's (its own other overrides applied), and editing one never shows in another.
    Beyond COMPOSED_KEEP choices, a job is composed as Hydra does, with the same result."""
    from hydra._internal import config_loader_impl

    monkeypatch.setattr(patches, "COMPOSED_KEEP", keep)

    monkeypatch.setattr(config_loader_impl, "create_defaults_list", config_loader_impl.create_defaults_list)
    monkeypatch.setattr(ConfigLoaderImpl, "_compose_config_from_defaults_list",
                        ConfigLoaderImpl._compose_config_from_defaults_list)
    jobs = [*JOBS, ["calibration=narrow", "batches=8", "format=qdq"],  # job 0's groups, other values
            ["calibration=narrow", "batches=1", "format=qdq", "quant.per_channel=true"],
            ["batches=8", "format=qdq", "calibration=narrow"], ["experiment=lab", "calibration=wide"], JOBS[1]]
    master = loader.load_configuration("config", ["hydra.sweep.dir=/tmp/x"], RunMode.MULTIRUN)
    plain = [OmegaConf.to_yaml(loader.load_sweep_config(master, job)) for job in jobs]
    patches.compose_by_group_choice()
    calls = []
    compose = ConfigLoaderImpl._compose_config_from_defaults_list
    monkeypatch.setattr(ConfigLoaderImpl, "_compose_config_from_defaults_list",
                        lambda self, defaults, repo: calls.append(defaults) or compose(self, defaults, repo))
    configs = [loader.load_sweep_config(master, job) for job in jobs]
    assert [OmegaConf.to_yaml(c) for c in configs] == plain
    assert "batches: 8" in plain[4]
    assert "per_channel: true" in plain[5]
    # jobs 0, 4 and 5 share one list; job 6 chooses the same groups in another order: its own (the key keeps the order);
    # job 8 repeats job 1: composed again only when job 1's choice was not kept
    assert len({id(defaults) for defaults in calls}) == (6 if keep > 1 else 7)  # calls keeps them alive: ids unique
    configs[0].calibration.factor = 123.0  # one job's config is its own
    assert loader.load_sweep_config(master, jobs[4]).calibration.factor != 123.0


@pytest.mark.parametrize("switch", ["off", "OFF", "0", "false", "no"])
def test_calibrun_patches_off_leaves_every_library_as_shipped(switch, monkeypatch, loader):
    from hydra._internal.hydra import Hydra
    from mlflow.utils import environment

    monkeypatch.setenv("CALIBRUN_PATCHES", switch)
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)
    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", ConfigLoaderImpl.load_sweep_config)
    from onnxruntime.quantization.onnx_model import ONNXModel

    monkeypatch.setattr(environment, "warn_dependency_requirement_mismatches",
                        environment.warn_dependency_requirement_mismatches)
    from onnxruntime.quantization import qdq_quantizer, quant_utils

    for attr in ("replace_input_of_all_nodes", "replace_node_input", "get_initializer", "initializer_extend"):
        monkeypatch.setattr(ONNXModel, attr, vars(ONNXModel)[attr])
    for module in (quant_utils, qdq_quantizer):
        monkeypatch.setattr(module, "find_by_name", module.find_by_name)

    from hydra._internal import config_loader_impl

    monkeypatch.setattr(config_loader_impl, "create_defaults_list", config_loader_impl.create_defaults_list)
    monkeypatch.setattr(ConfigLoaderImpl, "_compose_config_from_defaults_list",
                        ConfigLoaderImpl._compose_config_from_defaults_list)

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from omegaconf import omegaconf

    monkeypatch.setattr(BasicSweeper, "validate_batch_is_legal", BasicSweeper.validate_batch_is_legal)
    monkeypatch.setattr(omegaconf, "get_omega_conf_dumper", omegaconf.get_omega_conf_dumper)

    def state():
        return (Hydra.get_mode, ConfigLoaderImpl.load_sweep_config, config_loader_impl.create_defaults_list,
                BasicSweeper.validate_batch_is_legal, omegaconf.get_omega_conf_dumper,
                ConfigLoaderImpl._compose_config_from_defaults_list, *(vars(c).get(a) for c, a in zip(
            _classes(), ("_read_config", "__deepcopy__"), strict=True)),
            environment.warn_dependency_requirement_mismatches, *(vars(ONNXModel)[a] for a in (
                "replace_input_of_all_nodes", "replace_node_input", "get_initializer", "initializer_extend")),
            quant_utils.find_by_name, qdq_quantizer.find_by_name)

    before = state()
    patches.compose_once()
    patches.compose_faster()
    patches.compose_each_job_once()
    patches.compose_by_group_choice()
    patches.yaml_in_c()
    assert not patches.before_launch(lambda: None)  # off: the sweep waits for its store at once
    patches.check_pins_cheaply()
    patches.rewire_by_membership()
    patches.index_initializer_lookups()
    after = state()
    assert after == before
    monkeypatch.setenv("CALIBRUN_PATCHES", "on")
    patches.compose_each_job_once()
    assert ConfigLoaderImpl.load_sweep_config is not before[1]  # the same call patches when switched on


def test_a_library_version_the_patches_were_not_written_for_is_left_as_shipped(monkeypatch, tmp_path):
    from hydra._internal.hydra import Hydra

    monkeypatch.delenv("CALIBRUN_PATCHES", raising=False)
    assert patches.enabled("hydra-core")
    assert patches.enabled("mlflow")
    versions = {"hydra-core": "1.4.0", "mlflow": "4.0.0"}
    monkeypatch.setattr(patches, "_version", versions.get)
    assert not patches.enabled("hydra-core")
    assert not patches.enabled("mlflow")
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)
    get_mode = Hydra.get_mode
    patches.compose_once()
    assert Hydra.get_mode is get_mode
    monkeypatch.setattr(patches, "_version", {"hydra-core": "1.3.9"}.get)  # another 1.3 release: patched
    patches.compose_once()
    assert Hydra.get_mode is not get_mode


def test_yaml_in_c_writes_configs_that_load_the_same_and_quotes_what_would_read_as_another_type(loader,
                                                                                                monkeypatch):
    from omegaconf import omegaconf

    monkeypatch.setattr(omegaconf, "get_omega_conf_dumper", omegaconf.get_omega_conf_dumper)
    master = loader.load_configuration("config", ["hydra.sweep.dir=/tmp/x"], RunMode.MULTIRUN)
    tricky = OmegaConf.create({"a": "1.0", "b": "true", "c": "0x10", "d": "x: y", "e": "${a}", "f": "é " * 60,
                               "g": "off", "h": ["1e3", 1e3, None, "null"], "i": " two  spaces  "})
    configs = [master, tricky, *(loader.load_sweep_config(master, job) for job in JOBS)]
    python = [OmegaConf.to_yaml(c) for c in configs]
    patches.yaml_in_c()
    assert getattr(omegaconf.get_omega_conf_dumper, patches.PATCHED, False)
    assert "CDumper" in omegaconf.get_omega_conf_dumper().__name__
    c = [OmegaConf.to_yaml(c) for c in configs]
    assert c[1] == python[1]  # short strings: the same text
    assert c != python  # the help texts are folded elsewhere: the C emitter really wrote them
    for text_c, text_python, config in zip(c, python, configs, strict=True):
        loaded = OmegaConf.to_container(OmegaConf.create(text_c))
        assert loaded == OmegaConf.to_container(OmegaConf.create(text_python)) == OmegaConf.to_container(config)


MODE_CASES = [[], ["calibration=wide", "batches=3"], ["experiment=lab"], ["experiment=digits"], ["experiment=search"],
              ["+experiment=lab", "format=qoperator"], ["hydra.mode=MULTIRUN"], ["hydra.mode=RUN", "batches=2"],
              ["+hydra.mode=MULTIRUN"], ["calibration=nope"], ["hydra.searchpath=[pkg://calibrun.conf]"]]


@pytest.fixture
def main_hydra(monkeypatch):
    """The Hydra instance `python -m calibrun` makes (its search path), with Hydra's own get_mode restored after."""
    from hydra._internal.hydra import Hydra

    register()
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2("calibrun", create_config_search_path(f"pkg://{app.CONFIG_PACKAGE}"))
    yield hydra
    GlobalHydra.instance().clear()


def test_compose_once_gives_hydras_mode_and_composes_only_when_the_command_line_could_set_it(main_hydra,
                                                                                              monkeypatch):
    from hydra._internal.hydra import Hydra

    original = Hydra.get_mode
    expected = {tuple(case): original(main_hydra, "config", list(case)) for case in MODE_CASES}
    assert expected[("hydra.mode=MULTIRUN",)] == RunMode.MULTIRUN  # the cases can tell the two answers apart
    assert expected[("hydra.mode=RUN", "batches=2")] == RunMode.RUN
    patches.compose_once()
    patched = Hydra.get_mode
    patches.compose_once()  # twice: still one layer
    assert Hydra.get_mode is patched
    assert patched.hydras is original
    composed = []

    def counting(self, config_name, overrides):
        composed.append(list(overrides))
        return original(self, config_name, overrides)

    monkeypatch.setattr(patched, "hydras", counting)
    for case in MODE_CASES:
        assert patched(main_hydra, "config", list(case)) == expected[tuple(case)], case
    assert composed == [["hydra.mode=MULTIRUN"], ["hydra.mode=RUN", "batches=2"], ["+hydra.mode=MULTIRUN"],
                        ["hydra.searchpath=[pkg://calibrun.conf]"]]
    assert patched(main_hydra, "other", []) == original(main_hydra, "other", [])  # another primary config: Hydra's
    assert composed[-1] == []


def test_no_calibrun_config_sets_the_hydra_mode(main_hydra):
    """What compose_once relies on: the default and every config that may write Hydra's settings (the presets
    of the _global_ package: experiments, clusters) leave hydra.mode unset."""
    conf = Path(app.__file__).parents[1] / "conf"
    presets = sorted(p for p in conf.rglob("*.yaml") if "@package _global_" in p.read_text())
    assert {p.parent.name for p in presets} == {"experiment", "cluster"}
    plus = {"experiment": "", "cluster": "+"}  # experiment is in the defaults list (null), cluster is added
    for overrides in [[]] + [[f"{plus[p.parent.name]}{p.parent.name}={p.stem}"] for p in presets]:
        cfg = main_hydra.compose_config("config", overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False,
                                        validate_sweep_overrides=False)
        assert cfg.hydra.mode is None, overrides


def test_the_guards_stay_with_the_speed_patches_off_and_leave_other_hydra_versions_alone(monkeypatch):
    """guard_callbacks and on_full_disk keep guarantees (no unknown callback runs; a full disk is one line): the
    CALIBRUN_PATCHES switch does not turn them off; a Hydra they were not written for is left as shipped."""
    import errno

    from hydra._internal.callbacks import Callbacks
    from hydra.core import utils as hydra_utils

    monkeypatch.setattr(Callbacks, "__init__", Callbacks.__init__)
    monkeypatch.setattr(hydra_utils, "_save_config", hydra_utils._save_config)
    shipped = (Callbacks.__init__, hydra_utils._save_config)
    monkeypatch.setattr(patches, "_version", {"hydra-core": "1.4.0"}.get)
    patches.guard_callbacks(lambda config: None)
    patches.on_full_disk(lambda exc, folder, name: None)
    assert (Callbacks.__init__, hydra_utils._save_config) == shipped
    monkeypatch.setattr(patches, "_version", {"hydra-core": "1.3.2"}.get)
    monkeypatch.setenv("CALIBRUN_PATCHES", "off")
    checked, full = [], []
    patches.guard_callbacks(checked.append)
    patches.on_full_disk(lambda exc, folder, name: full.append((exc.errno, folder, name)))
    assert Callbacks.__init__ is not shipped[0]
    Callbacks(None)
    assert checked == [None]

    def write(errno_value):
        def save(cfg, filename, output_dir):
            raise OSError(errno_value, "x")
        return save

    for code, reported in ((errno.ENOSPC, True), (errno.EACCES, False)):
        monkeypatch.setattr(hydra_utils, "_save_config", write(code))
        patches.on_full_disk(lambda exc, folder, name: full.append((exc.errno, folder, name)))
        with pytest.raises(OSError, match="x"):
            hydra_utils._save_config({}, "config.yaml", "/out")
        assert bool(full) is reported
        full.clear()


def test_rewire_by_membership_changes_the_same_inputs_as_onnxruntime(monkeypatch):
    """The replacement changes exactly the inputs onnxruntime's loop (replace_node_input on every node) changes:
    a tensor read twice by one node, by several nodes, and not at all."""
    from onnx import helper
    from onnxruntime.quantization.onnx_model import ONNXModel

    monkeypatch.setattr(ONNXModel, "replace_input_of_all_nodes", ONNXModel.replace_input_of_all_nodes)
    monkeypatch.setattr(ONNXModel, "replace_node_input", vars(ONNXModel)["replace_node_input"])
    monkeypatch.delenv("CALIBRUN_PATCHES", raising=False)

    def graph():
        nodes = [helper.make_node("Add", ["a", "a"], ["b"], name="twice"),
                 helper.make_node("Mul", ["b", "c"], ["d"], name="other"),
                 helper.make_node("Add", ["d", "a"], ["e"], name="again")]
        return helper.make_model(helper.make_graph(nodes, "g", [], []))

    expected = graph()
    for node in expected.graph.node:  # onnxruntime's own loop, node by node
        ONNXModel.replace_node_input(node, "a", "a_dq")
    patches.rewire_by_membership()
    patches.rewire_by_membership()  # once per process
    assert getattr(ONNXModel.replace_input_of_all_nodes, patches.PATCHED, False)
    model = ONNXModel(graph())
    model.replace_input_of_all_nodes("a", "a_dq")
    model.replace_input_of_all_nodes("absent", "x")
    assert [list(n.input) for n in model.model.graph.node] == [list(n.input) for n in expected.graph.node] == \
        [["a_dq", "a_dq"], ["b", "c"], ["d", "a_dq"]]


def test_rewire_from_the_reader_index_changes_what_onnxruntimes_loop_changes(monkeypatch):
    """Inside indexed_lookups() the rewiring answers from the reader index (_Readers): through the changes the
    quantiser makes between rewirings (nodes appended, a rewired tensor rewired again, a node rewired on its own by
    replace_node_input, a node removed, the nodes reordered as topological_sort does, a node removed and another
    appended), every step changes the same inputs as onnxruntime's own loop."""
    from onnx import helper
    from onnxruntime.quantization.onnx_model import ONNXModel

    monkeypatch.setattr(ONNXModel, "replace_input_of_all_nodes", ONNXModel.replace_input_of_all_nodes)
    monkeypatch.setattr(ONNXModel, "replace_node_input", vars(ONNXModel)["replace_node_input"])
    monkeypatch.delenv("CALIBRUN_PATCHES", raising=False)
    original = ONNXModel.replace_node_input

    def graph():
        nodes = [helper.make_node("Add", ["a", "a"], ["b"], name="twice"),
                 helper.make_node("Mul", ["b", "c"], ["d"], name="other"),
                 helper.make_node("Add", ["d", "a"], ["e"], name="again")]
        return helper.make_model(helper.make_graph(nodes, "g", [], []))

    def rewire(model, old, new):  # onnxruntime's loop
        for node in model.graph.node:
            original(node, old, new)

    patches.rewire_by_membership()
    ours, theirs = ONNXModel(graph()), graph()
    steps = [
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("a", "a_dq"),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("a_dq", "a_dq2"),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("a_dq2", "a_dq"),
        lambda m, patched: (m.graph() if patched else m.graph).node.extend(
            [helper.make_node("Relu", ["d"], ["f"]), helper.make_node("Add", ["f", "d"], ["g"])]),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("d", "d_dq"),
        lambda m, patched: (ONNXModel.replace_node_input if patched else original)(
            (m.graph() if patched else m.graph).node[1], "c", "c_alone"),  # a node rewired on its own
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("c_alone", "c_dq"),
        lambda m, patched: (m.graph() if patched else m.graph).node.remove(
            (m.graph() if patched else m.graph).node[0]),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("b", "b_dq"),
        lambda m, patched: reorder(m.graph() if patched else m.graph),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("f", "f_dq"),
        lambda m, patched: swap(m.graph() if patched else m.graph),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("e", "e_dq"),
        lambda m, patched: (m.replace_input_of_all_nodes if patched else partial(rewire, m))("absent", "x"),
    ]

    def swap(graph):  # a node removed and another appended: the same length
        graph.node.remove(graph.node[1])
        graph.node.extend([helper.make_node("Relu", ["e"], ["h"])])

    def reorder(graph):  # as ONNXModel.topological_sort: cleared and extended, the last node kept last
        nodes = list(graph.node)
        reordered = [*nodes[:-1][::-1], nodes[-1]]
        graph.ClearField("node")
        graph.node.extend(reordered)

    with patches.indexed_lookups():
        for number, step in enumerate(steps):
            step(ours, True)
            step(theirs, False)
            assert [list(n.input) for n in ours.model.graph.node] == [list(n.input) for n in theirs.graph.node], number
    assert [list(n.input) for n in theirs.graph.node] == [["d_dq"], ["b_dq", "c_dq"], ["f_dq", "d_dq"], ["e_dq"]]


def test_quantize_writes_the_same_bytes_with_and_without_the_onnxruntime_patch(tmp_path):
    """The lab model quantised in two processes, CALIBRUN_PATCHES on and off: the same bytes."""
    import subprocess
    import sys

    write_lab_model(tmp_path / "lab.onnx")
    options = {"default": {}, "per_channel": {"per_channel": True}, "int16": {"activation_type": "QInt16",
               "weight_type": "QInt16"}, "qoperator": {"format": "qoperator"}, "excluded": {"nodes_to_exclude":
               ("fc2_matmul",)}, "mixed": {"tensor_types": {"h": "QInt16"}}, "reduce_range": {"reduce_range": True}}
    script = ("import sys, json; from pathlib import Path; from calibrun.model import open_float_model; "
              "from calibrun.quant.quantize import QuantOptions, quantize_lab; "
              "[quantize_lab(open_float_model(sys.argv[1]), Path(sys.argv[2]) / f'{name}.onnx', 0, 1.0, 2, "
              "options=QuantOptions(**kw)) for name, kw in json.loads(sys.argv[3]).items()]")
    models = {}
    for switch in ("on", "off"):
        out = tmp_path / switch
        out.mkdir()
        env = {**os.environ, "CALIBRUN_PATCHES": switch, "CALIBRUN_CACHE": str(tmp_path / f"cache_{switch}")}
        proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "lab.onnx"), str(out),
                               json.dumps(options)], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        models[switch] = {name: (out / f"{name}.onnx").read_bytes() for name in options}
    assert models["on"] == models["off"]
    assert len(set(models["on"].values())) == len(options)  # each option changed the model: each path was taken


def test_initializer_index_answers_as_the_linear_scan_through_appends_removals_and_reorders():
    """_Names (index_initializer_lookups' index) gives find_by_name's answer, the first item of the name or None,
    on a repeated field of TensorProtos changed between look-ups the ways the quantiser and its helpers change it."""
    from onnx import TensorProto, helper
    from onnxruntime.quantization.quant_utils import find_by_name

    field = helper.make_graph([], "g", [], []).initializer

    made = iter(range(1000))

    def tensor(name, dtype=TensorProto.FLOAT):  # each with its own value: equal protos are the same item
        return helper.make_tensor(name, dtype, [1], [float(next(made))] if dtype == TensorProto.FLOAT else [0])

    def same(names, probes=("a", "b", "c", "d", "e", "dup", "absent", "")):
        for probe in probes:
            got, want = names.find(probe), find_by_name(probe, field)
            assert (got is None) == (want is None), probe
            if want is not None:
                assert got == want, probe  # the same item: the first of its name

    field.extend([tensor("a"), tensor("dup"), tensor("b"), tensor("dup")])
    names = patches._Names(field)
    same(names)
    field.append(tensor("c"))  # grown
    field.extend([tensor("d"), tensor("dup")])
    same(names)
    field.remove(field[0])  # a removal: shorter
    same(names)
    field.remove(field[1])
    field.append(tensor("e"))  # removed then appended: the same length; asked first for the new name (no hit has
    same(names, ("e",))  # shown the index a moved item yet)
    same(names)
    items = list(field)[::-1]  # reordered in place, the same length and (here) the same last name kept
    items[0], items[-1] = items[-1], items[0]
    while len(field):
        field.pop()
    field.extend(items)
    same(names)
    assert not names.float8
    field.append(tensor("f8", TensorProto.FLOAT8E4M3FN))
    same(names, ("f8", "a"))
    assert names.sync().float8


def test_hydra_errors_are_one_line_with_their_cause_and_a_groups_options():
    from hydra.errors import ConfigCompositionException, MissingConfigException

    from calibrun.core.patches import _one_line

    merged = ConfigCompositionException("Error merging override batches=abc")
    merged.__cause__ = ValueError("Value 'abc' of type 'str' could not be converted to Integer\n    full_key: "
                                  "batches\n    object_type=Config")
    assert _one_line(merged) == ("Error merging override batches=abc; Value 'abc' of type 'str' could not be "
                                 "converted to Integer")
    missing = MissingConfigException("In 'config': Could not find 'calibration/foo'\n\nAvailable options in "
                                     "'calibration':\n\tmatch\n\tnarrow\n\twide\nConfig search path:\n\tprovider=hydra")
    assert _one_line(missing) == ("In 'config': Could not find 'calibration/foo'; Available options in "
                                  "'calibration': match, narrow, wide")
