"""The order a sweep's jobs start in: jobs that share a calibration apart.

Hydra's basic sweeper runs the product of the swept values with the last override varying fastest, so
`method=minmax,entropy format=qdq,qoperator` runs (minmax, qdq) and (minmax, qoperator) one after the other: side by
side on parallel workers, where the second waits for the first's calibration (calibrun.quant.calibrate.CalibrationCache.
claim) instead of working. `spread` reorders the jobs so that the keys that never enter the calibration's cache key
(`NOT_IN_KEY`) vary slowest: every distinct calibration is started first, the jobs that reuse one come after it, and
parallel workers calibrate different keys at the same time. The order within each group is Hydra's. A key guessed
wrong costs only speed: the cache and its lock decide what is calibrated. calibrun.core.patches.order_jobs applies it to
Hydra's basic sweeper (job numbers follow the new order).
"""

from __future__ import annotations

# top-level config keys that never decide the calibration ranges (calibrun.quant.calibrate.cache_record: the prepared
# model, the calibration data, the method's options)
NOT_IN_KEY = ("format", "quant", "eval", "eval_data", "diagnostics", "task", "analysis", "report", "tracking", "ort",
              "resume", "hydra")


def outside_key(override: str) -> bool:
    """The override (`key=value`) sets something that never decides the calibration."""
    key = override.partition("=")[0].lstrip("+~")
    return key.split(".", 1)[0].split("@", 1)[0] in NOT_IN_KEY


def spread(jobs: list[list[str]]) -> list[list[str]]:
    """`jobs` (each a list of `key=value` overrides, in Hydra's order) with the values of the keys outside the
    calibration's key varying slowest, in the order they first appear; a stable sort otherwise."""
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
    order = sorted(range(len(jobs)), key=lambda i: ranks[i])
    return [jobs[i] for i in order]
