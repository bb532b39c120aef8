"""`python -m calibrun` and the `calibrun` command: the Hydra app. Config groups in conf/ (shipped inside the
installed package as calibrun.conf) drive calibrun.runner.main."""

from __future__ import annotations

import atexit
import contextlib
import copy
import gc
import os
import sys
from importlib import resources

import hydra
from omegaconf import DictConfig

from calibrun import runner
from calibrun.config import register

register()

CONFIG_PACKAGE = "calibrun.conf"
# flags that only show something (help, config, info): a preset without -m is fine with them
_SHOW_FLAGS = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--shell-completion",
               "-sc", "--version"}


@hydra.main(version_base=None, config_path=f"pkg://{CONFIG_PACKAGE}", config_name="config")
def _app(cfg: DictConfig):
    return runner.main(cfg)


def preset_sweep(name: str) -> list[str] | None:
    """The keys an experiment preset sweeps (its hydra.sweeper.params), or None when it sweeps nothing or there is
    no such preset (Hydra then names the missing option)."""
    import yaml

    try:
        text = resources.files(CONFIG_PACKAGE).joinpath("experiment", f"{name}.yaml").read_text()
        params = ((yaml.safe_load(text) or {}).get("hydra") or {}).get("sweeper", {}).get("params")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None
    return list(params) if isinstance(params, dict) and params else None


def check_preset_mode(argv: list[str]) -> str | None:
    """A preset that is a sweep needs -m: the one line that says so, or None."""
    if "-m" in argv or "--multirun" in argv or _SHOW_FLAGS & set(argv) or any(a.startswith("hydra.mode=")
                                                                               for a in argv):
        return None
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") == "experiment" and value not in ("", "null"):
            axes = preset_sweep(value)
            if axes:
                return (f"experiment={value} is a sweep (over {', '.join(axes)}): add -m, as in "
                        f"python -m calibrun -m experiment={value}")
    return None


def check_keys(argv: list[str]) -> str | None:
    """An override whose key is not a calibrun setting: the one line naming it and the closest valid keys, or None.

    Hydra's own error for `batchs=3` advises `+batchs=3`, which only leads into calibrun's refusal of a key that is
    not a setting: the mistake is named here, before Hydra composes anything."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from calibrun.config import is_setting, unknown_key_message

    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra names a malformed override itself
        return None
    for override in parsed:
        key = override.key_or_group
        if override.package or "/" in key:  # `group@package=...`, `hydra/launcher=...`: Hydra's to judge
            continue
        if not is_setting(key):
            return unknown_key_message(key)
    return None


def normalise(argv: list[str]) -> list[str]:
    """`+experiment=NAME` (the form before `experiment` had a default) means `experiment=NAME`: Hydra refuses to
    add a group that the defaults list already holds."""
    return [arg[1:] if arg.startswith("+experiment=") else arg for arg in argv]


def _quick_exit() -> None:
    """At exit, after every other exit handler (registered first, so it runs last): close MLflow's pooled SQLite
    connections (the write-ahead log is checkpointed into the database as before), then freeze the garbage
    collector. The interpreter's teardown otherwise walks every object of the imported libraries (MLflow,
    SQLAlchemy, matplotlib, ...) in repeated gc passes: 3-4 s of a 30 s lab sweep here, for memory the OS takes
    back anyway. Finalizers and exit handlers still run; only the cycle collector's final passes are skipped."""
    store = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    engines = getattr(getattr(store, "SqlAlchemyStore", None), "_engine_map", None) or {}
    for engine in list(engines.values()):
        with contextlib.suppress(Exception):  # exiting: nothing left to report it to
            engine.dispose()
    gc.freeze()


# The config sources of `python -m calibrun` (Hydra's own, calibrun's, the structured schema): none sets hydra.mode.
_OWN_SOURCES = {("hydra", "pkg://hydra.conf"), ("main", f"pkg://{CONFIG_PACKAGE}"), ("schema", "structured://")}


