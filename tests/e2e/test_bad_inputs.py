"""Bad inputs across calibtool, the Hydra config and the data sources: one table, one test.

One row per kind of failure, for each app it reaches: calibtool's own table of bad arguments and files is in
test_calibtool.py, and every config value and bound is checked in process in tests/unit/test_config.py. A row here
checks what only a whole run shows (one line, exit code, nothing written, the store left readable).

Every case runs as a subprocess in its own tmp folder (working directory, run dir, cache, MLflow store).
A failing case must exit non-zero with one clear last line on stderr naming the problem, print no
traceback, leave no temp file behind, write no model and no `ok` result, and leave any MLflow store it
created readable. The corrupt-cache cases must instead succeed with a one-line warning.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import CALIBTOOL, clean_env, run_python
from tests.modelzoo import int_input_model, save, stateful_model
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow  # subprocesses of the CLIs (multi-second each): `pytest -m "not slow"` leaves them out

TIMEOUT = 120  # seconds per case; a case that has not finished by then is a hang
HANG_TIMEOUT = 60  # the unanswered tracking server


# --- shared inputs ---------------------------------------------------------------------------------------------


def conv_model() -> onnx.ModelProto:
    """A tiny image model: NCHW [N, 3, 8, 8] -> Conv -> Relu -> GlobalAveragePool -> Flatten."""
    w = np.random.default_rng(3).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["img", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["y"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes, "tests_conv",
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def grouped_transpose_model() -> onnx.ModelProto:
    """A ConvTranspose of two groups ([N, 16, 1, 8] -> [N, 16, 1, 12], weight [16, 8, 1, 5]) with a bias, as GTCRN's
    decoder has: onnxruntime's per-channel bias quantisation fails on it (16 biases, 8 weight scales), after its
    loop over the nodes has reached the Relu behind it (the error must name the ConvTranspose, not the last node)."""
    rng = np.random.default_rng(4)
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], group=2, name="up"),
         helper.make_node("Relu", ["y"], ["z"], name="after")], "tests_grouped_transpose",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 1, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 16, 1, 12])],
        initializer=[numpy_helper.from_array(rng.normal(0, 0.1, (16, 8, 1, 5)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def fails_when_run_model() -> onnx.ModelProto:
    """[N, 4] -> Reshape to [5] -> Relu: a valid model onnxruntime loads, whose Reshape fails on every batch it runs
    (4N values never make 5): the failure of a run, not of a load."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="to_five"),
         helper.make_node("Relu", ["r"], ["y"], name="relu")], "tests_fails_when_run",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        initializer=[numpy_helper.from_array(np.array([5], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def nan_on_zero_rows_model() -> onnx.ModelProto:
    """[N, 4] -> each row divided by its own sum -> MatMul: a row of zeros (padding only) is 0 / 0, NaN in every
    value after the Div, as a masked mean over a row of padding is (an unseen protein classifier's)."""
    w = np.random.default_rng(3).normal(0, 1, (4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["total"], name="total", keepdims=1),
         helper.make_node("Div", ["x", "total"], ["share"], name="share"),
         helper.make_node("MatMul", ["share", "w"], ["y"], name="head")], "tests_nan_on_zero_rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axes"), numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")


class Assets:
    """Input files shared by the cases (read only: the fixture checks that no case touched them)."""

    def __init__(self, root: Path):
        from calibrun.lab.model import write_lab_model

        self.root = root
        self.lab = write_lab_model(root / "lab.onnx")
        data = self.lab.read_bytes()
        self.missing = root / "missing.onnx"
        self.truncated = root / "truncated.onnx"
        self.truncated.write_bytes(data[: len(data) // 2])
        self.int64 = save(int_input_model(), root / "int64.onnx")
        self.folder_model = root / "a_folder.onnx"
        self.folder_model.mkdir()
        self.conv = save(conv_model(), root / "conv.onnx")
        self.grouped = save(grouped_transpose_model(), root / "grouped.onnx")
        self.fails_when_run = save(fails_when_run_model(), root / "fails_when_run.onnx")
        self.nan_on_zero_rows = save(nan_on_zero_rows_model(), root / "nan_on_zero_rows.onnx")
        self.zero_rows = root / "zero_rows.npy"  # padding only: the model computes 0 / 0 on every row
        np.save(self.zero_rows, np.zeros((32, 4), np.float32))
        self.grouped_rows = root / "grouped_rows.npy"
        np.save(self.grouped_rows, np.random.default_rng(5).normal(0, 1, (16, 16, 1, 8)).astype(np.float32))

        rows = np.random.default_rng(1).normal(0, 1, (64, 16)).astype(np.float32)
        nan, inf = rows.copy(), rows.copy()
        nan[5, 3] = np.nan
        inf[40, 0] = np.inf
        self.nan_npz = root / "nan.npz"
        np.savez(self.nan_npz, x=nan)
        self.inf_npz = root / "inf.npz"
        np.savez(self.inf_npz, x=inf)
        self.no_input_npz = root / "no_input.npz"  # two keys, neither is the model's input 'x'
        np.savez(self.no_input_npz, a=rows, b=rows)
        self.object_npy = root / "object.npy"
        np.save(self.object_npy, np.array([{"row": i} for i in range(32)], dtype=object), allow_pickle=True)
        self.narrow_npy = root / "five_features.npy"  # the lab model takes 16 features
        np.save(self.narrow_npy, rows[:, :5])
        self.empty_dir = root / "empty_dir"
        self.empty_dir.mkdir()
        self.images = root / "images"
        self.images.mkdir()
        from PIL import Image

        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(self.images / "a.png")
        (self.images / "b.png").write_bytes(b"definitely not a png\n" * 8)
        self.plain = root / "plain.txt"  # a regular file where a folder is expected
        self.plain.write_text("keep me\n")
        from calibrun.model import open_float_model
        from calibrun.quant.quantize import quantize_lab

        self.int8 = root / "int8.onnx"
        quantize_lab(open_float_model(self.lab), self.int8, 1, 1.0, 2)
        no_outputs = onnx.load(str(self.lab))
        del no_outputs.graph.output[:]
        self.no_outputs = save(no_outputs, root / "no_outputs.onnx")
        self.missing_npy = root / "missing.npy"
        self.missing_dir = root / "missing_images"
        self.rows_npy = root / "rows.npy"  # 64 good rows for the lab model
        np.save(self.rows_npy, rows)
        labels = np.zeros(64, np.int64)  # the lab model's output has 8 classes: 0..7
        labels[40] = 99
        self.labels_99 = root / "labels_99.npz"
        np.savez(self.labels_99, x=rows, labels=labels)
        labels[40] = -1
        self.labels_minus_1 = root / "labels_minus_1.npz"
        np.savez(self.labels_minus_1, x=rows, labels=labels)
        symbolic = onnx.load(str(self.lab))
        symbolic.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"
        self.symbolic = save(symbolic, root / "symbolic.onnx")
        # a stateful model (`input` [N, 8], `state` [2, N, 4], `sr` an int64 scalar) and data for it
        self.stateful = save(stateful_model(), root / "stateful.onnx")
        steps = {"input": rows[:, :8], "state": np.stack([rows[:, :4], rows[:, 4:8]])}
        self.stateful_no_sr = root / "stateful_no_sr.npz"
        np.savez(self.stateful_no_sr, **steps)
        self.stateful_float_sr = root / "stateful_float_sr.npz"
        np.savez(self.stateful_float_sr, **steps, sr=np.array(16000.5))  # a 0-d constant: whole would be taken


# --- the table -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One bad input.

    `args(assets, root)` builds the command line: calibtool's arguments, or calibrun's overrides (the case's
    run dir and cache dir are added unless given). `word` must appear in the error line.
    """

    id: str
    tool: str  # "calibtool" | "calibrun"
    args: Callable[[Assets, Path], list]
    word: str
    early: bool = False  # fails before any work: no result.json, no model, no cache
    ok: bool = False  # not an error: must exit 0 with a one-line warning containing `word`
    quantized: bool = False  # fails after the int8 model was written (evaluation data is read last)
    tracking: bool = False  # track in a local MLflow store (the default is tracking=off)
    setup: Callable[[Assets, Path], None] | None = None
    env: Callable[[Assets, Path], dict] = field(default=lambda a, r: {})
    timeout: float = TIMEOUT
    xfail: str | None = None


def ct_quantize(model):
    """calibtool quantize of `model(assets)` into out/q.onnx."""
    return lambda a, r: ["quantize", model(a), "out/q.onnx", "1", "1.0", "2"]


def file_model(which: str):
    return lambda a, r: ["model=file", f"model.path={getattr(a, which)}"]


def stateful(a) -> list[str]:
    return ["model=file", f"model.path={a.stateful}"]


def npy_data(which: str, key: str = "data"):
    return lambda a, r: [f"{key}=npy", f"{key}.path={getattr(a, which)}"]


def _corrupt_cache(folder: Path) -> None:
    ranges = [p for p in folder.glob("*.json") if not p.name.endswith(".key.json")]
    assert ranges, f"the first run left no cache file in {folder}"
    for path in ranges:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # truncated JSON


def _calibtool_then_corrupt(a: Assets, root: Path) -> None:
    code, _, stderr, _ = _calibtool(["quantize", a.lab, "first.onnx", "1", "1.0", "2"], root, _env(root, {}))
    assert code == 0, stderr
    (root / "first.onnx").unlink()
    _corrupt_cache(root / "cache" / "ranges")


def _calibrun_then_corrupt(a: Assets, root: Path) -> None:
    proc = _calibrun(["batches=2", f"hydra.run.dir={root / 'first'}", f"cache.dir={root / 'cache'}",
                      "tracking=off"], root, _env(root, {}), TIMEOUT)
    assert proc[0] == 0, proc[2]
    _corrupt_cache(root / "cache" / "ranges")


def _calibrun_then_truncate_prepared(a: Assets, root: Path) -> None:
    proc = _calibrun(["batches=2", "model=file", f"model.path={a.conv}", "data=npy", f"data.path={root / 'x.npy'}",
                      "eval_data=npy", f"eval_data.path={root / 'x.npy'}", "eval.rows=4",
                      f"hydra.run.dir={root / 'first'}", f"cache.dir={root / 'cache'}", "tracking=off"],
                     root, _env(root, {}), TIMEOUT)
    assert proc[0] == 0, proc[2]
    (prepared,) = (root / "cache" / "models").glob("*.onnx")
    prepared.write_bytes(prepared.read_bytes()[:100])


def _conv_rows(a: Assets, root: Path) -> None:
    np.save(root / "x.npy", np.random.default_rng(2).normal(0, 1, (8, 3, 8, 8)).astype(np.float32))


def closed_port() -> int:
    """A port nobody listens on (bound once by the OS to pick it, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



CASES = [
    # The unanswered tracking server first: MLflow's HTTP retries made it hang for minutes (tracking.check_server
    # now fails at once); HANG_TIMEOUT turns a hang back into a failure of this case alone.
    Case("calibrun-tracking-server-not-answering", "calibrun",
         lambda a, r: ["batches=2", "tracking=server", f"tracking.uri=http://127.0.0.1:{closed_port()}"],
         "not reachable", tracking=True, timeout=HANG_TIMEOUT),
    # calibtool (its other bad files, numbers and outputs: test_calibtool.py)
    Case("calibtool-model-truncated", "calibtool", ct_quantize(lambda a: a.truncated), "not an ONNX model"),
    Case("calibtool-cache-parent-is-a-file", "calibtool", ct_quantize(lambda a: a.lab), "cache",
         env=lambda a, r: {"CALIBRUN_CACHE": str(a.plain / "cache")}),
    Case("calibtool-cache-corrupt-is-recomputed", "calibtool", ct_quantize(lambda a: a.lab), "unusable",
         ok=True, setup=_calibtool_then_corrupt),
    # calibrun model=file: bad files through the Hydra app (empty, text, random bytes: test_calibtool.py)
    Case("calibrun-model-missing", "calibrun", file_model("missing"), "not found"),
    Case("calibrun-model-truncated-tracked", "calibrun", file_model("truncated"), "not an ONNX model",
         tracking=True),
    # named as the user gave it, not as its prepared copy in the cache's models folder
    Case("calibrun-model-int64-input", "calibrun", file_model("int64"), "int64.onnx: input 'ids' is INT64"),
    # onnxruntime's own quantize_static raises (a numpy ValueError deep in its quantizer): one line saying so,
    # with the option, the node and the function
    Case("calibrun-quantize-static-fails-inside-onnxruntime", "calibrun",
         lambda a, r: ["model=file", f"model.path={a.grouped}", "data=npy", f"data.path={a.grouped_rows}",
                       "eval_data=npy", f"eval_data.path={a.grouped_rows}", "quant.per_channel=true", "batches=1"],
         "onnxruntime's quantize_static failed at node 'up' (ConvTranspose) with quant.per_channel=true in "),
    Case("calibrun-model-is-a-folder", "calibrun", file_model("folder_model"), "not a file"),
    # onnxruntime loads the model and fails when it runs it: its text, with what calibrun was doing
    Case("calibrun-model-fails-when-run", "calibrun", file_model("fails_when_run"),
         "calibration: onnxruntime fails to run the model on calibration batches 0..15: [ONNXRuntimeError] : 1 : "
         "FAIL : Non-zero status code returned while running Reshape node. Name:'to_five'"),
    # calibration rows on which the model computes NaN (0 / 0): named before onnxruntime's "scale issue"
    Case("calibrun-model-computes-nan-on-the-calibration-rows", "calibrun",
         lambda a, r: ["model=file", f"model.path={a.nan_on_zero_rows}", "data=npy", f"data.path={a.zero_rows}",
                       "batches=2"],
         "the calibrated range of tensor 'share' (written by Div node 'share') is NaN, and so is that of 1 tensor(s) "
         "after it (y): the fp32 model computes NaN there on the calibration rows"),
    # data sources
    Case("data-npz-nan-tracked", "calibrun", npy_data("nan_npz"), "NaN", tracking=True),
    Case("data-npz-inf", "calibrun", npy_data("inf_npz"), "Inf"),
    Case("eval-data-npz-nan", "calibrun", npy_data("nan_npz", "eval_data"), "NaN", quantized=True),
    Case("data-empty-folder", "calibrun", npy_data("empty_dir"), "empty"),
    Case("data-npz-missing-the-model-input", "calibrun", npy_data("no_input_npz"), "'x'"),
    Case("data-npy-object-array", "calibrun", npy_data("object_npy"), "object"),
    Case("data-npy-wrong-feature-count", "calibrun", npy_data("narrow_npy"), "axis 1"),
    # inputs of every type (docs/data.md): the one line names the input, its declared type and shape, and the data
    Case("data-float-array-for-an-int64-input", "calibrun",
         lambda a, r: [*stateful(a), "data=npy", f"data.path={a.stateful_float_sr}"],
         "stateful_float_sr.npz['sr'] holds float64 data that is not whole numbers (16000.5 in row 0), which does not "
         "cast to int64 without loss"),
    Case("data-scalar-input-without-a-value", "calibrun",
         lambda a, r: [*stateful(a), "data=npy", f"data.path={a.stateful_no_sr}"],
         "no array for input 'sr' (INT64 []) (keys: input, state); or set data.inputs.sr.value=..."),
    Case("data-inputs-unknown-name", "calibrun",
         lambda a, r: [*stateful(a), "data=npy", f"data.path={a.stateful_no_sr}", "data.inputs.rate.value=1"],
         "config data.inputs: 'rate' is not an input of the model (inputs: input, state, sr)"),
    Case("data-inputs-float-value-for-an-int64-input", "calibrun",
         lambda a, r: [*stateful(a), "data=npy", f"data.path={a.stateful_no_sr}", "data.inputs.sr.value=0.5"],
         "input 'sr' (INT64 []): config data.inputs.sr.value holds float64 data that is not whole numbers (0.5 in row "
         "0), which does not cast to int64 without loss"),
    Case("eval-data-inputs-batch-axis-out-of-range", "calibrun",
         lambda a, r: [*stateful(a), "data=npy", f"data.path={a.stateful_no_sr}", "data.inputs.sr.value=16000",
                       "eval_data=npy", f"eval_data.path={a.stateful_no_sr}", "eval_data.inputs.sr.value=16000",
                       "eval_data.inputs.state.batch_axis=3"],
         "config eval_data.inputs.state.batch_axis: must be an axis of input 'state' (FLOAT [2, N, 4]) (0..2, or "
         "-3..-1 from the end), got 3"),
    Case("data-inputs-unknown-option", "calibrun",
         lambda a, r: [*stateful(a), "data=npy", f"data.path={a.stateful_no_sr}", "data.inputs.sr.valu=1"],
         "config data.inputs.sr.valu: is not a calibrun setting", early=True),
    Case("data-images-unreadable-file", "calibrun",
         lambda a, r: ["model=file", f"model.path={a.conv}", "data=images", f"data.path={a.images}",
                       "data.resize=8", "data.crop=8", "batches=1"], "b.png"),
    # config: an unknown option, a wrong type, a bad value, a missing value (each value: tests/unit/test_config.py)
    Case("config-unknown-calibration", "calibrun", lambda a, r: ["calibration=foo"],
         "Could not find 'calibration/foo'; Available options in 'calibration': match, narrow, wide", early=True),
    Case("config-batches-zero", "calibrun", lambda a, r: ["batches=0"], "config batches: must be in 1..100000, got 0",
         early=True),
    Case("config-batches-not-a-number", "calibrun", lambda a, r: ["batches=abc"],
         "Error merging override batches=abc; Value 'abc' of type 'str' could not be converted to Integer", early=True),
    Case("config-override-unreadable", "calibrun", lambda a, r: ["batches=[1"],
         "cannot read the override 'batches=[1': no viable alternative at input '[1'", early=True),
    Case("config-braces-split-by-a-shell", "calibrun",  # bash's words for quant.tensor_ranges={x:[0.0,1.0],y:[2.0,3.0]}
         lambda a, r: ["quant.tensor_ranges=x:[0.0", "quant.tensor_ranges=1.0]", "quant.tensor_ranges=y:[2.0",
                       "quant.tensor_ranges=3.0]"],
         "cannot read the override 'quant.tensor_ranges=x:[0.0': mismatched input '[' expecting <EOF> (Hydra's "
         "grammar: https://hydra.cc/docs/advanced/override_grammar/basic/); quant.tensor_ranges is given 4 times, as a "
         "shell's "
         "brace expansion makes of one {...,...} value: quote the override whole, as calibrun prints its "
         "recommendations: 'quant.tensor_ranges={x:[0.0,1.0],y:[2.0,3.0]}'", early=True),
    Case("config-path-hydra-reads-only-quoted", "calibrun",
         lambda a, r: ["model=file", "model.path=/tmp/modèles/m.onnx"],
         "; quoted, it reads: model.path='/tmp/modèles/m.onnx' (on a shell, quote it all once more)", early=True),
    Case("config-input-key-hydra-cannot-spell", "calibrun", lambda a, r: ["data.inputs.sr:0.value=1"],
         "an input name's characters a key cannot hold are written as _: data.inputs.sr_0.value=1", early=True),
    Case("config-tracking-server-without-uri", "calibrun", lambda a, r: ["tracking=server"], "tracking.uri",
         early=True),
    Case("config-file-model-without-path", "calibrun", lambda a, r: ["model=file"], "model.path", early=True),
    # unwritable folders
    Case("calibrun-cache-dir-parent-is-a-file", "calibrun",
         lambda a, r: ["batches=2", f"cache.dir={a.plain / 'cache'}"], "cache"),
    Case("calibrun-run-dir-under-a-file", "calibrun",
         lambda a, r: ["batches=2", f"hydra.run.dir={a.plain / 'run'}"], "plain.txt", early=True),
    Case("calibrun-sweep-dir-under-a-file", "calibrun",
         lambda a, r: ["-m", "batches=2", f"hydra.sweep.dir={a.plain / 'sweep'}"], "plain.txt", early=True),
    # a corrupt cache file is not an error
    Case("calibrun-cache-corrupt-is-recomputed", "calibrun", lambda a, r: ["batches=2"], "unusable", ok=True,
         setup=_calibrun_then_corrupt),
    Case("calibrun-prepared-model-truncated-is-prepared-again", "calibrun",
         lambda a, r: ["batches=2", "model=file", f"model.path={a.conv}", "data=npy", f"data.path={r / 'x.npy'}",
                       "eval_data=npy", f"eval_data.path={r / 'x.npy'}", "eval.rows=4"],
         "unusable", ok=True, setup=lambda a, r: (_conv_rows(a, r), _calibrun_then_truncate_prepared(a, r))),
    # counts have upper bounds, named in the message; a float for an int fails at compose or at the bound
    Case("config-batches-1e30", "calibrun", lambda a, r: ["batches=1e30"], "batches=1e30", early=True),
    Case("config-batches-10**9", "calibrun", lambda a, r: ["batches=1000000000"], "100000", early=True),
    Case("config-seed-2**32", "calibrun", lambda a, r: ["calibration.seed=4294967296"], "calibration.seed",
         early=True),
    Case("config-image-crop-one-value", "calibrun",
         lambda a, r: ["data=images", f"data.path={a.images}", "data.crop=[48]"], "data.crop", early=True),
    # models that cannot be calibrated: refused before int8.onnx is written
    Case("calibrun-model-already-quantised", "calibrun", file_model("int8"), "already quantised"),
    Case("calibrun-model-without-outputs", "calibrun", file_model("no_outputs"), "no graph output"),
    Case("calibrun-model-symbolic-features-lab-data", "calibrun", file_model("symbolic"), "data=npy"),
    Case("data-images-crop-does-not-fit-the-model", "calibrun",
         lambda a, r: ["model=file", f"model.path={a.conv}", "data=images", f"data.path={a.images}",
                       "data.resize=8", "data.crop=[8,6]", "batches=1"], "data.crop=[8,8]"),
    # issue 25: config typos name the closest valid keys, and Hydra's "+key" advice leads nowhere worse
    Case("config-typo-names-the-closest-key", "calibrun", lambda a, r: ["batchs=3"],
         "config batchs: is not a calibrun setting; did you mean batches?", early=True),
    Case("config-typo-with-plus-names-the-closest-key", "calibrun", lambda a, r: ["+batchs=3"],
         "did you mean batches?", early=True),
    Case("config-typo-nested-key", "calibrun", lambda a, r: ["calibration.factr=2"],
         "did you mean calibration.factor", early=True),
    Case("config-typo-right-name-wrong-node", "calibrun", lambda a, r: ["factor=2"],
         "did you mean calibration.factor", early=True),
    Case("config-option-of-another-method", "calibrun", lambda a, r: ["method=entropy", "method.percentile=200"],
         "method.percentile: is not an option of method=entropy", early=True),
    # issue 25: every data source is checked before any work (no folder, no fp32.onnx, no run)
    Case("data-npy-missing-file-tracked", "calibrun", npy_data("missing_npy"), "missing.npy not found", early=True),
    Case("eval-data-npy-missing-file", "calibrun", npy_data("missing_npy", "eval_data"), "eval_data.path",
         early=True),
    Case("data-images-missing-folder", "calibrun",
         lambda a, r: ["model=file", f"model.path={a.conv}", "data=images", f"data.path={a.missing_dir}"],
         "missing_images not found", early=True),
    Case("sweep-data-path-one-missing", "calibrun",
         lambda a, r: ["-m", "data=npy", f"data.path={a.rows_npy},{a.missing_npy}", f"hydra.sweep.dir={r / 'run'}"],
         "missing.npy not found", early=True),
    Case("sweep-model-path-one-missing", "calibrun",
         lambda a, r: ["-m", "model=file", f"model.path={a.lab},{a.missing}", f"hydra.sweep.dir={r / 'run'}"],
         "missing.onnx not found", early=True),
    # issue 25: evaluation labels outside the model's classes, named with their file and value
    Case("eval-labels-99-for-8-classes", "calibrun", npy_data("labels_99", "eval_data"), "label 99 (row 40)"),
    Case("eval-labels-minus-1", "calibrun", npy_data("labels_minus_1", "eval_data"), "labels_minus_1.npz"),
]
assert len({c.id for c in CASES}) == len(CASES)


# --- running -----------------------------------------------------------------------------------------------------


def _env(root: Path, extra: dict) -> dict:
    return clean_env(**{"CALIBRUN_CACHE": root / "cache", "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
                        **extra})


def _run(args: list, cwd: Path, env: dict, timeout: float) -> tuple[int | None, str, str, bool]:
    """(returncode, stdout, stderr, timed_out); a process still running after `timeout` is killed."""
    proc = run_python(args, cwd, env, timeout)
    return proc.returncode, proc.stdout, proc.stderr, proc.timed_out


def _calibtool(args: list, cwd: Path, env: dict, timeout: float = TIMEOUT):
    return _run([CALIBTOOL, *args], cwd, env, timeout)


def _calibrun(overrides: list, cwd: Path, env: dict, timeout: float):
    return _run(["-m", "calibrun", *overrides], cwd, env, timeout)


@dataclass
class Outcome:
    case: Case
    root: Path
    code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    setup_error: str | None = None


def run_case(case: Case, assets: Assets, root: Path) -> Outcome:
    root.mkdir(parents=True)
    (root / "out").mkdir()
    if case.setup is not None:
        try:
            case.setup(assets, root)
        except Exception as exc:  # reported by this case's test, not by the shared fixture
            return Outcome(case, root, None, "", "", False, 0.0, f"setup failed: {exc!r}")
    env = _env(root, case.env(assets, root))
    args = [str(a) for a in case.args(assets, root)]
    start = time.monotonic()
    if case.tool == "calibtool":
        result = _calibtool(args, root, env, case.timeout)
    else:
        given = {a.split("=", 1)[0] for a in args}
        if "hydra.run.dir" not in given:
            args.append(f"hydra.run.dir={root / 'run'}")
        if "cache.dir" not in given:
            args.append(f"cache.dir={root / 'cache'}")
        if case.early:
            pass  # tracked by default, with no store yet: the case must fail before MLflow creates one
        elif not case.tracking:
            args.append("tracking=off")
        elif not any(a.startswith("tracking=") for a in args):
            fresh_mlflow_store(root)  # the env's store, migrated already (MLflow's schema costs a second per new store)
        result = _calibrun(args, root, env, case.timeout)
    return Outcome(case, root, *result, time.monotonic() - start)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every case, two at a time (each `python -m calibrun` spends seconds importing)."""
    assets = Assets(tmp_path_factory.mktemp("assets"))
    before = _snapshot(assets.root)
    base = tmp_path_factory.mktemp("cases")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {c.id: pool.submit(run_case, c, assets, base / c.id) for c in CASES}
        results = {case_id: future.result() for case_id, future in futures.items()}
    assert _snapshot(assets.root) == before  # no case changed or wrote beside its inputs
    return results


# --- checks ------------------------------------------------------------------------------------------------------


def temp_leftovers(root: Path) -> list[str]:
    """Temp files (calibrun.core.files.atomic_path: `.NAME.XXXX.tmp`) and prepare workspaces left in the tree."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.endswith(".tmp") or p.name.endswith(".prepare"))


def check_store(root: Path) -> None:
    db = root / "mlflow.db"
    if db.exists():
        from mlflow import MlflowClient

        MlflowClient(f"sqlite:///{db}").search_experiments()  # still a readable store


PARAMS = [
    pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else [])
    for c in CASES
]


@pytest.mark.parametrize("case", PARAMS)
def test_bad_input(case: Case, outcomes: dict[str, Outcome]):
    run = outcomes[case.id]
    assert run.setup_error is None, run.setup_error
    stderr = run.stderr
    assert not run.timed_out, f"still running after {case.timeout:.0f} s; stderr so far:\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert temp_leftovers(run.root) == []
    check_store(run.root)

    if case.ok:
        assert run.code == 0, stderr[-3000:]
        warnings = [line for line in lines if case.word in line]
        assert len(warnings) >= 1, stderr
        assert all("recomputing" in line or "preparing it again" in line for line in warnings), warnings
        if case.tool == "calibtool":
            assert json.loads(run.stdout)["out"].endswith("q.onnx")
            assert onnx.load(str(run.root / "out" / "q.onnx")).graph.node
        else:
            assert json.loads((run.root / "run" / "result.json").read_text())["status"] == "ok"
        for path in (run.root / "cache" / "ranges").glob("*.json"):  # the corrupt file was replaced by a whole one
            json.loads(path.read_text())
        return

    assert run.code not in (0, None), stderr[-3000:]
    assert lines, "no error message on stderr"
    last = lines[-1]
    prefix = "calibtool: error: " if case.tool == "calibtool" else "calibrun: error: "
    assert last.startswith(prefix), f"the last line is not the error:\n{stderr[-3000:]}"
    assert case.word in last, last
    if case.early:  # an error in the command line or the config (Hydra's too): its one line is all of stderr
        assert len(lines) == 1, stderr
    if case.tool == "calibtool":
        assert run.code == 1
        assert run.stdout == ""
        assert not list(run.root.rglob("q.onnx"))

    # nothing computed: no model written, no result claiming success (a run that fails on its input records
    # the failure as a complete `failed` result.json; one that fails on the config writes nothing)
    for model in run.root.rglob("int8.onnx"):
        assert case.quantized, f"{model} written by a run that failed before quantising"
        assert onnx.load(str(model)).graph.node  # whole, as every file calibrun writes
    for result in run.root.rglob("result.json"):
        assert not case.early, f"{result} written by a run that should have failed before any work"
        assert json.loads(result.read_text())["status"] == "failed"
    if case.early:
        assert run.code == 1
        assert not (run.root / "run").exists(), "a run (or sweep) folder made by a run that failed before any work"
        assert not list(run.root.rglob("fp32.onnx"))
        assert not (run.root / "cache").exists()
        assert not (run.root / "mlflow.db").exists()  # tracking is on by default: the store was not even created


def test_calibrun_start_removes_temp_folders_of_killed_runs(tmp_path):
    """A killed run leaves its private temp folder (calibrun.calib.HOST.PID.*) in the temp dir: the next run
    removes it (its process is gone) and keeps the folder of a live process."""
    from calibrun.core.files import _HOST

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    tmp = tmp_path / "tmp"
    orphans = [tmp / f"calibrun.{kind}.{_HOST}.{int(dead.stdout)}.x1y2z3" for kind in ("calib", "q", "diag", "src")]
    live = tmp / f"calibrun.calib.{_HOST}.{os.getpid()}.abc"
    for folder in [*orphans, live]:
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(b"half a model")
    code, _, stderr, _ = _calibrun(["batches=2", "eval.rows=4", f"hydra.run.dir={tmp_path / 'run'}",
                                    f"cache.dir={tmp_path / 'cache'}", "tracking=off"], tmp_path,
                                   _env(tmp_path, {"TMPDIR": str(tmp)}), TIMEOUT)
    assert code == 0, stderr
    assert sorted(p for p in tmp.iterdir() if p.name.startswith("calibrun.")) == [live]
