"""A float model: loading a user's model with clear errors, its graph inputs, external data files and sha256,
`FloatModel` (a model opened once, ready to calibrate) and private copies for onnxruntime's shape inference.

The rooms beside it: lab.py (the lab MLP; `python -m calibrun.model OUT.onnx` writes it), prepare.py (making
any float model quantisable), graph.py (reading graphs: op counts, the input's scale, constants), digits.py (the
digits example classifier and its data).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from calibrun.core.errors import CalibrunError, one_line

LAB_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)  # what the lab rule's rows feed


@dataclass(frozen=True)
class InputInfo:
    """The model's real graph input: name, element type and shape (ints, or str/None for symbolic axes)."""

    name: str
    elem_type: int
    shape: tuple[int | str | None, ...]
    has_shape: bool = True  # False: the graph states no shape (not even a rank); () with True is a scalar

    @property
    def is_float(self) -> bool:
        return self.elem_type == TensorProto.FLOAT


def check_model_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise CalibrunError(f"model file not found: {path}")
    if not path.is_file():
        raise CalibrunError(f"model path is not a file: {path}")
    return path


def load_model(path: str | Path) -> onnx.ModelProto:
    """Load an ONNX file (external data included) or raise a one-line CalibrunError."""
    path = check_model_file(path)
    if path.stat().st_size == 0:
        raise CalibrunError(f"model file is empty: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, ValueError, ... on non-ONNX bytes
        missing_data(path)  # a model whose data file is not where it names it: that, not "not an ONNX model"
        raise CalibrunError(f"not an ONNX model: {path} ({one_line(exc)})") from exc
    if not model.graph.node:
        raise CalibrunError(f"not an ONNX model: {path} (no graph nodes)")
    return model


def graph_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The real graph inputs: old models also list initializers as inputs; those are skipped."""
    initializers = {init.name for init in model.graph.initializer}
    infos = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        ttype = value.type.tensor_type
        dims: list[int | str | None] = []
        for dim in ttype.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        infos.append(InputInfo(value.name, ttype.elem_type, tuple(dims), ttype.HasField("shape")))
    return infos


def float_input(model: onnx.ModelProto, path: str | Path = "model") -> InputInfo:
    """The primary input: the first real graph input that is float32, else the first input (a model of integer
    inputs, token ids or bytes, quantises the float activations it computes from them); its shape must be known."""
    inputs = graph_inputs(model)
    if not inputs:
        raise CalibrunError(f"{path} has no graph input")
    first = primary(inputs)
    if not first.shape:
        raise CalibrunError(f"{path}: {shapeless(first)}")
    return first


def shapeless(info: InputInfo) -> str:
    """Why an input with no axes has no rows to feed: a scalar, or a shape the model does not state at all."""
    if info.has_shape:
        return f"input {info.name!r} has no known shape (rank 0: a scalar, with no rows)"
    return (f"input {info.name!r} has no known shape (the model states not even its rank, and calibrun finds each "
            "input's batch axis from it): give it one in the model (onnx.tools.update_model_dims."
            "update_inputs_outputs_dims) or export it with its shape")


def primary(inputs) -> InputInfo:
    """The first float32 input (the one whose scale the contract reports), else the first input."""
    return next((info for info in inputs if info.is_float), inputs[0])


def why_nothing_quantised(path: str | Path) -> str:
    """Why quantize_static may have quantised nothing in the model (read once, without its weights' values): it
    computes in float64 (its float tensors: weights, inputs, outputs, typed values of the top graph, float64 and
    none float32), its computations on learned matrices are all onnxruntime's fused com.microsoft operators (a
    model saved after onnxruntime's graph optimisation), its operators are all of other domains than ONNX's own (a
    scikit-learn model's ai.onnx.ml TreeEnsembleRegressor, LinearRegressor, ...), or else what the graph's top
    level does not show."""
    graph = onnx.load(str(path), load_external_data=False).graph
    types = {t.data_type for t in graph.initializer}
    types |= {v.type.tensor_type.elem_type for v in (*graph.input, *graph.output, *graph.value_info)
              if v.type.HasField("tensor_type")}
    if TensorProto.DOUBLE in types and TensorProto.FLOAT not in types:
        return ("it computes in float64 (double), and quantize_static quantises float32 tensors only: export it in "
                "float32")
    fused = {op: n for op, n in float_weighted_ops(graph).items() if op.startswith("com.microsoft.")}
    matrices = {t.name for t in graph.initializer if len(t.dims) >= 2}
    if fused and not any(node.domain in ("", "ai.onnx") and node.op_type in MATRIX_OPS
                         and matrices.intersection(node.input) for node in graph.node):
        return (f"its computations on learned matrices are onnxruntime's {format_counts(fused)}, which "
                "quantize_static has no int8 form of; onnxruntime's graph optimisation writes them (Conv, Gemm or "
                "MatMul fused with what follows): quantise the model as it was before that optimisation")
    if graph.node and not any(node.domain in ("", "ai.onnx") for node in graph.node):
        return (f"its operators are all of other domains ({_ops(graph)}): quantize_static quantises ONNX's own "
                "operators only")
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    if graph.node and not any(node.op_type in QDQRegistry or node.op_type in QLinearOpsRegistry for node in graph.node
                              if node.domain in ("", "ai.onnx")):
        return f"none of its operators ({_ops(graph)}) is one quantize_static quantises"
    subgraphs = sorted({node.op_type for node in graph.node if node.op_type in ("If", "Loop", "Scan")})
    return ("no QuantizeLinear/DequantizeLinear or QLinear op at the graph's top level" +
            (f"; the network inside its {' and '.join(subgraphs)} subgraphs is not quantised" if subgraphs else ""))


# ONNX's computations with learned matrices that quantize_static has no static int8 form of (onnxruntime quantises
# LSTM only dynamically, quantize_dynamic): in a static int8 model their weights and work stay in float
FLOAT_ONLY_OPS = ("Einsum", "GRU", "LSTM", "RNN")


def float_weighted_ops(path: str | Path | onnx.GraphProto) -> dict[str, int]:
    """op type -> count of the top graph's nodes that read a learned matrix (an initializer of two or more axes) and
    that quantize_static has no int8 form of: left in float whatever the calibration. ONNX's FLOAT_ONLY_OPS (madmom's
    LSTM and GRU networks: only the ops around them got Q/DQ pairs, and nothing said so), and an operator of another
    domain whose type is not one quantize_static quantises, named with its domain (onnxruntime's com.microsoft
    FusedConv, FusedMatMul, ... in a model saved after onnxruntime's graph optimisation: PP-OCR's direction
    classifier saved that way keeps 24 of its 53 convolutions in float). A Cast of weights stored as int8 is no
    computation and is not counted. `path` may be the graph itself, loaded."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    graph = path if isinstance(path, onnx.GraphProto) else onnx.load(str(path), load_external_data=False).graph
    matrices = {t.name for t in graph.initializer if len(t.dims) >= 2}

    def left(node: onnx.NodeProto) -> bool:
        if node.domain in ("", "ai.onnx"):
            return node.op_type in FLOAT_ONLY_OPS
        return node.op_type not in QDQRegistry and node.op_type not in QLinearOpsRegistry

    found = Counter(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
                    for node in graph.node if matrices.intersection(node.input) and left(node))
    return dict(sorted(found.items()))


def node_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds in its attributes: an If's branches, a Loop's or a Scan's body."""
    return [g for a in node.attribute
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                      list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])]


