"""One job as functions of its config: `context` builds what every stage reads once (the prepared model, the
calibration and evaluation data, the task: a `JobContext`), and `compute` runs calibrate (cached) -> quantise ->
measure -> diagnostics on it, returning the result record. Writes `int8.onnx`, `ranges.json` and `diagnostics.json`
into the job folder; calibrun.runner wraps it in the Hydra task (validation, resume, tracking, error policy) and
writes `result.json`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from omegaconf import DictConfig, OmegaConf

from calibrun import config
from calibrun.core import cpu
from calibrun.core.errors import CalibrunError
from calibrun.core.files import DIAGNOSTICS_FILE, RANGES_FILE, atomic_path, strict_json, temp_dir, write_json
from calibrun.data import EvalData, calibration_data, evaluation_data, source_record
from calibrun.data.batches import STREAM_EVAL_ROWS
from calibrun.data.images import ImageTransform
from calibrun.data.inputs import declared, is_float, spelled
from calibrun.data.npy import RowsOnNewAxis
from calibrun.data.rows import pinned_rows
from calibrun.lab import EVAL_ROWS
from calibrun.lab.model import write_lab_model
from calibrun.measure import errors as measure
from calibrun.measure import feedback, task_pick, tasks, verdict
from calibrun.measure.diagnosis import accumulated_note, as_table, classify_model, clipping_outputs_note
from calibrun.measure.rows_apart import axes_note, rows_depend
from calibrun.measure.tensor_stats import StreamingDiagnostics
from calibrun.model import (
    FloatModel,
    check_model_file,
    file_sha256,
    float_subgraphs,
    float_weighted_ops,
    format_counts,
    model_sha256,
    open_float_model,
    row_axis,
    why_nothing_quantised,
)
from calibrun.model.digits import ensure_digits
from calibrun.model.graph import blocks_of
from calibrun.model.one_row import failing, fails_on_two_rows, pinned_copy
from calibrun.model.prepared import prepared_model
from calibrun.model.sessions import session
from calibrun.model.structure import structure
from calibrun.quant import cache as cache_store
from calibrun.quant.calibrate import Calibration, CalibrationCache
from calibrun.quant.quantize import QuantOptions, calibrated_ranges, quantize_with, resolve_exclusions
from calibrun.result import JobResult

log = logging.getLogger("calibrun")
ONE_ROW_STEP = "pinned each input's batch axis to one row (the model runs one row at a time)"  # in `preparation`

TASK_KEYS = ("top1_agreement", "fp32_accuracy", "int8_accuracy")
METRIC_KEYS = ("span", "input_scale", "input_zero_point", "observed_span", "max_abs_error", "mean_abs_error",
               "max_abs_output", "calibration_seconds", "quantization_seconds", "model_bytes", "cache_hit",
               "calibration_wait_seconds", "quantize_nodes", "dequantize_nodes")


def job_identity(cfg: DictConfig) -> dict:
    """Which job this is, as configured (safe to build from an invalid config)."""
    return {"calibration": cfg.calibration.name, "factor": cfg.calibration.factor, "seed": cfg.calibration.seed,
            "batches": cfg.batches, "format": cfg.format.name, "method": cfg.method.name, "model": cfg.model.name}


def job_params(cfg: DictConfig) -> dict:
    params = {
        **job_identity(cfg),
        "data": cfg.data.name,
        "eval_data": cfg.eval_data.name,
        "eval_seed": cfg.eval.seed,
        "eval_rows": cfg.eval.rows,
        "onnxruntime_version": onnxruntime.__version__,
        "onnx_version": onnx.__version__,
    }
    params.update({f"method.{k}": v for k, v in config.calibration_spec(cfg).calibrator_options().items()})
    params.update({f"quant.{k}": v for k, v in OmegaConf.to_container(cfg.quant).items()})
    for key in ("data", "eval_data"):
        if cfg[key].path:
            params[f"{key}.path"] = cfg[key].path
    return params


def eval_source(cfg: DictConfig) -> dict:
    """Everything that rebuilds the evaluation rows (kept in result.json for the aggregator). A stream (an input fed
    back from an output) at eval.rows' default evaluates up to STREAM_EVAL_ROWS of its rows (the file's, in order)."""
    source = OmegaConf.to_container(cfg.eval_data, resolve=True)
    rows = cfg.eval.rows
    if rows == EVAL_ROWS and any(isinstance(conf, dict) and conf.get("from_output")
                                 for conf in (source.get("inputs") or {}).values()):
        rows = STREAM_EVAL_ROWS
    return {**source_record(source), "seed": cfg.eval.seed, "rows": rows}


def prepare(cfg: DictConfig, job_dir: Path) -> tuple[FloatModel, list[str]]:
    """The prepared float model: the lab model or the user's file made quantisable (calibrun.model.prepare).

    A user's model is prepared once per source file into the cache's `models` folder (calibrun.model.prepared), so
    a sweep of many jobs shares one prepared copy; the lab model, and any model without a cache, into the job folder.
    """
    if cfg.model.name == "lab":
        return _lab_model(cfg, job_dir)
    if cfg.model.name == "digits":
        source = ensure_digits(cache_store.folder(cfg.cache.dir, "digits")) / "digits.onnx"
    else:
        source = check_model_file(Path(cfg.model.path).expanduser().resolve())
    return prepared_model(source, cfg.cache.dir if cfg.cache.enabled else None, cfg.cache.wait, job_dir)


_LAB_PREPARED: list[tuple[dict[str, bytes], str, list[str]]] = []  # the lab model as this process first prepared it


def _lab_model(cfg: DictConfig, job_dir: Path) -> tuple[FloatModel, list[str]]:
    """The prepared lab model in the job folder (fp32.onnx and its fp32.steps.json). It is the same model in every
    job (a fixed seed): the first lab job of a process builds it, proves it loads and prepares it; the next ones
    write the same files from its bytes (~15 ms less a job of a lab sweep)."""
    if not _LAB_PREPARED:
        with temp_dir("src") as tmp:
            fp32, steps = prepared_model(write_lab_model(Path(tmp) / "lab.onnx"), None, cfg.cache.wait, job_dir)
        files = {name: (job_dir / name).read_bytes() for name in (fp32.path.name, f"{fp32.path.stem}.steps.json")}
        _LAB_PREPARED.append((files, fp32.sha256, list(steps)))
        return replace(fp32, source=None), steps
    files, sha256, steps = _LAB_PREPARED[0]
    for name, data in files.items():
        with atomic_path(job_dir / name) as tmp:
            tmp.write_bytes(data)
    return open_float_model(job_dir / next(iter(files)), sha256=sha256), list(steps)


def _used(cfg: DictConfig, data, evaluation, errors: dict) -> dict:
    """What the job really used (result.json `used`), warning where it differs from what was asked."""
    identity = data.identity()
    batches = int(identity.get("batches", len(data)))
    rows_per_batch = int(identity.get("rows_per_batch", 0))
    used = {
        "calibration_batches": batches,
        "calibration_rows": int(identity.get("rows", batches * rows_per_batch)),
        "calibration_rows_per_batch": rows_per_batch,
        "eval_rows": int(errors["rows"]),
        "eval_batches": int(errors["eval_batches"]),
        "eval_batch_size": int(errors["eval_batch_size"]),
        "calibration_source": {k: v for k, v in identity.items() if k != "files"},
        "calibration_files": len(identity.get("files", [])),
        "eval_source": {k: v for k, v in evaluation.identity.items() if k != "files"},
        "eval_files": len(evaluation.identity.get("files", [])),
        "cpu": cpu.int8_dot(),  # the int8 kernels' instructions: another CPU can measure the same model otherwise
    }
    # (fewer batches or rows than requested: the data source said so, naming its files, when it planned them)
    return used


def _memory_used(budget: int | None, calibration: dict, evaluation: dict, diag) -> dict:
    """result.json `used.memory`: memory.budget as set (`auto` or bytes) and the bytes it came to, and how each
    stage kept to it: calibration rows per run (null on a cache hit) and, for the histogram methods, groups of
    tensors (1: every tensor of a run at once),
    evaluation rows per run, diagnostics groups of tensors (1: one pass) and rows per run (docs/memory.md)."""
    resolved = evaluation.get("budget_bytes") or calibration.get("budget_bytes")
    if diag is not None and diag.budget is not None:
        resolved = diag.budget
    return {
        "budget": "auto" if budget is None else budget,
        "budget_bytes": resolved,
        "calibration_rows_per_run": calibration.get("calibration_rows_per_run"),
        "calibration_groups": calibration.get("calibration_groups"),
        "eval_rows_per_run": evaluation.get("eval_rows_per_run"),
        "diagnostics_groups": len(diag.groups) if diag is not None and diag.groups is not None else None,
        "diagnostics_rows_per_run": diag.rows_per_run if diag is not None else None,
    }


def _source_model(cfg: DictConfig) -> dict:
    """The user's model file as given (path and sha256), beside the prepared copy the job measured."""
    if cfg.model.name != "file" or not cfg.model.path:
        return {}
    path = Path(cfg.model.path).expanduser().resolve()
    return {"source_model_path": str(path), "source_model_sha256": model_sha256(path)}


