"""Every patch of another library's private internals, in one place: each is a speed-up that keeps the results
the same (tests/unit/test_patches.py checks each against the library's own behaviour).

| patch | library | what it skips |
|---|---|---|
| `compose_once` | Hydra 1.3 | the composition only to read `hydra.mode` when nothing can set it |
| `compose_faster` | Hydra 1.3 | the config repository's deep copies of the ConfigStore, re-parsing config files |
| `compose_each_job_once` | Hydra 1.3 | a sweep's second composition of each job (validation pass, then launch) |
| `compose_by_group_choice` | Hydra 1.3 | the defaults list and merge of jobs that choose the same groups |
| `yaml_in_c` | OmegaConf 2.3 | PyYAML's pure-Python emitter, for the config files every job writes |
| `before_launch(hook)` | Hydra 1.3 | waiting for the tracking store before Hydra validates the jobs (`hook` after) |
| `order_jobs(order)` | Hydra 1.3 | workers calibrating one key at once: jobs reordered (calibrun.sweep_order) |
| `commit_without_fsync` | MLflow 3 (its engine) | an fsync per SQLite commit (WAL mode, `synchronous=NORMAL`) |
| `check_pins_cheaply` | MLflow 3 | mapping every installed distribution's files to check calibrun's own pins |
| `rewire_by_membership` | onnxruntime 1.32 | the quantiser's Python scan of every node's inputs per rewired tensor |
| `index_initializer_lookups` | onnxruntime 1.32 | the quantiser's scans of the initializers per name it looks up |

Two more wrap Hydra's internals to keep calibrun's guarantees rather than to save time; the policy they apply
lives with its concept, passed in:

| guard | library | what it does |
|---|---|---|
| `guard_callbacks(check)` | Hydra 1.3 | runs `check(config)` (core.trust) before Hydra instantiates any callback |
| `on_full_disk(handler)` | Hydra 1.3 | a full disk as Hydra writes `.hydra/` goes to `handler` (calibrun.sweep) |
| `one_line_errors()` | Hydra 1.3 | an error in the command line or the composed config is one line (Hydra's: 4+) |

Each applies only to the library versions it was written against (`SUPPORTED`) and does nothing on another
version. `CALIBRUN_PATCHES=off` in the environment turns the speed patches off (the libraries then run as
shipped); the guards stay, since turning them off would run configs' callbacks unchecked. Each is idempotent
(applied once per process, however often it is called).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable
from importlib import metadata

from calibrun.core.errors import CalibrunError
from calibrun.core.files import is_full

# distribution -> the version prefixes each patch was written against (checked against the installed version)
PATCHED = "calibrun_patched"  # the marker on a function a patch installed (a patch is applied once)
SUPPORTED = {"hydra-core": ("1.3.",), "mlflow": ("3.",), "onnxruntime": ("1.32.",), "omegaconf": ("2.3.",)}


def enabled(distribution: str) -> bool:
    """Speed patches of `distribution` apply: not switched off, and its installed version is supported."""
    if os.environ.get("CALIBRUN_PATCHES", "on").strip().lower() in ("off", "0", "false", "no"):
        return False
    return supported(distribution)


def supported(distribution: str) -> bool:
    """The installed version of `distribution` is one the patches were written for."""
    version = _version(distribution)
    return version is not None and version.startswith(SUPPORTED[distribution])


def _unpatched(distribution: str, module: str, owner: str | None, attr: str, guard: bool = False):
    """(what holds `attr`, its value) for a patch of `module`'s `attr` (on class `owner`, else the module itself) that
    should be applied: the distribution's version is supported (and, unless `guard`, the speed patches are on), the
    module and attribute exist, and the attribute is not patched already. Else None."""
    if not (supported(distribution) if guard else enabled(distribution)):
        return None
    try:
        holder = importlib.import_module(module)
    except ImportError:  # another version of the library: left as it is
        return None
    if owner is not None:
        holder = getattr(holder, owner, None)
    original = getattr(holder, attr, None)
    if original is None or getattr(original, PATCHED, False):
        return None
    return holder, original


def _install(holder, attr: str, replacement) -> None:
    setattr(replacement, PATCHED, True)
    setattr(holder, attr, replacement)


@functools.cache
def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# The config sources of `python -m calibrun` (Hydra's own, calibrun's, the structured schema): none sets hydra.mode.
_OWN_SOURCES = {("hydra", "pkg://hydra.conf"), ("main", "pkg://calibrun.conf"), ("schema", "structured://")}


def _sets_mode_or_sources(override: str) -> bool:
    key = override.partition("=")[0].lstrip("~+")
    return key == "hydra" or key.startswith(("hydra.mode", "hydra.searchpath"))


def compose_once() -> None:
    """Hydra composes the whole config once only to read hydra.mode (Hydra.get_mode), then again for the run or
    the sweep: ~0.1 s of every start-up here. No calibrun config sets hydra.mode (tests/unit/test_patches.py checks
    every preset), so when the command line neither sets it nor adds a config source, it is unset and get_mode's
    answer is None, which this returns without composing; Hydra then picks the mode from -m as before."""
    if not enabled("hydra-core"):
        return
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
    tests/unit/test_patches.py composes jobs both ways; 24 lab jobs: 2.76 -> 2.13 CPU s here):

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
    if not enabled("hydra-core"):
        return
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


def compose_by_group_choice() -> None:
    """Hydra composes each job of a sweep from scratch: its defaults list (the config files its group choices pick,
    ~40 ms) and their merge (~30 ms), then the job's other overrides on top. Jobs that choose the same groups
    (the lab's 24 jobs: 6 pairs of calibration and format) have the same defaults list and the same merged config
    before those overrides: both are kept per search path and group overrides, and each job gets a copy of the
    merged config with its own overrides applied, as Hydra does. The composed configs are the same
    (tests/unit/test_patches.py composes jobs both ways). At most COMPOSED_KEEP choices are kept (beyond: composed
    as before)."""
    found = _unpatched("hydra-core", "hydra._internal.config_loader_impl", None, "create_defaults_list")
    if found is None:
        return
    module, original = found
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.defaults_list import DefaultsList, Overrides

    lists: dict = {}  # (search path, config name, flags, group overrides) -> DefaultsList
    merged: dict = {}  # id(a kept defaults list) -> (that list, the merged config)

    def create_defaults_list(repo, config_name, overrides_list, prepend_hydra, skip_missing):
        split = Overrides(repo=repo, overrides_list=overrides_list)
        configs = {id(o) for o in split.config_overrides}
        key = (tuple((source.scheme(), source.path, source.provider) for source in repo.get_sources()), config_name,
               prepend_hydra, skip_missing, tuple(o.input_line for o in overrides_list if id(o) not in configs))
        kept = lists.get(key)
        if kept is None and len(lists) >= COMPOSED_KEEP:
            return original(repo=repo, config_name=config_name, overrides_list=overrides_list,
                            prepend_hydra=prepend_hydra, skip_missing=skip_missing)
        if kept is None:
            kept = lists[key] = original(repo=repo, config_name=config_name, overrides_list=overrides_list,
                                         prepend_hydra=prepend_hydra, skip_missing=skip_missing)
        return DefaultsList(defaults=kept.defaults, config_overrides=split.config_overrides,
                            defaults_tree=kept.defaults_tree, overrides=kept.overrides)

    compose = ConfigLoaderImpl._compose_config_from_defaults_list

    def compose_config_from_defaults_list(self, defaults, repo):
        kept = merged.get(id(defaults))
        if kept is None or kept[0] is not defaults:
            config = compose(self, defaults, repo)
            if any(found.defaults is defaults for found in lists.values()):
                merged[id(defaults)] = (defaults, copy.deepcopy(config))
            return config
        return copy.deepcopy(kept[1])

    _install(module, "create_defaults_list", create_defaults_list)
    _install(ConfigLoaderImpl, "_compose_config_from_defaults_list", compose_config_from_defaults_list)


COMPOSED_KEEP = 256  # configs (and group choices) kept while a sweep composes its jobs (beyond: composed again)


def compose_each_job_once() -> None:
    """Hydra's sweeper composes every job to validate the batch (fail before any job), then the launcher composes
    each job again before running it: ~0.25-0.5 s per job, half of it spent twice. The config the validation pass
    composed is handed to the launcher instead (the same function, the same master config and overrides: the same
    config, resolver cache included). Kept only until launched, and at most COMPOSED_KEEP at a time."""
    found = _unpatched("hydra-core", "hydra._internal.config_loader_impl", "ConfigLoaderImpl", "load_sweep_config")
    if found is None:
        return
    loader, original = found
    composed: dict = {}

    def load_sweep_config(self, master_config, sweep_overrides):
        key = (id(master_config), tuple(sweep_overrides))
        if key in composed:
            return composed.pop(key)
        config = original(self, master_config, sweep_overrides)
        if len(composed) < COMPOSED_KEEP:
            composed[key] = config
        return config

    _install(loader, "load_sweep_config", load_sweep_config)


def yaml_in_c() -> None:
    """OmegaConf writes YAML with PyYAML's pure-Python emitter: the four config files of every job (Hydra's
    `.hydra/config.yaml`, `hydra.yaml`, `overrides.yaml` and calibrun's `config_resolved.yaml`) took ~12 ms of a
    ~100 ms lab job. Where PyYAML is built on libyaml, its C emitter writes them, with OmegaConf's own representer
    of strings (quoted where they would read as a bool or a number), ~4x faster. The files load to the same configs
    (tests/unit/test_patches.py); a long double-quoted string may be folded at other spaces."""
    found = _unpatched("omegaconf", "omegaconf.omegaconf", None, "get_omega_conf_dumper")
    if found is None:
        return
    import yaml

    if not getattr(yaml, "__with_libyaml__", False):
        return
    module, original = found
    python_dumper = original()

    class OmegaConfCDumper(yaml.CDumper):
        pass

    for kind, represent in python_dumper.yaml_representers.items():
        if represent is not yaml.Dumper.yaml_representers.get(kind):  # OmegaConf's own (strings)
            OmegaConfCDumper.add_representer(kind, represent)

    def get_omega_conf_dumper():
        return OmegaConfCDumper

    _install(module, "get_omega_conf_dumper", get_omega_conf_dumper)


_BEFORE_LAUNCH: list[Callable[[], None]] = []


def before_launch(hook: Callable[[], None]) -> bool:
    """Run `hook` once, when Hydra's basic sweeper has validated the first batch of jobs (it composes every job's
    config: ~70 ms a job) and before it launches them: the sweep's tracking store is opened during that work
    (calibrun.sweep). False when the sweeper's method is not there to wrap (the caller then does the step at once)."""
    if not enabled("hydra-core"):
        return False
    found = _unpatched("hydra-core", "hydra._internal.core_plugins.basic_sweeper", "BasicSweeper",
                       "validate_batch_is_legal")
    if found is not None:
        sweeper, original = found

        def validate_batch_is_legal(self, batch):
            original(self, batch)
            while _BEFORE_LAUNCH:
                _BEFORE_LAUNCH.pop(0)()

        _install(sweeper, "validate_batch_is_legal", validate_batch_is_legal)
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    except ImportError:
        return False
    if not getattr(getattr(BasicSweeper, "validate_batch_is_legal", None), PATCHED, False):
        return False
    _BEFORE_LAUNCH.append(hook)
    return True


