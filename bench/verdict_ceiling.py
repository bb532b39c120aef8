"""How far any thresholds on calibrun's verdict metrics could agree with the zoo's independent checks (issue 23's
goal: 90%). Not a test and not a tuning tool: it reads the rows `bench/zoo.py --json` wrote and, metric family by
metric family (every output SQNR is one family; each task metric its own), finds the two thresholds (broken below
one, ok from the other) that agree with the most check labels *on these very models*. Fitted to the zoo, that is an
upper bound for any threshold rule on these metrics; a check that says ok at a lower value than another check says
broken (an inversion) is a pair no threshold serves.

    python bench/zoo.py --json zoo.json
    python bench/verdict_ceiling.py zoo.json [more.json ...]   # a later file's row for a model replaces an earlier's
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

RANK = {"broken": 0, "degraded": 1, "ok": 2}


def family(metric: str) -> str:
    """The threshold family of a verdict metric: every output's SQNR (the worst-output rule) is one."""
    return "output SQNR (dB)" if metric.startswith("out.") and metric.endswith(".sqnr_db") else metric


def label(value: float, broken_below: float, ok_from: float) -> str:
    return "ok" if value >= ok_from else "broken" if value < broken_below else "degraded"


def best_thresholds(rows: list[tuple[float, str]]) -> tuple[int, float, float]:
    """(most labels agreed, broken below, ok from) over every pair of cuts between the rows' values (higher is
    better, as every verdict metric here)."""
    values = sorted({v for v, _ in rows})
    cuts = [-math.inf, *((a + b) / 2 for a, b in itertools.pairwise(values)), math.inf]
    best = (-1, -math.inf, math.inf)
    for low, high in itertools.combinations_with_replacement(cuts, 2):
        agree = sum(label(v, low, high) == check for v, check in rows)
        if agree > best[0]:
            best = (agree, low, high)
    return best


def inversions(rows: list[tuple[str, float, str]]) -> list[tuple[str, str]]:
    """Pairs (a, b) where a's check is better than b's at a value below b's: no two thresholds label both."""
    return [(a, b) for (a, va, ca), (b, vb, cb) in itertools.permutations(rows, 2)
            if va < vb and RANK[ca] > RANK[cb]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", type=Path, help="bench/zoo.py --json files")
    args = parser.parse_args()
    models: dict[str, dict] = {}
    for path in args.json:
        for row in json.loads(path.read_text())["rows"]:
            judged = (row.get("check") or {}).get("label") in RANK and row.get("verdict") in RANK
            if judged and row.get("verdict_detail"):
                models[row["model"]] = row
    families: dict[str, list] = {}
    for name, row in models.items():
        detail = row["verdict_detail"]
        families.setdefault(family(detail["metric"]), []).append(
            (name, float(detail["value"]), row["check"]["label"], row["verdict"]))
    total = agreed = ceiling = 0
    for name, rows in sorted(families.items(), key=lambda kv: -len(kv[1])):
        best, low, high = best_thresholds([(v, c) for _, v, c, _ in rows])
        now = sum(c == verdict for _, _, c, verdict in rows)
        total, agreed, ceiling = total + len(rows), agreed + now, ceiling + best
        print(f"{name}: {len(rows)} models; calibrun's verdict agrees on {now}; the best thresholds on these models "
              f"agree on {best} (broken below {low:.4g}, ok from {high:.4g})")
        for model, value, check, verdict in sorted(rows, key=lambda r: r[1]):
            print(f"    {value:10.4g}  check {check:8s}  calibrun {verdict:8s}  {model}")
        for a, b in inversions([(m, v, c) for m, v, c, _ in rows]):
            print(f"    inversion: {a} ({models[a]['check']['label']}) below {b} ({models[b]['check']['label']})")
    if total:
        print(f"all {total} models: calibrun's verdict agrees on {agreed} ({agreed / total:.1%}); thresholds fitted to "
              f"these models, family by family, at best {ceiling} ({ceiling / total:.1%}) (goal 90%)")


if __name__ == "__main__":
    main()