def _sets_mode_or_sources(override: str) -> bool:
    key = override.partition("=")[0].lstrip("~+")
    return key == "hydra" or key.startswith(("hydra.mode", "hydra.searchpath"))


def compose_once() -> None:
    """Hydra composes the whole config once only to read hydra.mode (Hydra.get_mode), then again for the run or
    the sweep: ~0.1 s of every start-up here. No calibrun config sets hydra.mode (tests/unit/test_speed.py checks
    every preset), so when the command line neither sets it nor adds a config source, it is unset and get_mode's
    answer is None, which this returns without composing; Hydra then picks the mode from -m as before."""
    from hydra._internal.hydra import Hydra

    if getattr(Hydra.get_mode, "hydras", None):
        return

    def get_mode(self, config_name, overrides):
        search_path = getattr(getattr(self, "config_loader", None), "config_search_path", None)
        sources = {(e.provider, e.path) for e in search_path.get_path()} if search_path is not None else None
        if config_name == "config" and sources == _OWN_SOURCES and not any(map(_sets_mode_or_sources, overrides)):
            return None
        return get_mode.hydras(self, config_name, overrides)

    get_mode.hydras = Hydra.get_mode
    Hydra.get_mode = get_mode


def compose_faster() -> None:
    """Two costs of Hydra's composition that repeat for every job without need (the composed configs are the same:
    tests/unit/test_speed.py composes jobs both ways; 24 lab jobs: 2.76 -> 2.13 CPU s here):

    * every composition deep-copies its config repository, and with it the structured config source, which holds
      the whole ConfigStore (every registered dataclass config: ~50 ms here). The store is a process singleton
      that hands out deep copies of its nodes anyway (ConfigStore.load), so the copied source shares it.
    * every composition reads and parses each config file of the defaults list again (Hydra's caching repository
      lives for one composition): a file of a package config source (pkg://, calibrun's and Hydra's own) is parsed
      once per process and handed out as a deep copy, re-read when its size or mtime changes.

    Hydra's plugin discovery executes its core plugins' modules again, which defines these classes anew: it is
    done first (once per process, as Hydra would), so that the classes changed here are the ones Hydra uses.
    Applied at start-up, it also serves the compositions before the first job and `--help`, which composes every
    config group (2.2-2.7 -> 0.9 CPU s here).
    """
    try:
        from hydra.core.plugins import Plugins

        Plugins.instance()  # the discovery that redefines the classes below
        from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
        from hydra._internal.core_plugins.structured_config_source import StructuredConfigSource
        from hydra.plugins.config_source import ConfigResult
    except ImportError:  # another Hydra: compose as it does
        return
    if not hasattr(StructuredConfigSource, "__deepcopy__"):
        def share_store(self, memo):
            return copy.copy(self)  # provider, path and the ConfigStore singleton

        StructuredConfigSource.__deepcopy__ = share_store
    read = ImportlibResourcesConfigSource._read_config
    if getattr(read, "calibrun_cached", False):
        return
    parsed: dict = {}

    def read_config(self, res):
        try:
            stat = os.stat(res)  # a file on disk (not inside a zip): its identity
        except (TypeError, OSError):
            return read(self, res)
        key = (self.path, self.provider, os.fspath(res), stat.st_size, stat.st_mtime_ns)
        found = parsed.get(key)
        if found is None:
            found = parsed[key] = read(self, res)
        return ConfigResult(config=copy.deepcopy(found.config), path=found.path, provider=found.provider,
                            header=dict(found.header))

    read_config.calibrun_cached = True
    ImportlibResourcesConfigSource._read_config = read_config


def main() -> None:
    atexit.register(_quick_exit)
    compose_once()
    sys.argv[1:] = normalise(sys.argv[1:])
    problem = check_preset_mode(sys.argv[1:]) or check_keys(sys.argv[1:])
    if problem is not None:
        print(f"calibrun: error: {problem}", file=sys.stderr)
        sys.exit(1)
    compose_faster()
    _app()


if __name__ == "__main__":
    main()