@dataclass
class JobContext:
    """What a job builds once, before any work, and every later stage reads (compute, the analysis, tracking):
    nothing downstream opens the model, builds the data or resolves the task again."""

    cfg: DictConfig
    job_dir: Path
    fp32: FloatModel  # the prepared float model, opened once
    steps: list[str]  # what preparing it did
    options: QuantOptions  # post-calibration options, exclusions resolved against the model
    exclusions: dict | None  # result.json's `exclusions` (the names resolved), None without exclusions
    data: object  # the calibration batches (calibrun.data.FeedBatches or the lab's): sized, lazy, re-iterable
    eval_source: dict  # everything that rebuilds the evaluation rows (result.json `eval_source`)
    evaluation: EvalData  # the evaluation rows, served batch by batch (re-iterable)
    task: tasks.Task  # the task metric, fresh: each measurement feeds a copy
    keep_reference: bool = False  # keep the evaluation's fp32 outputs for the recommendations (`reference`)
    reference: object | None = None  # a calibrun.analysis.evaluate.Evaluator the evaluation filled, or None

    def fresh_task(self) -> tasks.Task:
        return copy.deepcopy(self.task)

    def close_reference(self) -> None:
        """Remove the kept fp32 outputs (their temp folder); a no-op when none are kept."""
        if self.reference is not None:
            self.reference.close()
            self.reference = None

    def calibration_of(self, result: JobResult) -> Calibration:
        """The job's own calibration (its ranges file, in the job folder): what a change of post-calibration options
        is quantised from again, without calibrating."""
        spec = config.calibration_spec(self.cfg)
        return Calibration(self.job_dir / result.files["ranges"], spec.method, result.cache_key, True, 0.0,
                           result.metrics.get("span", 0.0), int(result.params.get("batches", 0)),
                           spec.op_types or None)