def order_jobs(order: Callable[[list[list[str]]], list[list[str]]]) -> None:
    """Hydra's basic sweeper launches the product of the swept values, the last override varying fastest;
    `order` reorders those jobs (calibrun.sweep_order.spread) before they are cut into batches and numbered. The
    jobs are the same; their numbers follow the new order."""
    found = _unpatched("hydra-core", "hydra._internal.core_plugins.basic_sweeper", "BasicSweeper", "split_arguments")
    if found is None:
        return
    sweeper, original = found

    def split_arguments(overrides, max_batch_size):
        (jobs,) = original(overrides, None)
        return [list(chunk) for chunk in sweeper.split_overrides_to_chunks(order(jobs), max_batch_size)]

    setattr(split_arguments, PATCHED, True)  # on the function: the class hands out the function, not the staticmethod
    sweeper.split_arguments = staticmethod(split_arguments)


def commit_without_fsync(client) -> None:
    """The store's SQLite connections with `synchronous=NORMAL` (SQLite's recommended setting in WAL mode): a
    commit no longer waits for an fsync (MLflow commits ~25 times per job; a commit here: 5 ms with the fsync,
    0.02 ms without, ~3 s of a lab sweep). The database stays consistent after any crash; only a power loss or OS
    crash can undo the last commits (a process killed, even with SIGKILL, loses nothing). The setting is per
    connection: MLflow's cached engine for this URI gets it on every connection it opens, the pooled ones are
    dropped to reopen with it."""
    if not enabled("mlflow"):
        return
    from sqlalchemy import event

    engine = getattr(getattr(getattr(client, "_tracking_client", None), "store", None), "engine", None)
    if engine is None or engine.dialect.name != "sqlite" or getattr(engine, "calibrun_normal_sync", False):
        return

    def normal_sync(dbapi_connection, record) -> None:
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    event.listen(engine, "connect", normal_sync)
    engine.calibrun_normal_sync = True
    engine.dispose()


