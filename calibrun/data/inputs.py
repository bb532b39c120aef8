"""What each model input is fed: its element type, its batch axis, and constants (`data.inputs.<name>.*`).

- dtype: an input is fed in the type the model declares. Data is cast only when nothing is lost: any integer or
  float data into a float input (checked finite, and for overflow after the calibration factor), integer data into
  an integer input when every value fits, bool into bool. A float array into an integer or bool input, or integers
  into a bool input, is an error naming the input.
- batch axis: `batch_axis` when set, else calibrun.data.rows.infer_axis.
- constants: `value` (a number or a nested list), fed with every batch. An array of the input's rank is fed whole
  (never split; the input then has no batch axis); one with one axis fewer (a scalar for an `[N]` input, `[2, 128]`
  for a `[2, N, 128]` state) is one row, repeated along the batch axis to every batch's rows.
- the calibration factor multiplies float inputs only.
- fed back (`eval_data.inputs.<name>.from_output`, a recurrent state): the evaluation runs its rows in order, one at a
  time, and each model (fp32, int8, every candidate) feeds this input its own output of the previous row; the first
  row takes the state its data (or `value`) holds. An error the int8 model makes in its state then reaches every
  later row, as it does when the model is streamed (calibrun.measure.feedback).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from calibrun.core.errors import CalibrunError
from calibrun.data.rows import infer_axis, is_fixed
from calibrun.model import InputInfo

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)


def fmt_shape(shape: Sequence) -> str:
    return "[" + ", ".join("?" if d is None or d == "" else str(d) for d in shape) + "]"


def declared(info: InputInfo) -> str:
    """`'sr' (INT64 [])`: an input as the model declares it."""
    name = TensorProto.DataType.Name(info.elem_type) if info.elem_type else "unknown type"
    return f"{info.name!r} ({name} {fmt_shape(info.shape)})"


def input_dtype(info: InputInfo) -> np.dtype:
    """The numpy dtype the input takes; an input calibrun cannot feed (string, complex, unknown) is an error."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type)) if info.elem_type else None
    except (KeyError, ValueError, TypeError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise CalibrunError(f"input {declared(info)}: calibrun feeds numeric and bool inputs only")
    return dtype


def is_float(info: InputInfo) -> bool:
    return info.elem_type in FLOAT_TYPES


def check_dtype(data: np.dtype, info: InputInfo, where: str, values_known: bool = False) -> np.dtype:
    """The dtype `info` takes, if `data` casts to it without loss (values are checked by `cast`); else an error.
    bool casts to any integer type. `values_known`: a constant, whose values `cast` checks as it is read: floats into
    an integer input (each a whole number) and integers into a bool one (each 0 or 1) are taken too; rows of a file
    are read batch by batch, and an evaluation file's would fail only after the calibration, so they are not."""
    want = input_dtype(info)
    if data.hasobject:
        raise CalibrunError(f"input {declared(info)}: {where} is an object array (dtype {data}); calibrun never "
                            "loads pickled data")
    if data.kind not in "biuf":
        raise CalibrunError(f"input {declared(info)}: {where} has dtype {data}, which is not numeric or bool")
    ok = (want.kind == "f" and data.kind in "iuf") or (want.kind in "iu" and data.kind in "biu") or \
        (want.kind == "b" and data.kind == "b") or \
        (values_known and ((want.kind in "iu" and data.kind == "f") or (want.kind == "b" and data.kind in "iu")))
    if not ok:
        hint = f" (if it holds only 0 and 1, save it as bool: {data}_array.astype(bool))" \
            if want.kind == "b" and data.kind in "iu" else ""
        raise CalibrunError(f"input {declared(info)}: {where} holds {data} data, which does not cast to "
                            f"{want} without loss{hint}")
    return want


def cast(raw: np.ndarray, info: InputInfo, factor: float, where: str, first_row: int = 0,
         values_known: bool = False) -> np.ndarray:
    """`raw` as the input's dtype: float inputs are `raw * factor` computed in float64 (NaN/Inf and overflow name
    the file and row); integers must fit (bool as 0 and 1); a bool input takes bool. `values_known`: a constant
    (check_dtype): floats into an integer input each a whole number, integers into a bool one each 0 or 1."""
    want = check_dtype(np.asarray(raw).dtype, info, where, values_known)
    if want.kind == "f":
        values = np.asarray(raw, dtype=np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            raise CalibrunError(f"{where}: NaN or Inf in row {first_row + _first_row(bad)}")
        with np.errstate(over="ignore"):  # overflow is reported below, naming the file
            out = (values * factor).astype(want) if factor != 1.0 else values.astype(want)
        bad = ~np.isfinite(out)
        if bad.any():
            scaled = f" multiplied by {factor}" if factor != 1.0 else ""
            raise CalibrunError(f"{where}: row {first_row + _first_row(bad)}{scaled} overflows {want}")
        return out
    raw = np.asarray(raw)
    if raw.dtype == want:
        return raw
    if want.kind == "b":  # 0/1 integers: a mask saved as numbers
        bad = (raw != 0) & (raw != 1)
        if bad.any():
            raise CalibrunError(f"input {declared(info)}: {where} holds {raw.dtype} data with values other than 0 and "
                                f"1 ({raw[bad].flat[0]} in row {first_row + _first_row(bad)}), which does not cast to "
                                f"{want} without loss")
        return raw.astype(want)
    if raw.dtype.kind == "f":  # whole numbers saved as floats (a sample rate of 16000.0, token ids from a pipeline)
        bad = ~np.isfinite(raw) | (raw != np.round(raw))
        if bad.any():
            raise CalibrunError(f"input {declared(info)}: {where} holds {raw.dtype} data that is not whole numbers "
                                f"({raw[bad].flat[0]} in row {first_row + _first_row(bad)}), which does not cast to "
                                f"{want} without loss")
    if want.kind in "iu" and not np.can_cast(raw.dtype, want) and raw.size:
        low, high, info_range = raw.min(), raw.max(), np.iinfo(want)
        if low < info_range.min or high > info_range.max:
            raise CalibrunError(f"input {declared(info)}: {where} holds values {low}..{high}, outside {want}'s "
                                f"range {info_range.min}..{info_range.max}")
    return raw.astype(want)


def _first_row(bad: np.ndarray) -> int:
    return int(np.argwhere(bad)[0][0]) if bad.ndim else 0


# --- config: `data.inputs.<name>` / `eval_data.inputs.<name>` (calibrun.config assembles the schema) ---

@dataclass
class InputConf:
    """One model input's data options (docs/data.md)."""

    value: Any = None  # a constant fed with every batch: a number or a nested list (null: from the data files)
    batch_axis: int | None = None  # the axis rows are counted along (null: inferred from the graph shape)
    from_output: str | None = None  # eval_data only: the output this input takes back on the next row (a state)


@dataclass(frozen=True)
class Constant:
    """A constant input: fed whole (axis None), or one row repeated along `axis` to every batch's rows."""

    array: np.ndarray
    axis: int | None
    where: str

    def fed(self, rows: int) -> np.ndarray:
        if self.axis is None:
            return self.array
        return np.repeat(np.expand_dims(self.array, self.axis), rows, axis=self.axis)

    def identity(self) -> dict:
        array = np.asarray(self.array)
        if array.size <= 16:
            value = array.tolist()
        else:
            value = {"sha256": hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()}
        return {"value": value, "shape": list(array.shape), "row": self.axis is not None}


def constant(info: InputInfo, array, axis: int | None, where: str) -> Constant:
    """`array` as a constant for `info`: of the input's rank (fed whole) or one axis fewer (one row along `axis`)."""
    try:
        raw = np.asarray(array)
    except (ValueError, TypeError) as exc:  # a ragged nested list
        raise CalibrunError(f"input {declared(info)}: {where} is not an array ({exc})") from None
    if raw.dtype.hasobject and where.startswith("config "):  # not pickled data: a value numpy holds as an object
        shown = repr(array) if len(repr(array)) <= 60 else repr(array)[:57] + "..."
        raise CalibrunError(f"input {declared(info)}: {where} is {shown}, which no numeric type holds (an integer "
                            f"past 64 bits, or numbers mixed with other values); {declared(info)} takes "
                            f"{input_dtype(info)}")
    values = cast(raw, info, 1.0, where, values_known=True)
    rank = len(info.shape)
    if values.ndim < rank and all(map(is_fixed, info.shape)):
        # every axis fixed: no batch axis to repeat a row along (a [25] state beside free-batch inputs); the value
        # fills the declared shape, fed whole (for a model that pins its batch, the same as one row repeated)
        try:
            values = np.ascontiguousarray(np.broadcast_to(values, tuple(info.shape)))
        except ValueError:
            raise CalibrunError(f"input {declared(info)}: {where} has shape {fmt_shape(values.shape)}, which does not "
                                "fill the input's fixed shape") from None
    row_dims = [d for a, d in enumerate(info.shape) if a != axis] if axis is not None else None
    if values.ndim == 0 and rank > 1 and row_dims is not None and all(map(is_fixed, row_dims)):
        # one number for a row of fixed axes (a recurrent state's zeros: value=0 for silero's [2, N, 128]): the row
        # filled with it, repeated along the batch axis like any one-row constant
        values = np.full(tuple(row_dims), values, values.dtype)
    if values.ndim == rank:
        dims = list(zip(info.shape, values.shape, strict=True))
        row = None
    elif values.ndim == rank - 1 and axis is not None:
        dims = list(zip([d for a, d in enumerate(info.shape) if a != axis], values.shape, strict=True))
        row = axis
    else:
        raise CalibrunError(f"input {declared(info)}: {where} has shape {fmt_shape(values.shape)}; a constant has "
                            f"the input's rank {rank}" + (" (or one axis fewer: one row)" if axis is not None else ""))
    if any(is_fixed(want) and want != got for want, got in dims):
        as_what = "a constant fed whole" if row is None else f"one row (rank {rank - 1}, batch axis {row} left out)"
        raise CalibrunError(f"input {declared(info)}: {where} has shape {fmt_shape(values.shape)} (rank "
                            f"{values.ndim}), which does not fit the input's fixed axes as {as_what}")
    return Constant(values, row, where)


KEY_CHARACTER = re.compile(r"[A-Za-z0-9_\-]")  # what Hydra's override grammar takes in a key (besides the dots)


def spelled(name: str) -> str:
    """An input name as an override key can hold it: each character Hydra's key grammar refuses (tf2onnx's
    `input_1:0`, a `/` in a scope) as `_` (dots stay: a dotted name is nested, then joined back)."""
    return "".join(c if c == "." or KEY_CHARACTER.fullmatch(c) else "_" for c in name)


def named(node: Mapping, options: Collection[str]) -> dict[str, Any]:
    """{input name: its options} of an `inputs` node. A name with dots (PyTorch's `input.1`) arrives nested, as
    OmegaConf reads `data.inputs.input.1.value=...` (inputs: {input: {1: {value: ...}}}): joined back."""
    out: dict[str, Any] = {}

    def walk(name: str, value) -> None:
        if isinstance(value, Mapping) and value and not any(str(k) in options for k in value):
            for key, inner in value.items():
                walk(f"{name}.{key}", inner)
        else:
            out[name] = value

    for key, value in node.items():
        walk(str(key), value)
    return out


def overrides(node: Mapping | None, inputs: Sequence[InputInfo], key: str) -> dict[str, Mapping]:
    """`<key>.inputs` as {name: {value, batch_axis}} (InputConf's fields, its defaults filled in), every name
    checked against the model's inputs (a name with characters a key cannot hold given as `spelled`) and every
    option against InputConf's."""
    options = {f.name: f.default for f in dataclasses.fields(InputConf)}
    names = [info.name for info in inputs]
    aliases = {spelled(n): n for n in names if spelled(n) != n and sum(spelled(m) == spelled(n) for m in names) == 1}
    node = {aliases.get(name, name): given for name, given in named(dict(node or {}), options).items()}
    unknown = [name for name in node if name not in names]
    if unknown:
        hint = (f"; an input name with characters a key cannot hold is written with _ in their place: "
                f"{', '.join(f'{spelled(n)} for {n}' for n in names if spelled(n) != n)}" if aliases else "")
        raise CalibrunError(f"config {key}.inputs: {', '.join(map(repr, unknown))} "
                            f"{'is not an input' if len(unknown) == 1 else 'are not inputs'} of the model "
                            f"(inputs: {', '.join(names)}){hint}")
    out = {}
    for name, given in node.items():
        if not isinstance(given, Mapping):
            raise CalibrunError(f"config {key}.inputs.{name}: must hold {' and/or '.join(options)} "
                                f"({key}.inputs.{name}.value=...), got {given!r}")
        bad = [option for option in given if option not in options]
        if bad:
            raise CalibrunError(f"config {key}.inputs.{name}.{bad[0]}: is not an option of an input "
                                f"(options: {', '.join(options)})")
        out[name] = {**options, **given}
    return out


def batch_axes(inputs: Sequence[InputInfo], given: Mapping[str, Mapping], key: str) -> dict[str, int | None]:
    """Each input's batch axis: `<key>.inputs.<name>.batch_axis` (checked against the rank), else inferred."""
    axes = {}
    for info in inputs:
        axis = given.get(info.name, {}).get("batch_axis")
        if axis is None:
            axes[info.name] = infer_axis(info.shape)
            continue
        rank = len(info.shape)
        if rank == 0:
            raise CalibrunError(f"config {key}.inputs.{info.name}.batch_axis: input {declared(info)} is a scalar, "
                                f"with no axis to hold rows; it is a constant ({key}.inputs.{info.name}.value=...)")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
            raise CalibrunError(f"config {key}.inputs.{info.name}.batch_axis: must be an axis of input "
                                f"{declared(info)} (0..{rank - 1}, or -{rank}..-1 from the end), got {axis!r}")
        axes[info.name] = axis % rank
    return axes


def config_constants(inputs: Sequence[InputInfo], given: Mapping[str, Mapping], axes: Mapping[str, int | None],
                     key: str) -> dict[str, Constant]:
    """The constants `<key>.inputs.<name>.value` sets."""
    out = {}
    for info in inputs:
        value = given.get(info.name, {}).get("value")
        if value is not None:
            value = value.tolist() if isinstance(value, np.ndarray) else _plain(value)
            out[info.name] = constant(info, value, axes[info.name], f"config {key}.inputs.{info.name}.value")
    return out


def fed_back(given: Mapping[str, Mapping], inputs: Sequence[InputInfo], outputs: Sequence, key: str) -> dict[str, str]:
    """{input: output} of `<key>.inputs.<name>.from_output` (`given` as `overrides` returns it), each output checked
    against the model's (`outputs`: onnx ValueInfoProto): it exists, has the input's element type, and its declared
    axes do not contradict the input's. Only the evaluation feeds a state back: under `data` it is an error (the
    calibration rows carry the state their data holds)."""
    wanted = {name: conf["from_output"] for name, conf in given.items() if conf.get("from_output") is not None}
    if wanted and key != "eval_data":
        name = next(iter(wanted))
        raise CalibrunError(f"config {key}.inputs.{name}.from_output: is read by the evaluation only "
                            f"(eval_data.inputs.{name}.from_output); calibration rows feed the state their data holds")
    infos = {info.name: info for info in inputs}
    declared_outputs = {o.name: o for o in outputs}
    out = {}
    for name, output in wanted.items():
        where = f"config {key}.inputs.{name}.from_output"
        if not isinstance(output, str) or output not in declared_outputs:
            raise CalibrunError(f"{where}: {output!r} is not an output of the model (outputs: "
                                f"{', '.join(declared_outputs)})")
        tensor = declared_outputs[output].type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim] \
            if tensor.HasField("shape") else None
        info = infos[name]
        if tensor.elem_type and info.elem_type and tensor.elem_type != info.elem_type:
            raise CalibrunError(f"{where}: output {output!r} is {TensorProto.DataType.Name(tensor.elem_type)}, input "
                                f"{declared(info)} takes {TensorProto.DataType.Name(info.elem_type)}")
        if shape is not None and info.has_shape and (len(shape) != len(info.shape) or any(
                is_fixed(a) and is_fixed(b) and a != b for a, b in zip(shape, info.shape, strict=False))):
            raise CalibrunError(f"{where}: output {output!r} {fmt_shape(shape)} does not fit input {declared(info)}")
        out[name] = output
    return out


def _plain(value):
    """A config value (OmegaConf ListConfig included) as plain Python lists and numbers."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        return value
    return [_plain(v) for v in value]