def context(cfg: DictConfig, job_dir: Path, one_row: JobContext | None = None) -> JobContext:
    """The job's context: the prepared model, its data sources and its task, each checked (a bad exclusion name,
    evaluation file or task output fails here, before any calibration). `one_row`: the context of a first try
    whose model runs only one row at a time (`one_row_context`): the model with its batch axes pinned to 1, each
    input's batch axis as that context inferred it, and as many calibration rows as its batches held."""
    fp32, steps = prepare(cfg, job_dir)
    data_source, source, batches = cfg.data, eval_source(cfg), cfg.batches
    if one_row is not None:  # a copy per prepared model and axes in the cache's models folder, else in the job's
        axes = one_row.evaluation.axes
        tag = hashlib.sha256(json.dumps([fp32.sha256, sorted(axes.items(), key=str)]).encode()).hexdigest()[:32]
        shared = cache_store.folder(cfg.cache.dir, "models", create=True) if cfg.cache.enabled else None
        fp32 = pinned_copy(fp32, axes, shared or job_dir, f"{tag}-one-row.onnx" if shared else "fp32_one_row.onnx")
        steps = [*steps, ONE_ROW_STEP]
        data_source = _with_axes(OmegaConf.to_container(cfg.data, resolve=True), one_row.data.axes)
        source = _with_axes(source, axes)
        batches = one_row.data.rows  # the rows the first try's batches held, a batch each
    def sources(model: FloatModel):
        return (calibration_data(data_source, model, cfg.calibration.seed, cfg.calibration.factor, batches),
                evaluation_data(source, model, source["seed"], source["rows"]))

    try:
        data, evaluation = sources(fp32)
    except RowsOnNewAxis:  # rows stacked on a first axis the model does not declare: a copy with one, if it has none
        if cfg.model.name != "file" or row_axis.STEP in steps or not row_axis.declares_no_batch_axis(fp32.inputs):
            raise
        fp32, steps = _with_row_axis(cfg, fp32, job_dir), [*steps, row_axis.STEP]
        data, evaluation = sources(fp32)
    # names checked before any work, on the model the job runs (a row axis' copy: the names its recommendations give)
    options, record = resolve_exclusions(fp32.path, config.quant_options(cfg))
    kept = _whole_batches(fp32, evaluation)
    if kept != evaluation.rows:
        source = {**source, "rows": kept}  # recorded so: the aggregator rebuilds the same rows
        evaluation = evaluation_data(source, fp32, source["seed"], kept)
    if one_row is None and source.get("name") != "lab":
        _hint_state(fp32, evaluation)
    if one_row is None:
        _say_synthetic(cfg)
        _say_other_pixels(cfg)
        if cfg.calibration.factor != 1.0 and not any(is_float(info) for info in fp32.inputs):
            log.warning("calibration.factor=%g changes nothing here: it multiplies float inputs, and the model has "
                        "none (its inputs: %s); its calibration rows are fed as they are", cfg.calibration.factor,
                        ", ".join(declared(info) for info in fp32.inputs))
    try:
        task = task_pick.resolve(tasks.spec_of(cfg.task), fp32.path, labels=evaluation.labels,
                             classifier=cfg.model.classifier)
    except tasks.LabelsDoNotFit as exc:  # name the labels' file, row and value
        evaluation.check_labels(exc.classes, exc.output)
        raise
    if isinstance(task, tasks.Image) and task.source is not None:
        task.span = _range_of(evaluation, task.source)
    if isinstance(task, tasks.Classification) and evaluation.labels is not None:
        task.evaluation = evaluation
        if task.static_classes:  # before any work when the graph states the classes
            evaluation.check_labels(task.static_classes, task.output)
    return JobContext(cfg, job_dir, fp32, steps, options, record.get("exclusions"), data, source, evaluation, task)