def check_pins_cheaply() -> None:
    """MLflow checks a saved model's pip requirements against the environment and warns on a mismatch
    (mlflow.utils.environment.warn_dependency_requirement_mismatches). To find a package's module it first maps
    every installed distribution's files (importlib.metadata.packages_distributions): ~0.3 s, once per process.
    calibrun's requirements are `name==version` pins of installed distributions; when each one's installed version
    (one metadata lookup) is the pinned one, nothing can mismatch and MLflow's check is skipped. Anything else
    goes through MLflow's check as before. Installed once per process, for every caller."""
    found = _unpatched("mlflow", "mlflow.utils.environment", None, "warn_dependency_requirement_mismatches")
    if found is None:
        return
    environment, check = found

    def installed(requirement: str) -> bool:
        name, sep, version = requirement.partition("==")
        try:
            return bool(sep) and metadata.version(name.strip()) == version.strip()
        except (metadata.PackageNotFoundError, ValueError):
            return False

    def warn_mismatches(requirements):
        if all(isinstance(r, str) and installed(r) for r in requirements):
            return None
        return check(requirements)

    _install(environment, "warn_dependency_requirement_mismatches", warn_mismatches)


class _FieldIndex:
    """An index of one protobuf repeated field, brought up to date before every use: the items appended since are
    indexed (the quantiser appends), and a shorter field or a last item that is not the one indexed last (a removal)
    rebuilds it. Subclasses say what items add (`_extend`: a loop of their own, since a rebuild after a removal
    indexes every item again, 55 times in one quantisation of PP-OCR's detector) and what identifies the last one
    (`_identity`)."""

    __slots__ = ("field", "size", "last")

    def __init__(self, field):
        self.field = field  # held: its id() stays this field's while the index is in use
        self.reset()

    def reset(self) -> None:
        self.size, self.last = 0, None

    def sync(self):
        items, size = self.field, self.size
        count = len(items)
        if count < size or (size and self._identity(items[size - 1]) != self.last):
            self.reset()
            size = 0
        if count > size:
            self._extend(items, size, count)
            self.size, self.last = count, self._identity(items[count - 1])
        return self

    def _identity(self, item):
        raise NotImplementedError

    def _extend(self, items, start: int, stop: int) -> None:
        """Index items[start:stop]."""
        raise NotImplementedError


