"""The per-job overhead cuts keep every record the same (issue 14).

- compose_faster (calibrun.sweep): Hydra's compositions of a sweep's jobs give the same configs with it as without
  it, and a cached config file is never shared between two compositions.
- commits without fsync (calibrun.tracking): the store's SQLite connections run synchronous=NORMAL, in WAL mode.
The quick exit (calibrun.__main__) on a real tracked sweep: tests/e2e/test_quick_exit.py.
"""

from __future__ import annotations

import copy
import importlib

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from mlflow import MlflowClient
from omegaconf import OmegaConf

from calibrun import sweep, tracking
from calibrun.config import register
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
    sweep.compose_faster()
    ImportlibResourcesConfigSource, StructuredConfigSource = _classes()
    assert hasattr(StructuredConfigSource, "__deepcopy__")
    assert getattr(ImportlibResourcesConfigSource._read_config, "calibrun_cached", False)
    patched = ImportlibResourcesConfigSource._read_config
    sweep.compose_faster()  # twice (a second sweep in the process): still one layer
    assert ImportlibResourcesConfigSource._read_config is patched
    after = _compose_all(loader)
    assert after == before
    assert "calibration:\n  name: narrow" in after[0]
    assert "name: qoperator" in after[1]


def test_a_cached_config_file_is_not_shared_between_compositions(loader):
    sweep.compose_faster()
    source = next(s for s in loader.repository.sources if s.path == "calibrun.conf")
    first = source.load_config("calibration/narrow.yaml")
    first.config.factor = 123.0  # a composition merging into (or editing) what it loaded
    first.header["package"] = "changed"
    second = source.load_config("calibration/narrow.yaml")
    assert second.config.factor != 123.0
    assert second.header.get("package") != "changed"
    assert second.config is not first.config


def test_the_structured_source_copy_shares_the_config_store(loader):
    sweep.compose_faster()
    source = next(s for s in loader.repository.sources if isinstance(s, _classes()[1]))
    copied = copy.deepcopy(source)
    assert copied is not source
    assert copied.store is source.store
    assert copied.load_config("hydra/config").config == source.load_config("hydra/config").config


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