def synthetic_sources(cfg: DictConfig) -> list[str]:
    """The data sources (`data`, `eval_data`) a model other than the lab's is fed by the lab rule: normal noise in
    the shape of its input (docs/lab.md), the default when no data is given, not the model's distribution."""
    if cfg.model.name == "lab":
        return []
    return [key for key in ("data", "eval_data") if cfg[key].name == "lab"]


def _say_synthetic(cfg: DictConfig) -> None:
    """One warning where a user's model is calibrated or evaluated on the lab rule's synthetic rows."""
    keys = synthetic_sources(cfg)
    if keys:
        what = {"data": "calibrated", "eval_data": "evaluated"}
        log.warning("no %s given: the model is %s on the lab rule's synthetic rows (normal noise in its input's "
                    "shape, docs/lab.md), not on data of its own; the scales and the verdict say nothing of its real "
                    "distribution (%s)", " or ".join(keys), " and ".join(what[k] for k in keys),
                    " ".join(f"{k}=npy|images {k}.path=..." for k in keys))


def _say_other_pixels(cfg: DictConfig) -> None:
    """One warning where calibration and evaluation images are made by different transforms (only eval_data's
    set, say): the ranges are then calibrated on other pixels than the int8 model is measured on."""
    if cfg.data.name != "images" or cfg.eval_data.name != "images":
        return
    calib, judged = (asdict(ImageTransform.from_config(cfg[key])) for key in ("data", "eval_data"))
    def shown(value):
        return list(value) if isinstance(value, tuple) else value  # as the override spells it

    differ = [f"{k} {shown(calib[k])} / {shown(judged[k])}" for k in calib if calib[k] != judged[k]]
    if differ:
        log.warning("data and eval_data make their images differently (%s): the ranges are calibrated on other "
                    "pixels than the int8 model is measured on; set the same keys under both", "; ".join(differ))


def _range_of(evaluation: EvalData, name: str) -> float | None:
    """The range of input `name`'s values over the evaluation rows (None: it has none, or it is not fed rows): the
    scale an image task's PSNR is over (calibrun.measure.tasks.Image)."""
    low, high = math.inf, -math.inf
    for feeds, _ in evaluation.batches(256):
        values = feeds.get(name)
        if values is not None and np.size(values):
            low, high = min(low, float(np.min(values))), max(high, float(np.max(values)))
    return high - low if high > low else None