class _Names(_FieldIndex):
    """name -> position of the first item of that name in a graph's initializers; also rebuilt when a hit's item has
    another name (a reordering; a reordering cannot hide a name, so a miss stays a miss). Also knows whether any
    item is a FLOAT8E4M3FN tensor (the only kind onnxruntime's initializer check inspects)."""

    __slots__ = ("first", "float8")

    def reset(self) -> None:
        super().reset()
        self.first, self.float8 = {}, False

    def _identity(self, item):
        return item.name

    def _extend(self, items, start: int, stop: int) -> None:
        from onnx import TensorProto

        first, float8 = self.first, TensorProto.FLOAT8E4M3FN
        for position in range(start, stop):
            item = items[position]
            first.setdefault(item.name, position)
            if item.data_type == float8:
                self.float8 = True

    def find(self, name: str):
        """The first item called `name`, or None: the linear scan's answer, checked against the field itself."""
        for _ in range(2):
            position = self.sync().first.get(name)
            if position is None:
                return None
            item = self.field[position]
            if item.name == name:
                return item
            self.reset()  # changed in a way the sync could not see: index it again
        return None


class _Readers(_FieldIndex):
    """tensor name -> positions of the nodes that read it, in one graph's node field (a node is identified by its
    outputs). A reordering (topological_sort: ClearField, then extend) leaves a new field object, indexed anew (an
    in-place sort() of the field would not be seen: onnxruntime does not sort one). A node's inputs change, while the
    index is in use, only through ONNXModel.replace_node_input: by rewire_by_membership's replacement, which indexes
    the node under its new input, or by the quantiser itself, where the patched replace_node_input drops every index
    (onnxruntime 1.32's QDQ quantiser; its QOperator op quantisers assign node inputs directly but never rewire a
    tensor for all nodes)."""

    __slots__ = ("positions",)

    def reset(self) -> None:
        super().reset()
        self.positions = {}

    def _identity(self, item):
        return tuple(item.output)

    def _extend(self, items, start: int, stop: int) -> None:
        positions = self.positions
        for position in range(start, stop):
            for name in items[position].input:
                positions.setdefault(name, []).append(position)


