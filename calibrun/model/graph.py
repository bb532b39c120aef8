"""Reading a quantised graph: the input's scale and zero point, node counts, op histogram."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from calibrun.errors import CalibrunError
from calibrun.model import graph_inputs, load_model

# QOperator ops whose inputs are (x, x_scale, x_zero_point, ...): where the input scale sits when no
# QuantizeLinear reads the graph input directly.
_QLINEAR_X_SCALE = {"QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul", "QGemm", "QLinearSigmoid",
                    "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSoftmax",
                    "QLinearConcat", "QLinearReduceMean", "QLinearWhere"}


@dataclass(frozen=True)
class InputQuant:
    scale: float
    zero_point: int

    @property
    def observed_span(self) -> float:
        """The range width the graph pinned for the input: scale * 255."""
        return self.scale * 255


def constant_tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Every constant of the graph by name: initializers and the outputs of Constant nodes."""
    values = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = attr.t
    return values


def input_quant(model: onnx.ModelProto, where: str = "model") -> InputQuant:
    """Scale and zero point pinned for the graph input.

    QDQ and QOperator: the QuantizeLinear whose first input is the graph input; otherwise the QLinear*/QGemm
    op that takes the graph input directly (its x_scale, x_zero_point inputs).
    """
    inputs = graph_inputs(model)
    if not inputs:
        raise CalibrunError(f"{where} has no graph input")
    name = inputs[0].name
    constants = constant_tensors(model)
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input and node.input[0] == name:
            return _read(constants, node.input[1], node.input[2] if len(node.input) > 2 else "", where)
    for node in model.graph.node:
        if node.op_type in _QLINEAR_X_SCALE and node.input and node.input[0] == name:
            return _read(constants, node.input[1], node.input[2], where)
    moved = _through_data_movement(model, name)
    if moved is not None:  # e.g. YOLOX's Focus: Slice x4 -> Concat, whose output carries the input's values
        return _read(constants, moved.input[1], moved.input[2] if len(moved.input) > 2 else "", where)
    raise CalibrunError(f"{where}: graph input {name!r} is not quantised (no QuantizeLinear or QLinear op reads it)")


# Ops that only move or select values: a QuantizeLinear after a chain of them quantises the input's own values.
_DATA_MOVEMENT = {"Slice", "Concat", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Split",
                  "SpaceToDepth", "DepthToSpace"}


def _through_data_movement(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    """The first QuantizeLinear reached from graph input `name` through data-movement ops only, when every
    consumer on the way is one (breadth first); else None."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for tensor in node.input:
            consumers.setdefault(tensor, []).append(node)
    frontier, seen = [name], {name}
    while frontier:
        tensor = frontier.pop(0)
        for node in consumers.get(tensor, []):
            if node.op_type == "QuantizeLinear" and node.input[0] == tensor:
                return node
            if node.op_type not in _DATA_MOVEMENT:
                return None
            for out in node.output:
                if out not in seen:
                    seen.add(out)
                    frontier.append(out)
    return None


def _read(constants: dict[str, onnx.TensorProto], scale_name: str, zp_name: str, where: str) -> InputQuant:
    if scale_name not in constants:
        raise CalibrunError(f"{where}: input scale {scale_name!r} is not a constant")
    scale = numpy_helper.to_array(constants[scale_name])
    if scale.size != 1:
        raise CalibrunError(f"{where}: input scale {scale_name!r} is per-channel ({scale.size} values)")
    zero_point = numpy_helper.to_array(constants[zp_name]) if zp_name in constants else np.zeros(1, np.int32)
    return InputQuant(float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0]))


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """op type -> node count, sorted by op type."""
    return dict(sorted(Counter(node.op_type for node in model.graph.node).items()))


def scales_summary(model: onnx.ModelProto, where: str = "model") -> dict:
    """The `scales` contract: input_scale, input_zero_point, observed_span, quantize/dequantize node counts."""
    quant = input_quant(model, where)
    ops = op_counts(model)
    return {
        "input_scale": quant.scale,
        "input_zero_point": quant.zero_point,
        "observed_span": quant.observed_span,
        "quantize_nodes": ops.get("QuantizeLinear", 0),
        "dequantize_nodes": ops.get("DequantizeLinear", 0),
    }


def scales(path: str | Path) -> dict:
    return scales_summary(load_model(path), str(path))
