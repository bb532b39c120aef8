"""Where the test suite's CPU goes: a pytest plugin and its report (not a benchmark: it measures the suite).

Each test's wall seconds and CPU seconds, its own (the pytest worker) and its children's (the subprocesses it ran
and waited for; daemons such as a PostgreSQL server or Ray's are not counted), one JSON line per test in
`--suite-cpu-dir` (one file per xdist worker). Then `python bench/suite_cpu.py DIR` prints the totals, the modules
and the tests with the most CPU, and the tests whose wall time is furthest above their CPU time (waits, or
uncounted daemons).

    .venv/bin/python -m pytest -p bench.suite_cpu --suite-cpu-dir /tmp/suite-cpu
    .venv/bin/python bench/suite_cpu.py /tmp/suite-cpu

A module fixture's work is counted in the first test that uses it (the bad-input table, the kill scenarios).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-cpu-dir", default=None, help="write each test's CPU and wall seconds here (JSON lines)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    folder = item.config.getoption("--suite-cpu-dir")
    if not folder:
        yield
        return
    (own0, children0), wall0 = _cpu(), time.monotonic()
    yield
    (own1, children1), wall1 = _cpu(), time.monotonic()
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"cpu.{os.getpid()}.jsonl", "a") as out:
        out.write(json.dumps({"id": item.nodeid, "own": own1 - own0, "children": children1 - children0,
                              "wall": wall1 - wall0}) + "\n")


def report(folder: Path, top: int) -> None:
    rows = [json.loads(line) for path in sorted(folder.glob("cpu.*.jsonl")) for line in path.open()]
    if not rows:
        sys.exit(f"suite_cpu: no measurements in {folder} (run pytest with -p bench.suite_cpu --suite-cpu-dir)")
    for row in rows:
        row["cpu"] = row["own"] + row["children"]
    print(f"{len(rows)} tests: CPU {sum(r['cpu'] for r in rows):.0f} s (in the pytest workers "
          f"{sum(r['own'] for r in rows):.0f} s, in their subprocesses {sum(r['children'] for r in rows):.0f} s), "
          f"wall summed over the workers {sum(r['wall'] for r in rows):.0f} s")
    modules = Counter()
    for row in rows:
        modules[row["id"].split("::")[0]] += row["cpu"]
    print(f"\nmodules by CPU seconds (top {top}):")
    for name, cpu in modules.most_common(top):
        print(f"  {cpu:7.1f}  {name}")
    print(f"\ntests by CPU seconds (top {top}):")
    for row in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"  {row['cpu']:7.1f}  wall {row['wall']:6.1f}  {row['id']}")
    print(f"\ntests whose wall time is furthest above their CPU time (top {top}):")
    for row in sorted(rows, key=lambda r: r["cpu"] - r["wall"])[:top]:
        print(f"  {row['wall'] - row['cpu']:7.1f}  (wall {row['wall']:.1f}, CPU {row['cpu']:.1f})  {row['id']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="the --suite-cpu-dir of a pytest run")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    report(args.folder, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