_LOOKUPS = threading.local()  # .indexes {(_Names or _Readers, id(field)): index} while indexed_lookups() is active


@contextlib.contextmanager
def indexed_lookups():
    """While active (in this thread), rewire_by_membership's and index_initializer_lookups' replacements answer
    from indexes (built on first use, dropped on exit, so no model outlives the quantisation); outside it,
    onnxruntime's own code answers (rewire_by_membership: its membership test)."""
    previous = getattr(_LOOKUPS, "indexes", None)
    _LOOKUPS.indexes = {}
    try:
        yield
    finally:
        _LOOKUPS.indexes = previous


def _index(kind: type, field):
    """The `kind` (_Names or _Readers) index of the repeated `field` while indexed_lookups() is active, else None."""
    indexes = getattr(_LOOKUPS, "indexes", None)
    if indexes is None:
        return None
    index = indexes.get((kind, id(field)))
    if index is None or index.field is not field:
        index = indexes[(kind, id(field))] = kind(field)
    return index


def rewire_by_membership() -> None:
    """onnxruntime's quantiser rewires each tensor it quantises to its DequantizeLinear output with
    `ONNXModel.replace_input_of_all_nodes`, which calls a Python loop over every input of every node of the graph:
    quadratic in the model's size (ocr_det, 524 tensors of a 735-node graph: 384,645 calls; quantize_static takes
    2.42 s at 8 bits and 3.27 s at 16 bits without this patch, 1.76 and 1.69 s with the membership test below; every
    repair, fallback and recommendation trial pays one). Inside `indexed_lookups()` (calibrun.quant.quantize) the
    replacement visits only the nodes the reader index (_Readers) lists for the tensor, each checked to read it still;
    outside it, it skips the nodes that do not read the tensor with a membership test of their input list (done in
    C). Either way the rest is onnxruntime's own replace_node_input: the same nodes changed the same way, the same
    bytes written (tests/unit/test_patches.py)."""
    found = _unpatched("onnxruntime", "onnxruntime.quantization.onnx_model", "ONNXModel", "replace_input_of_all_nodes")
    if found is None:
        return
    model_class, _ = found
    replace_node_input = model_class.replace_node_input

    def replace_input_of_all_nodes(self, old_input_name, new_input_name):
        nodes = self.model.graph.node
        readers = _index(_Readers, nodes)
        if readers is None:
            for node in nodes:
                if old_input_name in node.input:
                    replace_node_input(node, old_input_name, new_input_name)
            return
        positions = readers.sync().positions
        for position in sorted(set(positions.get(old_input_name, ()))):
            node = nodes[position]
            if old_input_name in node.input:
                replace_node_input(node, old_input_name, new_input_name)
                positions.setdefault(new_input_name, []).append(position)

    def replace_node_input_elsewhere(node, old_input_name, new_input_name):
        indexes = getattr(_LOOKUPS, "indexes", None)
        for key in [key for key in indexes or () if key[0] is _Readers]:
            del indexes[key]  # a node's inputs changed behind the reader index: rebuilt at its next use
        replace_node_input(node, old_input_name, new_input_name)

    _install(model_class, "replace_input_of_all_nodes", replace_input_of_all_nodes)
    setattr(replace_node_input_elsewhere, PATCHED, True)
    model_class.replace_node_input = staticmethod(replace_node_input_elsewhere)




