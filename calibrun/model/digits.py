"""The real-data example: scikit-learn's handwritten digits, a small MLP classifier, exported to ONNX.

`+experiment=digits` runs the narrow/match/wide lab on real 8x8 digit images (64 features, pixel values
scaled to 0..1) and reports top-1 accuracy of fp32 and int8 per calibration. Needs the `digits` extra
(scikit-learn). Everything is deterministic (fixed split and random_state), so the files are
content-addressed like any other input.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibrun.core.errors import CalibrunError
from calibrun.core.files import atomic_path

log = logging.getLogger("calibrun")

SEED = 0
HIDDEN = 32
TRAIN_ROWS = 1000
CALIB_ROWS = 400  # the rest (397) is the evaluation set
FILES = ("digits.onnx", "calib.npz", "eval.npz")


def _mlp_to_onnx(mlp) -> onnx.ModelProto:
    """An sklearn MLPClassifier (relu hidden layers) as MatMul/Add/Relu ... MatMul/Add/Softmax."""
    if mlp.activation != "relu":
        raise CalibrunError(f"only relu MLPs are exported, got {mlp.activation}")
    nodes, inits, prev = [], [], "input"
    for i, (w, b) in enumerate(zip(mlp.coefs_, mlp.intercepts_, strict=True)):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"], name=f"fc{i}_matmul"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"], name=f"fc{i}_add")]
        prev = f"z{i}"
        if i < len(mlp.coefs_) - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"h{i}"], name=f"relu{i}"))
            prev = f"h{i}"
    nodes.append(helper.make_node("Softmax", [prev], ["probabilities"], axis=-1, name="softmax"))
    classes = mlp.coefs_[-1].shape[1]
    graph = helper.make_graph(
        nodes, "calibrun_digits_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", mlp.coefs_[0].shape[0]])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="calibrun")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def ensure_digits(folder: str | Path) -> Path:
    """Train and export the digits classifier and its data into `folder` unless they are there already."""
    folder = Path(folder)
    if all((folder / name).is_file() for name in FILES):
        return folder
    try:
        from sklearn.datasets import load_digits
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier
    except ImportError:
        raise CalibrunError("the digits example needs scikit-learn: pip install -e '.[digits]'") from None
    folder.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    x, y = x[order], y[order]
    train, calib, evaluation = np.split(np.arange(len(x)), [TRAIN_ROWS, TRAIN_ROWS + CALIB_ROWS])
    mlp = MLPClassifier(hidden_layer_sizes=(HIDDEN,), max_iter=400, random_state=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # 400 epochs reach ~98% held-out accuracy
        mlp.fit(x[train], y[train])
    log.info("digits: trained MLP, held-out accuracy %.3f", mlp.score(x[evaluation], y[evaluation]))
    with atomic_path(folder / "calib.npz", suffix=".npz") as tmp, open(tmp, "wb") as handle:
        np.savez(handle, input=x[calib])
    with atomic_path(folder / "eval.npz", suffix=".npz") as tmp, open(tmp, "wb") as handle:
        np.savez(handle, input=x[evaluation], labels=y[evaluation])
    with atomic_path(folder / "digits.onnx", suffix=".onnx") as tmp:
        onnx.save_model(_mlp_to_onnx(mlp), str(tmp))
    return folder
