"""A model file's structure without its weights' values, read once per file.

The analyses that only look at a model's graph (ONNX shape inference for the activation budget and for an output's
Concat blocks, output names) used to load the whole file each time: ResNet-50's 100 MB of weights read, parsed,
copied and serialised for shape inference (~500 MB for a moment), and that while the evaluation's sessions were
open (the default job's peak, docs/memory.md). `structure(path)` is the model with every initializer larger than
KEEP_BYTES emptied: its name, type and dims stay (all that shape inference and the graph analyses read of a
weight), its values go. Small initializers (shapes, axes, scales: what shape inference's data propagation
reads) stay whole. The file is read once per (path, size, mtime); each call gets its own copy of the small proto.
"""

from __future__ import annotations

import threading
from pathlib import Path

import onnx
from onnx import TensorProto

KEEP_BYTES = 4096  # initializers at most this size keep their values
_CACHE: dict[tuple, bytes] = {}
_CACHE_SIZE = 4
_LOCK = threading.Lock()


def hollow(model: onnx.ModelProto) -> onnx.ModelProto:
    """Empty, in place, the values of `model`'s top-graph initializers above KEEP_BYTES (type and dims kept);
    returns `model`."""
    for tensor in model.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL or tensor.ByteSize() > KEEP_BYTES:
            dims, data_type, name = list(tensor.dims), tensor.data_type, tensor.name
            tensor.Clear()
            tensor.name, tensor.data_type = name, data_type
            tensor.dims.extend(dims)
    return model


def structure(path: str | Path) -> onnx.ModelProto:
    """The model at `path` with its large initializers emptied (module docstring): a fresh proto on every call,
    the file read once while it is unchanged. Raises what onnx.load raises on a file that is not ONNX."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        data = _CACHE.get(key)
    if data is None:
        data = hollow(onnx.load(str(path), load_external_data=False)).SerializeToString()
        with _LOCK:
            _CACHE[key] = data
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
    return onnx.load_model_from_string(data)