def index_initializer_lookups() -> None:
    """onnxruntime's quantiser finds initializers by name with linear scans of the graph's initializer list:
    `quant_utils.find_by_name` (imported by name into each of its modules), `ONNXModel.get_initializer`, and
    `ONNXModel.initializer_extend`, which checks every existing initializer again each time it adds one (the check
    only inspects FLOAT8E4M3FN tensors). Quadratic in the model's size: of a default ocr_det job with its
    recommendations (7 quantisations), 29,618 scans took 2.9 s, the re-checks 0.9 s and get_initializer 0.7 s of
    19 s (cProfile). Inside `indexed_lookups()` (calibrun.quant.quantize) the replacements answer from a name index
    of the repeated field (_Names), re-synchronised before every answer and each hit checked against the field; a
    Python list (the QOperator quantiser's new nodes) and any call outside the context take onnxruntime's own path.
    The same model bytes (tests/unit/test_patches.py)."""
    found = _unpatched("onnxruntime", "onnxruntime.quantization.quant_utils", None, "find_by_name")
    if found is None:
        return
    quant_utils, original = found
    from onnx import ModelProto, TensorProto
    from onnxruntime.quantization.onnx_model import ONNXModel

    repeated = type(ModelProto().graph.initializer)

    def find_by_name(item_name, item_list):
        # an initializer field only (a node list is reordered in place: its duplicate "" names would make a stale
        # position's check pass)
        names = _index(_Names, item_list) if type(item_list) is repeated and item_list and \
            type(item_list[0]) is TensorProto else None
        return original(item_name, item_list) if names is None else names.find(item_name)

    _install(quant_utils, "find_by_name", find_by_name)
    for name, module in list(sys.modules.items()):  # the modules that imported it by name
        if name.startswith("onnxruntime.quantization.") and getattr(module, "find_by_name", None) is original:
            module.find_by_name = find_by_name

    get_initializer, extend = ONNXModel.get_initializer, ONNXModel.initializer_extend

    def get_initializer_indexed(self, name):
        names = _index(_Names, self.model.graph.initializer)
        return get_initializer(self, name) if names is None else names.find(name)

    def initializer_extend_indexed(self, inits):
        names = _index(_Names, self.model.graph.initializer)
        if names is None or names.sync().float8:  # a FLOAT8E4M3FN initializer to check: onnxruntime's own code
            return extend(self, inits)
        if len(inits) == 0:
            raise ValueError("Can add an empty list.")
        for init in inits:
            self._check_init(init)
            self.model.graph.initializer.append(init)
        return None

    if not getattr(get_initializer, PATCHED, False):
        _install(ONNXModel, "get_initializer", get_initializer_indexed)
        _install(ONNXModel, "initializer_extend", initializer_extend_indexed)

