"""A model run in pieces: each piece a model of its own holding some of the graph's nodes, whose inputs are the
tensors it reads from earlier pieces; one run of all pieces, one after the other, computes every node once.

The per-tensor diagnostics use it when one row's diagnosed tensors exceed `memory.budget`: the diagnosed tensors are
split into groups, piece k holds the nodes group k is the first to need and returns that group's tensors (and the
few tensors later pieces read), so only one group's tensors leave onnxruntime at a time, in one pass over the graph
instead of one pass per group. `Segments` raises SegmentError when a tensor a piece reads or returns has no element
type in onnx shape inference, or onnxruntime cannot load a piece (the caller then falls back to a model per group).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from calibrun.core.errors import one_line
from calibrun.model.graph import outer_reads


class SegmentError(Exception):
    """The model cannot be cut into these pieces (a tensor of unknown type between them, a piece that does not
    load)."""


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor's type the graph declares (inputs, outputs, value_info after onnx shape inference)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # onnx raises InferenceError and others on graphs it cannot read
        raise SegmentError(f"onnx shape inference failed: {one_line(exc)}") from exc
    types = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type
    return types


class Segments:
    """`groups[k]`: the tensors group k needs (graph inputs, or written by a node). `run(feeds)` yields, group
    by group, a dict of that group's tensors; tensors no later piece or group needs are dropped as it goes.

    `model_path` must keep its weights in external data (calibrun.model.private_model_copy writes it so): the
    pieces are written beside it and point into the same data file, so no weight is copied. Each piece's session
    is opened for its piece (`open`, then `step` per run) and dropped before the next: sessions kept open hold
    their threads, buffers and allocator arenas together (ocr_det at 512 then failed under a 1.6 GB address-space
    limit it passes otherwise)."""

    def __init__(self, model_path: str | Path, groups: Sequence[Sequence[str]],
                 open_session: Callable[[Path], object]):
        model_path = Path(model_path)
        model = onnx.load(str(model_path), load_external_data=False)
        graph = model.graph
        nodes = list(graph.node)
        initializers = {t.name: t for t in graph.initializer}
        self.groups = [list(dict.fromkeys(wanted)) for wanted in groups]
        reads = [{name for name in node.input if name} | outer_reads(node) for node in nodes]
        # each node runs in the piece of the first group that needs it (read backwards: a node is needed by the
        # groups its outputs are needed by); the nodes in piece order, each piece in graph order, are still in
        # topological order, as a node never is needed earlier than what it reads
        first: dict[str, int] = {}
        for k, wanted in enumerate(self.groups):
            for name in wanted:
                first.setdefault(name, k)
        piece_of: dict[int, int] = {}
        for i in range(len(nodes) - 1, -1, -1):
            k = min((first[name] for name in nodes[i].output if name in first), default=None)
            if k is None:
                continue  # no group needs it: not run
            piece_of[i] = k
            for name in reads[i]:
                first[name] = min(first.get(name, k), k)
        members: list[list[int]] = [[] for _ in self.groups]
        for i in sorted(piece_of):
            members[piece_of[i]].append(i)
        last: dict[str, int] = {}  # the last piece that reads a tensor, or group that wants it
        for i, k in piece_of.items():
            for name in reads[i]:
                last[name] = max(last.get(name, -1), k)
        for k, wanted in enumerate(self.groups):
            for name in wanted:
                last[name] = max(last.get(name, -1), k)
        self.expire: list[list[str]] = [[] for _ in self.groups]
        for name, k in last.items():
            if name not in initializers:
                self.expire[k].append(name)
        types = None
        self.pieces: list[tuple[Path, list[str], list[str]] | None] = []
        for k, indices in enumerate(members):
            if not indices:
                self.pieces.append(None)
                continue
            piece_nodes = [nodes[i] for i in indices]
            written = list(dict.fromkeys(name for node in piece_nodes for name in node.output if name))
            read = sorted(set().union(*(reads[i] for i in indices)) - set(written))
            inputs = [name for name in read if name not in initializers]
            outputs = [name for name in written if last.get(name, -1) > k or name in self.groups[k]]
            if types is None:
                types = _types(model)
            unknown = [name for name in (*inputs, *outputs) if name not in types]
            if unknown:
                raise SegmentError(f"no element type for {unknown[:3]}")
            sub = helper.make_graph(
                piece_nodes, f"{graph.name}_piece{k}", [helper.make_value_info(n, types[n]) for n in inputs],
                [helper.make_value_info(n, types[n]) for n in outputs],
                [initializers[name] for name in read if name in initializers])
            piece = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
            piece.functions.extend(model.functions)
            path = model_path.with_name(f"piece{k}.onnx")  # beside the data file its weights point into
            onnx.save_model(piece, str(path))
            try:
                open_session(path)  # loads: the diagnostics can still choose a model per group instead
            except Exception as exc:
                raise SegmentError(f"onnxruntime cannot load piece {k}: {one_line(exc)}") from exc
            self.pieces.append((path, inputs, outputs))
        self.open_session = open_session
        # the tensors a run holds between piece k and piece k + 1 (graph inputs included until their last reader)
        alive = {name for piece in self.pieces if piece for name in piece[1]} - {
            name for piece in self.pieces if piece for name in piece[2]}
        self.held_between: list[list[str]] = []
        for k, piece in enumerate(self.pieces):
            alive |= set(piece[2]) if piece else set()
            alive -= set(self.expire[k])
            self.held_between.append(sorted(alive))

    def run(self, feeds: Mapping[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """One run through every piece, one session at a time: each group's tensors as its piece ends."""
        carried = dict(feeds)
        for k in range(len(self.pieces)):
            yield self.step(k, self.open(k), carried)

    def open(self, k: int):
        """Piece k's session (None for a piece without nodes): each holds its own threads and buffers, so the
        caller keeps it only while it runs that piece."""
        piece = self.pieces[k]
        return None if piece is None else self.open_session(piece[0])

    def step(self, k: int, session, carried: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Piece k run on one run's `carried` tensors (the feeds, then what earlier pieces wrote), which gets the
        piece's outputs and loses what no later piece or group reads; returns group k's tensors."""
        piece = self.pieces[k]
        if piece is not None:
            _, inputs, outputs = piece
            carried.update(zip(outputs, session.run(outputs, {n: carried[n] for n in inputs}), strict=True))
        group = {name: carried[name] for name in self.groups[k]}
        for name in self.expire[k]:
            carried.pop(name, None)
        return group


class Carried:
    """What several runs carry from piece to piece when the pieces run one after the other over all of them (a
    piece's session then opens once for the runs, not once per run): each run's tensors held in memory while
    they fit `limit` bytes in all, else saved in `folder` until that run's turn."""

    def __init__(self, folder: Path, limit: int):
        self.folder, self.limit = Path(folder), limit
        self.held: dict[int, tuple] = {}
        self.saved: dict[int, tuple[Path, list]] = {}
        self.bytes: dict[int, int] = {}

    def put(self, run: int, tensors: Sequence[dict[str, np.ndarray]]) -> None:
        size = sum(a.nbytes for part in tensors for a in part.values())
        if sum(self.bytes.values()) + size <= self.limit or not self.held and not self.saved:
            self.held[run], self.bytes[run] = tuple(tensors), size
            return
        names = [list(part) for part in tensors]
        arrays = {f"a{i}": a for i, a in enumerate(a for part in tensors for a in part.values())}
        path = self.folder / f"carried-{run}.npz"
        np.savez(path, **arrays)
        self.saved[run] = (path, names)

    def take(self, run: int) -> tuple[dict[str, np.ndarray], ...]:
        if run in self.held:
            self.bytes.pop(run)
            return self.held.pop(run)
        path, names = self.saved.pop(run)
        with np.load(path, allow_pickle=False) as npz:
            arrays = iter(npz[f"a{i}"] for i in range(sum(len(part) for part in names)))
            tensors = tuple({name: next(arrays) for name in part} for part in names)
        path.unlink()
        return tensors