def _whole_batches(fp32: FloatModel, evaluation: EvalData) -> int:
    """The evaluation rows a model that pins its batch axis at k rows can run: the rows of whole batches of k, the
    rest left out in one warning line (eval.rows is 256 by default, whatever k is); fewer than k rows: an error."""
    fixed = pinned_rows({info.name: info.shape for info in fp32.inputs}, evaluation.axes)
    if fixed is None or evaluation.rows % fixed == 0:
        return evaluation.rows
    kept = evaluation.rows - evaluation.rows % fixed
    if not kept:
        raise CalibrunError(f"the model pins its batch axis at {fixed} rows and the evaluation has {evaluation.rows}: "
                            f"give at least {fixed} rows (eval.rows, or more in eval_data's file)")
    log.warning("the model pins its batch axis at %d rows: measuring %d of the %d evaluation rows (the last %d do "
                "not fill a batch)", fixed, kept, evaluation.rows, evaluation.rows - kept)
    return kept


def _hint_state(fp32: FloatModel, evaluation: EvalData) -> None:
    """One line for each input that looks like a recurrent state (calibrun.measure.feedback.look_alike) and is not
    fed back: what the evaluation then measures, and the override that streams it."""
    for name, output in feedback.look_alike(fp32.inputs, structure(fp32.path).graph.output):
        if name not in evaluation.state:
            log.info("input %r has the type and shape of output %r, as a recurrent state does: each evaluation row is "
                     "fed the %r its data holds (one call at a time); if the model takes %r back on its next call, "
                     "eval_data.inputs.%s.from_output=%s evaluates the rows in order, each model streaming its own "
                     "(docs/data.md)", name, output, name, output, spelled(name), output)


def _with_row_axis(cfg: DictConfig, fp32: FloatModel, job_dir: Path) -> FloatModel:
    """The prepared model with a leading axis of 1 on every input and output (calibrun.model.row_axis), made once per
    prepared model into the cache's models folder (else the job folder), said in one line."""
    shared = cache_store.folder(cfg.cache.dir, "models", create=True) if cfg.cache.enabled else None
    name = f"{fp32.sha256[:32]}-row-axis{row_axis.FORM}.onnx" if shared else "fp32_row_axis.onnx"
    copy = replace(row_axis.added_copy(fp32, shared or job_dir, name), source=fp32.source)
    log.info("the model declares no batch axis (every input's axes fixed: %s) and its data stacks rows on a first "
             "axis: running it with a leading axis of 1 on every input and output, one row a run; the int8 model "
             "as the model declares its inputs and outputs is %s", ", ".join(declared(i) for i in fp32.inputs[:3]) +
             (", ..." if len(fp32.inputs) > 3 else ""), row_axis.DECLARED_FILE)
    return copy


def _with_axes(source: dict, axes: dict) -> dict:
    """A data source's config with each batched input's batch axis set explicitly (`axes`; None: a constant)."""
    inputs = {name: dict(conf or {}) for name, conf in (source.get("inputs") or {}).items()}
    for name, axis in axes.items():
        if axis is not None:
            inputs.setdefault(name, {})["batch_axis"] = axis
    return {**source, "inputs": inputs}


def one_row_context(ctx: JobContext) -> JobContext | None:
    """After a failed first try: the job's context again with the model pinned to one row per run, when the model
    is one exported for one row at a time (calibrun.model.one_row: two evaluation rows fail, the first alone runs);
    None otherwise (the first failure stands)."""
    if ctx.cfg.model.name != "file" or "lab" in (ctx.cfg.data.name, ctx.cfg.eval_data.name) or \
            ONE_ROW_STEP in ctx.steps:
        return None  # (the lab rule feeds one float input with rows on axis 0: no axes to keep)
    try:
        if pinned_rows({i.name: i.shape for i in ctx.fp32.inputs}, ctx.evaluation.axes) is not None:
            return None  # the model pins its batch already
        feeds, _ = next(iter(ctx.evaluation.batches(2)))
        error = fails_on_two_rows(ctx.fp32.path, feeds, ctx.evaluation.axes, ctx.cfg.ort.intra_op_threads)
        rows = ctx.data.rows
    except Exception:  # noqa: BLE001 (the data or the model fail here too: the first failure stands)
        return None
    if error is None:
        return None
    log.warning("the model fails on two rows at once and runs one (on two rows, %s fails): it was exported for one "
                "row at a time; running it one row per run, as its input axes pinned to 1 would (%d calibration rows: "
                "the %d batches' rows)", failing(error), rows, len(ctx.data))
    level = log.level
    log.setLevel(logging.ERROR)  # the data's and the task's lines were said by the first try
    try:
        return context(ctx.cfg, ctx.job_dir, one_row=ctx)
    finally:
        log.setLevel(level)


