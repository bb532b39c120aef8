"""The order a sweep's jobs start in: jobs that share a calibration apart, the costliest calibrations first; and
the order the report lists them in: the one the user wrote.

Hydra's basic sweeper runs the product of the swept values with the last override varying fastest, so
`method=minmax,entropy format=qdq,qoperator` runs (minmax, qdq) and (minmax, qoperator) one after the other: side by
side on parallel workers, where the second waits for the first's calibration (calibrun.quant.calibrate.CalibrationCache.
claim) instead of working. `spread` reorders the jobs so that the keys that never enter the calibration's cache key
(`NOT_IN_KEY`) vary slowest: every distinct calibration is started first, the jobs that reuse one come after it, and
parallel workers calibrate different keys at the same time. Within each of those groups the jobs whose calibration
does more work start first (`calibration_cost`: longest-first list scheduling): the longest calibration no longer
starts last and holds the sweep's end, and the jobs that reuse it come after those that reuse cheaper ones, when
its ranges are ready. Otherwise the order is Hydra's. A key or cost guessed wrong costs only speed: the cache and
its lock decide what is calibrated. calibrun.core.patches.order_jobs applies it to Hydra's basic sweeper (job
numbers follow the new order); `written_order` gives the report its order back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

# top-level config keys that never decide the calibration ranges (calibrun.quant.calibrate.cache_record: the prepared
# model, the calibration data, the method's options)
NOT_IN_KEY = ("format", "quant", "eval", "eval_data", "diagnostics", "task", "analysis", "report", "tracking", "ort",
              "resume", "hydra")

# what a calibration does per value, by method: MinMax keeps two numbers per tensor; the histogram methods also bin
# every value; entropy then searches a threshold per tensor over its histogram (calibrun.quant.histogram)
METHOD_WORK = {"minmax": 0, "percentile": 1, "distribution": 1, "entropy": 2}


def outside_key(override: str) -> bool:
    """The override (`key=value`) sets something that never decides the calibration."""
    key = override.partition("=")[0].lstrip("+~")
    return key.split(".", 1)[0].split("@", 1)[0] in NOT_IN_KEY


def calibration_cost(job: list[str]) -> tuple[int, float]:
    """How much work a job's calibration does, as far as its overrides say: the method's (METHOD_WORK), then the
    number of batches; 0 for what they do not set, so a sweep that varies neither keeps Hydra's order."""
    values = {k.lstrip("+"): v for k, _, v in (o.partition("=") for o in job)}
    try:
        batches = float(values.get("batches", 0))
    except ValueError:
        batches = 0.0
    return METHOD_WORK.get(values.get("method", ""), 0), batches


def _outside_ranks(jobs: list[list[str]]) -> list[tuple[int, ...]]:
    """Per job, the rank of each of its outside-the-key values in the order they first appear."""
    first_seen: dict[str, dict[str, int]] = {}
    ranks = []
    for job in jobs:
        rank = []
        for override in job:
            if outside_key(override):
                key, _, value = override.partition("=")
                seen = first_seen.setdefault(key, {})
                rank.append(seen.setdefault(value, len(seen)))
        ranks.append(tuple(rank))
    return ranks


def spread(jobs: list[list[str]]) -> list[list[str]]:
    """`jobs` (each a list of `key=value` overrides, in Hydra's order) with the values of the keys outside the
    calibration's key varying slowest, in the order they first appear, and within each group the costliest
    calibration first; a stable sort otherwise."""
    ranks = _outside_ranks(jobs)
    costs = [calibration_cost(job) for job in jobs]
    order = sorted(range(len(jobs)), key=lambda i: (ranks[i], [-c for c in costs[i]]))
    return [jobs[i] for i in order]


def sweeper_lines(params: Mapping | None, task: Sequence) -> list[str]:
    """What Hydra's basic sweeper parses: its `hydra.sweeper.params` as `key=value` (a preset's sweep), then the
    command line's overrides (`hydra.overrides.task`), which replace a key they repeat."""
    return [f"{k}={v}" for k, v in (params or {}).items()] + [str(o) for o in task]


def written_order(params: list[str]) -> Callable[[Mapping[str, str]], tuple] | None:
    """For the report: a sort key over a job's overrides (`{key: value}`, `+` dropped) that lists the jobs of a
    basic sweep in `spread`'s order without the costs, i.e. as the user wrote them with the keys outside the
    calibration varying slowest (the report's order before the costs, kept). `params`: what Hydra's basic sweeper
    parses (`sweeper_lines`). None when they sweep
    nothing or cannot be parsed here (the report then keeps the job numbers' order)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(params)
        swept: dict[str, dict[str, int]] = {}  # the basic sweeper's rule: a later override of a key replaces it
        for override in parsed:
            key = override.get_key_element().lstrip("+")
            if override.is_sweep_override():
                swept[key] = {value: i for i, value in enumerate(override.sweep_string_iterator())}
            else:
                swept.pop(key, None)
    except Exception:  # e.g. a glob over a config group, which needs the sweep's config loader
        return None
    if not swept:
        return None
    outside = [key for key in swept if outside_key(key)]

    def key(overrides: Mapping[str, str]) -> tuple:
        place = {k: values.get(str(overrides.get(k)), len(values)) for k, values in swept.items()}
        return tuple(place[k] for k in outside), tuple(place.values())

    return key