def graphs_of(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every graph its nodes hold, at any depth."""
    yield graph
    for node in graph.node:
        for sub in node_subgraphs(node):
            yield from graphs_of(sub)


MATRIX_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", *FLOAT_ONLY_OPS)  # computations on learned matrices


def float_subgraphs(path: str | Path) -> dict[str, int]:
    """op type -> count of the top graph's nodes (Loop, Scan, If) whose subgraphs compute with matrix ops and hold
    no quantised op at any depth, read off the int8 model onnxruntime wrote: quantize_static quantised nothing inside
    them, and their work stays in float (gaitkit's IntellEvent: tf2onnx writes each LSTM direction as a Loop, and
    all 134 QuantizeLinear of its int8 model sat outside the six Loops)."""
    found: Counter = Counter()
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        ops = {n.op_type for sub in node_subgraphs(node) for graph in graphs_of(sub) for n in graph.node}
        if ops & set(MATRIX_OPS) and not any(op in QUANTISED_OPS or op.startswith("QLinear") for op in ops):
            found[node.op_type] += 1
    return dict(sorted(found.items()))


def format_counts(counts: Mapping[str, int]) -> str:
    """Op types with their counts, in name order: "Cast, LSTM x6"."""
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items()))


def _ops(graph: onnx.GraphProto) -> str:
    """The graph's op types with their counts, another domain's prefixed with it: "Cast, ai.onnx.ml.ZipMap x2"."""
    return format_counts(Counter(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
                                 for node in graph.node))


# Ops that only a quantised graph holds (QDQ, QOperator, dynamic and integer-arithmetic forms).
QUANTISED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                           "ConvInteger", "QGemm", "QAttention", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM",
                           "MatMulIntegerToFloat", "QEmbedLayerNormalization", "MatMulNBits"})


def quantised_ops(model: onnx.ModelProto) -> dict[str, int]:
    """op type -> count of the nodes of `model` (top graph) that only a quantised model holds."""
    found: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTISED_OPS or node.op_type.startswith(("QLinear", "QOrdered")):
            found[node.op_type] = found.get(node.op_type, 0) + 1
    return dict(sorted(found.items()))


def quantised_ops_of(path: str | Path) -> dict[str, int] | None:
    """quantised_ops of the ONNX file at `path` (read without its weights); None where it is not one to read (the
    step that loads it says why)."""
    try:
        return quantised_ops(onnx.load(str(path), load_external_data=False))
    except Exception:  # noqa: BLE001 (missing, not ONNX: reported by whatever loads it next)
        return None


def check_not_quantised(model: onnx.ModelProto, path: str | Path = "model") -> None:
    """Refuse a model that is already quantised: calibrating it again would quantise its quantisation."""
    found = quantised_ops(model)
    if found:
        ops = ", ".join(f"{op} x{n}" for op, n in found.items())
        raise CalibrunError(f"{path} is already quantised ({ops}); give the float32 model it was made from")


def check_outputs(model: onnx.ModelProto, path: str | Path = "model") -> None:
    """Refuse a model without graph outputs: there would be nothing to measure."""
    if not model.graph.output:
        raise CalibrunError(f"{path} has no graph output: there is nothing to compare fp32 and int8 on")


def external_files(path: str | Path) -> list[Path]:
    """The external data files an ONNX file's tensors keep their values in (every tensor: tensors_of), each once,
    resolved beside it, in name order."""
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # unreadable: load_model reports it
        return []
    names = {entry.value for tensor in tensors_of(model) if tensor.data_location == TensorProto.EXTERNAL
             for entry in tensor.external_data if entry.key == "location"}
    return [path.parent / name for name in sorted(names)]


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    _hash_file(path, digest)
    return digest.hexdigest()


def _hash_file(path: str | Path, digest) -> bool:
    """Feed the file's bytes to `digest`; whether they hold the word `location` (an external data reference's key:
    a cheap test before the model is parsed for its data files)."""
    found, tail = False, b""
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            found = found or b"location" in tail + block
            tail = block[-8:]
    return found


def tensors_of(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every tensor the model holds: initializers (of every graph, sparse ones' values and indices) and the tensors
    of node attributes (a Constant's value)."""
    for graph in graphs_of(model.graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors


def missing_data(path: Path, files: list[Path] | None = None) -> None:
    """A one-line error when the model names an external data file that is not there (`files`: its external_files,
    when the caller has them)."""
    for data in external_files(path) if files is None else files:
        if not data.is_file():
            raise CalibrunError(f"{path} keeps its weights in {os.path.relpath(data, path.parent)}, which is not in "
                                f"{path.parent}: an ONNX model with external data needs its data file where the "
                                "model names it")


def model_sha256(path: str | Path, data_hash: Callable[[Path], str] | None = None) -> str:
    """What a model is, as a hash: its file's bytes, and where its weights are external data, each data file's name
    and bytes too (a model retrained in place rewrites its data file and keeps the .onnx bytes: the same file hash
    had reused a prepared model and its calibration made from the old weights). A data file the model names that
    is not there is a one-line error. `data_hash`: how a data file's sha256 is had (default: once per process while
    the file stays as it was); a caller that needs the data file's own hash too passes one that keeps it."""
    path = Path(path)
    digest = hashlib.sha256()
    if not _hash_file(path, digest):
        return digest.hexdigest()
    files = external_files(path)  # none where the file is no ONNX: the loading after says so
    missing_data(path, files)
    for data in files:
        digest.update(b"\0" + os.path.relpath(data, path.parent).encode() + b"\0")
        digest.update((data_hash or _data_sha256)(data).encode())
    return digest.hexdigest()


_DATA_HASHES: dict[tuple, str] = {}  # (path, device, inode, size, mtime_ns) -> sha256, for this process


def _data_sha256(path: Path) -> str:
    """An external data file's sha256, hashed once per process while the file stays as it was (the same inode, size
    and modification time): each job of a sweep in one process hashed the weights again, ~1 s a GB. A file modified
    in the last RECENT_NS is hashed every time: a rewrite within the file system's clock tick keeps the time (git's
    "racy" files)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key in _DATA_HASHES:
        return _DATA_HASHES[key]
    sha256 = file_sha256(path)
    if time.time_ns() - stat.st_mtime_ns > RECENT_NS:
        _DATA_HASHES[key] = sha256
    return sha256


RECENT_NS = 2_000_000_000


def private_model_copy(model_path: str | Path, folder: str | Path) -> Path:
    """The model (external data included) saved into `folder`, a private temp dir; returns its path.

    onnxruntime's shape inference (`load_model_with_shape_infer`, used by the calibrators and by
    quantize_static given a path) writes `<model>-inferred.onnx` beside the file it is given and deletes it
    afterwards: on the user's file, two jobs on one model (a parallel sweep) delete each other's file and
    crash, and a read-only model folder fails. On a private copy, neither can happen.
    """
    target = Path(folder) / "model.onnx"
    onnx.save_model(onnx.load(str(model_path)), str(target), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data")
    return target


@dataclass(frozen=True)
class FloatModel:
    """A float model ready to calibrate: its file, its real graph inputs and the hash of its bytes."""

    path: Path
    inputs: tuple[InputInfo, ...]
    sha256: str
    source: Path | None = None  # the file the user gave, where `path` is its prepared copy: what messages name

    @property
    def shown(self) -> Path:
        return self.source or self.path

    @property
    def info(self) -> InputInfo:
        """The primary input: the first float32 one, whose scale the contract reports."""
        return primary(self.inputs)

    def lab_input(self) -> InputInfo:
        """The input the synthetic lab rule feeds: it serves exactly one float input (its rows are drawn in float32
        and fed in the type the input declares: calibtool's `error` runs a float16 model as given)."""
        if len(self.inputs) != 1:
            names = [i.name for i in self.inputs]
            raise CalibrunError(f"{self.shown}: the lab data rule serves a single float input, the model has {names};"
                                " give a data source for each (python -m calibrun data=npy; calibtool has the lab "
                                "rule only)")
        if self.info.elem_type not in LAB_FLOAT_TYPES:
            type_name = TensorProto.DataType.Name(self.info.elem_type) if self.info.elem_type else "of no known type"
            raise CalibrunError(f"{self.shown}: input {self.info.name!r} is {type_name}; the lab data rule feeds one "
                                "float input (float32, float16 or double; give your data: python -m calibrun data=npy)")
        if not self.info.shape:
            raise CalibrunError(f"{self.shown}: {shapeless(self.info)}; the lab data rule needs [rows, ...]")
        from calibrun.lab.data import sample_shape

        try:
            sample_shape(self.info)  # every axis but the rows' fixed, as the rule draws whole rows
        except CalibrunError as exc:
            raise CalibrunError(f"{self.shown}: {exc}") from None
        return self.info


def open_float_model(path: str | Path, sha256: str | None = None) -> FloatModel:
    """A float model to calibrate or evaluate (refused: no input, no output, no float input, already
    quantised). `sha256`: its model_sha256 when the caller has just verified it (saves hashing it again)."""
    path = Path(path)
    model = load_model(path)
    inputs = tuple(graph_inputs(model))
    if not inputs:
        raise CalibrunError(f"{path} has no graph input")
    check_outputs(model, path)
    check_not_quantised(model, path)
    return FloatModel(path, inputs, sha256 or model_sha256(path))


def check_loadable(fp32: FloatModel) -> FloatModel:
    """onnxruntime can build a session of the model (every op known, shapes consistent): checked before any
    work, so that a broken model is named as the user gave it, not as a temp copy deep in calibration."""
    from calibrun.model.sessions import session

    session(fp32.path, optimize=False, log_level=4)  # the exception carries the message; nothing else on stderr
    return fp32

# --- config: this concept's options (the `model` node; calibrun.config assembles the schema) ---

MODELS = ("lab", "file", "digits")


@dataclass
class ModelConf:
    name: str = "lab"
    path: str | None = None
    classifier: bool | None = None  # None: task=auto reads it from the outputs (docs/tasks.md); false: not one