def compute(ctx: JobContext) -> JobResult:
    """The measurement itself: the job's result (status ok)."""
    cfg, job_dir, fp32, data, evaluation = ctx.cfg, ctx.job_dir, ctx.fp32, ctx.data, ctx.evaluation
    cache = CalibrationCache(cfg.cache.dir, cfg.cache.wait) if cfg.cache.enabled else None
    int8_path = job_dir / "int8.onnx"
    budget = config.memory_budget(cfg)
    calibration_memory: dict = {}
    eval_memory: dict = {}
    quant = quantize_with(fp32, int8_path, data, spec=config.calibration_spec(cfg),
                          options=ctx.options, cache=cache, ranges_copy=job_dir / RANGES_FILE,
                          threads=cfg.ort.intra_op_threads,
                          input_may_stay_float=bool(ctx.exclusions) or cfg.model.name != "lab",
                          budget=budget, used=calibration_memory,
                          calibrated_said=lambda ranges: say_flat_inputs(ranges, fp32.inputs, data))
    if row_axis.STEP in ctx.steps:  # the model a user deploys: the original's interface
        with atomic_path(job_dir / row_axis.DECLARED_FILE, suffix=".onnx") as tmp:
            row_axis.declared_copy(int8_path, tmp)
            session(tmp, optimize=False)  # onnxruntime loads it (its checks are the deploying user's), or no file
    diag = None
    ops = quant["ops"]
    quantised = any(ops.get(op) for op in ("QuantizeLinear", "DequantizeLinear")) or \
        any(op.startswith("QLinear") for op in ops)
    if not quantised:
        why = why_nothing_quantised(fp32.path)
        log.warning("onnxruntime quantised nothing in this model (%s): the int8 model computes in float", why)
    left = float_weighted_ops(fp32.path)
    if left and quantised:
        fused = any(op.startswith("com.microsoft.") for op in left)
        log.info("quantize_static has no static int8 form of %s: their weights and work stay in float%s",
                 format_counts(left), "; onnxruntime's graph optimisation writes com.microsoft operators (Conv, Gemm "
                 "or MatMul fused with what follows): the model as it was before it quantises them" if fused else "")
    inside = float_subgraphs(int8_path) if quantised else {}
    if inside:
        log.info("onnxruntime quantised nothing inside the subgraphs of %s: their matrix ops compute in float",
                 format_counts(inside))
    pinned = pinned_rows({i.name: i.shape for i in fp32.inputs}, evaluation.axes)
    size = measure.batch_size_for(pinned, cfg.eval.batch_size)
    blocks_of(fp32.path)  # the model's structure read (and cached) before a session holds its weights
    fp32_session = session(fp32.path, cfg.ort.intra_op_threads)  # the rows probe's and the evaluation's
    depend = rows_depend(fp32.path, evaluation, cfg.ort.intra_op_threads, fp32_session, size, budget) \
        if pinned is None else None
    if depend is not None:
        log.warning("the model's output for a row depends on the rows fed beside it: %s; calibration and evaluation "
                    "feed %d rows at a time, so this job measures it on batches of %d rows: set eval.batch_size to the "
                    "rows it is run on at a time (a whole sequence of frames; 1 where it normalises over its batch)%s",
                    depend, size, size, axes_note(evaluation.axes))
    ctx.close_reference()
    if ctx.keep_reference:
        from calibrun.analysis.evaluate import Evaluator

        ctx.reference = Evaluator.kept(fp32.path, cfg.ort.intra_op_threads, ctx.fresh_task(), evaluation.state)
    errors = measure.evaluate(fp32.path, int8_path, evaluation, ctx.fresh_task(), cfg.ort.intra_op_threads,
                              cfg.eval.batch_size, budget=budget, used=eval_memory, keep=ctx.reference,
                              fp32_session=fp32_session)
    del fp32_session  # before the diagnostics' sessions: never alive together
    rows = None
    if cfg.format.name == "qdq" and cfg.diagnostics.enabled and ops.get("QuantizeLinear"):  # an activation pair
        # a pass of its own after the evaluation's: its two sessions and the evaluation's are never alive together
        # (ResNet-50: four sessions' weights at once made the job 3.4x plain inference's peak)
        with StreamingDiagnostics(fp32.path, int8_path, job_dir / RANGES_FILE, cfg.ort.intra_op_threads,
                                  max_rows=cfg.diagnostics.rows, budget=budget, axes=evaluation.axes) as diag:
            rows = diag.over(evaluation, cfg.eval.batch_size)
        if diag.rows_seen < evaluation.rows:  # said as the evaluation's own cap is: what the culprits were read from
            log.info("diagnostics read the first %d of the %d evaluation rows (diagnostics.rows=%s); "
                     "diagnostics.rows=null reads them all", diag.rows_seen, evaluation.rows, cfg.diagnostics.rows)
    metrics = {**quant, **errors, **tasks.legacy(errors), "model_bytes": quant["bytes"],
               "cache_hit": int(quant["cache_hit"])}
    extra = [k for k in errors if k.startswith(("out.", "task.")) or k in ("eval_min", "eval_max", "eval_span")]
    result = JobResult(
        "ok",
        params={**job_params(cfg), "model_file": str(fp32.path), "model_sha256": fp32.sha256,
                "rows_per_batch": data.identity()["rows_per_batch"], **_source_model(cfg)},
        metrics={key: metrics[key] for key in (*METRIC_KEYS, *TASK_KEYS, *extra) if key in metrics},
        ops=quant["ops"],
        cache_key=quant["cache_key"],
        preparation=ctx.steps,
        exclusions=ctx.exclusions,
        eval_source=ctx.eval_source,
        used={**_used(cfg, data, evaluation, errors), "diagnostics_rows": diag.rows_seen if diag is not None else 0,
              "memory": _memory_used(budget, calibration_memory, eval_memory, diag), "rows_depend": depend,
              "float_weighted_ops": left, "float_subgraphs": inside},
        task=ctx.task.describe(),
        files={"fp32": _relative(fp32.path, job_dir), "int8": int8_path.name, "ranges": RANGES_FILE,
               "int8_sha256": file_sha256(int8_path), "ranges_sha256": file_sha256(job_dir / RANGES_FILE),
               **({"int8_declared": row_axis.DECLARED_FILE} if row_axis.STEP in ctx.steps else {})},
    )
    names = {measure.metric_key(o.name): o.name for o in structure(fp32.path).graph.output}
    try:
        result.verdict = verdict.decide(result.metrics, cfg.verdict, rows=int(errors["rows"]), names=names,
                                        streamed=feedback.streamed(evaluation.state))
    except ValueError as exc:  # verdict.metric names no metric of this run
        raise CalibrunError(f"config {exc}") from None
    if verdict.worst_decided(result.verdict, cfg.verdict):  # what a sweep of such runs ranks them by
        result.metrics[verdict.WORST_OUTPUT] = result.metrics[result.verdict["metric"]]
    task_output = (result.task or {}).get("output")
    unread = verdict.unread_output(result.metrics, measure.metric_key(task_output)) \
        if result.verdict is not None and result.verdict["metric"].startswith("task.") and task_output else None
    if unread is not None:  # not the verdict's: the task decides; but said, as DTLN's state at 0 dB beside its mask
        states = {output: name for name, output in feedback.look_alike(fp32.inputs, structure(fp32.path).graph.output)}
        result.verdict["because"] += verdict.unread_note(*unread, names, evaluation.state, states)
    if result.verdict is not None and not quantised:
        result.verdict["because"] += "; onnxruntime quantised nothing: the model computes in float"
    if result.verdict is not None and "eval_data" in synthetic_sources(cfg):
        result.verdict["because"] += ("; measured on the lab rule's synthetic rows (normal noise), not on the model's "
                                      "data: eval_data=npy|images gives them")
    channels = {k: v for k, v in result.metrics.items() if re.fullmatch(r"task\.dice\.ch\d+", k)}
    if result.verdict is not None and result.verdict["metric"] == "task.dice" and channels:
        worst = min(channels, key=channels.get)
        result.verdict["because"] += f"; the worst of the map's {len(channels)} channels ({worst})"
    if result.verdict is not None and depend is not None:
        result.verdict["because"] += f"; measured on batches of {size} rows: the model's rows depend on each other"
    if rows is not None:
        write_json(job_dir / DIAGNOSTICS_FILE, as_table(rows))  # column-oriented, strict JSON
        result.files["diagnostics"] = DIAGNOSTICS_FILE
        outputs = {k[len("out."):-len(".sqnr_db")]: v for k, v in errors.items() if k.startswith("out.")
                   and k.endswith(".sqnr_db") and not re.search(r"\.(ch|concat)\d+\.sqnr_db$", k)}
        result.diagnosis = strict_json(classify_model(rows, diag.weights, output_sqnr_db=outputs))
        culprits = result.diagnosis["culprits"]
        if culprits:
            top = culprits[0]
            where = f"node {top['node']}" if top["node"] else "a graph input"
            log.info("diagnosis: %s; top culprit %s (%s, %s, %.0f%% of the added error)%s%s",
                     result.diagnosis["overall"], top["tensor"], where, top["verdict"], 100 * (top["noise_share"] or 0),
                     clipping_outputs_note(result.diagnosis), accumulated_note(result.diagnosis))
    return result


