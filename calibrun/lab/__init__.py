"""The lab's constants, once (docs/lab.md), and the test that picks the lab's runs out of any sweep.

A run belongs to the lab when it ran with the lab's FIXED settings: the lab model on lab data, calibration
seed 4242 with the factor of its calibration name, evaluation seed 777 on 256 rows, minmax with onnxruntime's
default options, default quantisation options. Batches and format are the lab's axes. A sweep that also varies
something else (method, quant.per_channel, eval.rows...) still has its lab runs found, and only those.
"""

from __future__ import annotations

from collections.abc import Mapping

CALIB_SEED = 4242
EVAL_SEED = 777
EVAL_ROWS = 256
ROWS_PER_BATCH = 16  # one calibration batch (a model that pins its first axis to b gets b)
FACTORS = {"narrow": 0.2, "match": 1.0, "wide": 10.0}
CALIBRATIONS = tuple(FACTORS)  # narrow, match, wide
MAIN_BATCHES = 64
SAMPLE_BATCHES = (1, 8, 64, 512)
SMALL_BATCHES = 8  # match with this many batches against narrow with the most
FORMATS = ("qdq", "qoperator")
METHOD = "minmax"

# The lab model's sizes (calibrun.lab.model builds it)
LAB_FEATURES = 16
LAB_HIDDEN = 32
LAB_OUTPUTS = 8
LAB_WEIGHT_SEED = 0
LAB_OPSET = 17
LAB_INPUT = "x"

# config key -> the lab's value (None: unset); keys absent from a job's config count as the default
FIXED = {
    "model.name": "lab",
    "data.name": "lab",
    "eval_data.name": "lab",
    "calibration.seed": CALIB_SEED,
    "eval.seed": EVAL_SEED,
    "eval.rows": EVAL_ROWS,
    "method.name": METHOD,
    "method.symmetric": None,
    "method.moving_average": False,
    "method.per_channel": False,
    "quant.activation_type": "QInt8",
    "quant.weight_type": "QInt8",
    "quant.per_channel": False,
    "quant.reduce_range": False,
    "quant.activation_symmetric": False,
    "quant.weight_symmetric": None,
    "quant.nodes_to_exclude": [],
    "quant.op_types_to_quantize": None,
}
EQUIVALENT = {"method.symmetric": (None, False),  # onnxruntime's minmax default is asymmetric
              "quant.weight_symmetric": (None, True)}  # its default for the lab's QInt8 weights is symmetric


def _get(cfg: Mapping, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _same(key: str, value, wanted) -> bool:
    if key in EQUIVALENT:
        return value in EQUIVALENT[key]
    if isinstance(wanted, list):
        return list(value or []) == wanted
    if isinstance(wanted, bool) or wanted is None or isinstance(wanted, str):
        return value == wanted and type(value) is type(wanted)
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def difference(cfg: Mapping) -> str | None:
    """None when the job config `cfg` (a plain nested dict) is one of the lab's runs, else the first setting that
    differs, as `key=value`."""
    name = _get(cfg, "calibration.name")
    if name not in FACTORS:
        return f"calibration.name={name}"
    factor = _get(cfg, "calibration.factor")
    if not _same("calibration.factor", factor, FACTORS[name]):
        return f"calibration.factor={factor}"
    for key, wanted in FIXED.items():
        value = _get(cfg, key, wanted)
        if not _same(key, value, wanted):
            return f"{key}={value}"
    return None


def label(calibration: str, batches: int, fmt: str) -> str:
    """How the report names a lab run (the lab sweep's own overrides)."""
    return f"calibration={calibration} batches={batches} format={fmt}"