# --- guards -----------------------------------------------------------------------------------------------------

def guard_callbacks(check: Callable) -> None:
    """`check(config)` runs where Hydra instantiates a run's or a sweep's callbacks (hydra._internal.callbacks
    .Callbacks), before any is instantiated; a CalibrunError it raises is one line on stderr and exit status 1."""
    found = _unpatched("hydra-core", "hydra._internal.callbacks", "Callbacks", "__init__", guard=True)
    if found is None:
        return
    callbacks, original = found

    def init(self, config=None, *args, **kwargs):
        try:
            check(config)
        except CalibrunError as exc:
            print(f"calibrun: error: {exc}", file=sys.stderr)
            sys.exit(1)
        original(self, config, *args, **kwargs)

    _install(callbacks, "__init__", init)


def on_full_disk(handler: Callable) -> None:
    """A full disk while Hydra writes a job's `.hydra/` files (hydra.core.utils._save_config, which reports it with
    a traceback) goes to `handler(exc, output_dir, filename)`, which reports it and ends the process; any other
    error is Hydra's as before."""
    found = _unpatched("hydra-core", "hydra.core.utils", None, "_save_config", guard=True)
    if found is None:
        return
    hydra_utils, original = found

    def save_config(cfg, filename, output_dir):
        try:
            return original(cfg, filename, output_dir)
        except OSError as exc:
            if not is_full(exc):
                raise
            handler(exc, output_dir, filename)
            raise

    _install(hydra_utils, "_save_config", save_config)


def one_line_errors() -> None:
    """Hydra's report of an error it raises composing the config from the command line (hydra._internal.utils
    .run_and_report: the message, the OmegaConf cause with its full_key and object_type lines, the grammar's link,
    the HYDRA_FULL_ERROR hint) is one line, `calibrun: error: <message>; <cause>`, and exit status 1, as calibrun's
    own errors are. Other exceptions are Hydra's to report as before; HYDRA_FULL_ERROR=1 keeps Hydra's whole report."""
    found = _unpatched("hydra-core", "hydra._internal.utils", None, "run_and_report", guard=True)
    if found is None:
        return
    hydra_utils, original = found
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def run_and_report(func):
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            return original(func)
        caught: list[BaseException] = []

        def guarded():
            try:
                return func()
            except (HydraException, OmegaConfBaseException) as exc:
                caught.append(exc)
                return None

        result = original(guarded)
        if caught:
            print(f"calibrun: error: {_one_line(caught[0])}", file=sys.stderr)
            sys.exit(1)
        return result

    _install(hydra_utils, "run_and_report", run_and_report)


def _one_line(exc: BaseException) -> str:
    """A Hydra or OmegaConf error and its cause on one line: the lines joined with "; ", a tab-indented list (the
    options of a group) joined with ", " after its heading, without the config search path, the full_key and
    object_type lines and the grammar's link."""
    said: list[str] = []
    for part in (exc, exc.__cause__):
        if part is None:
            continue
        for line in str(part).splitlines():
            if line.startswith("Config search path:"):
                break
            text = line.strip()
            if not text or text.startswith(("full_key:", "object_type=", "See https://")):
                continue
            if line.startswith("\t") and said and said[-1].endswith((":", ",")):
                said[-1] += f" {text},"
                continue
            said.append(text)
    said = [line.rstrip(",") for line in said]
    return "; ".join(dict.fromkeys(said)) or type(exc).__name__