def say_flat_inputs(ranges_path: Path, inputs, data) -> list[str]:
    """A warning for each input whose calibration rows are one row repeated (silence, a blank image, a file of
    padding): every range after it was calibrated on no variation of it (an unseen voice detector calibrated on
    silent windows: its input's scale 1.0, onnxruntime's fallback for an empty range, and nothing said the rows were
    silent; an unseen classifier calibrated on black frames, one value a channel after its normalisation). A float
    input with an empty calibrated range is said with its value; another calibrated input's rows are compared with
    its first (read up to the first that differs: its first batch, as a rule); inputs calibrun does not quantise
    (token ids) are said only where no input varied at all: all-padding ids are a text model's silence (an unseen
    character BERT), while one sample rate beside varying audio, a token-type input of zeros or LAC's unread length
    beside varying ids is no cause (the zoo's first run of this check named those three). Constants
    (`data.inputs.<name>.value`) and a state fed back from an output are not the data's rows: not checked."""
    skip = {*(getattr(data, "constants", None) or {}), *(getattr(data, "state", None) or {})}
    ranges = calibrated_ranges(ranges_path)
    columns = getattr(data, "columns", None) or {}
    fed = [i.name for i in inputs if i.name not in skip]
    calibrated = [n for n in fed if n in ranges]
    said: dict[str, np.ndarray] = {n: np.asarray(ranges[n][0]) for n in calibrated if ranges[n][0] == ranges[n][1]}
    said.update({n: row for n in calibrated if n not in said and n in columns
                 and (row := _repeated_row(data, n)) is not None})
    others = [n for n in fed if n not in ranges and n in columns]
    if others and len(said) == len(calibrated):  # nothing calibrated varied: did the inputs calibrun does not quantise?
        repeated = {n: row for n in others if (row := _repeated_row(data, n)) is not None}
        if len(repeated) == len(others):  # one that varies makes the others parameters (LAC's length beside its ids)
            said.update(repeated)
    for name, row in said.items():
        value = float(row.flat[0]) if row.size and np.all(row == row.flat[0]) else None
        quantised = "" if name not in ranges else "its scale (onnxruntime's 1.0 for an empty range) and " \
            if value == 0 else "its scale and "
        if value is not None:
            log.warning("calibration data: input '%s' is %g in every calibration row: no variation of it was "
                        "calibrated (silence? a blank image? padding?), so %sthe ranges after it come from that one "
                        "value; calibrate on rows that vary as the evaluation's do", name, value, quantised)
        else:
            log.warning("calibration data: every calibration row of input '%s' is the same row: no variation of it "
                        "was calibrated (a blank image? one frame repeated?), so %sthe ranges after it come from that "
                        "one row; calibrate on rows that vary as the evaluation's do", name, quantised)
    return list(said)


def _repeated_row(data, name: str) -> np.ndarray | None:
    """The one row every calibration row of input `name` is (at least two rows), else None: the input's own column
    read batch by batch, rows along its batch axis, up to the first row that differs from the first."""
    axis = (getattr(data, "axes", None) or {}).get(name) or 0
    first, rows = None, 0
    for batch in data.arrays(name):
        values = np.moveaxis(np.asarray(batch), axis, 0)
        if not len(values):
            continue
        first = values[0] if first is None else first
        if values.shape[1:] != first.shape or np.any(values != first):
            return None
        rows += len(values)
    return first if rows > 1 else None


def _relative(path: Path, folder: Path) -> str:
    """`path` relative to the job folder when inside it, else absolute (a relative cache path starts from the
    working directory, which the aggregator may not share)."""
    path = path.resolve()
    try:
        return str(path.relative_to(folder.resolve()))
    except ValueError:
        return str(path)
