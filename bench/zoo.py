"""The zoo bench (issue 23 item 6): every model of tests/zoo.py quantised by a bare onnxruntime script and by
calibrun's default job on the same real data, each int8 model judged by the model's independent task check, and
calibrun's verdict and best recommendation set against that check. Not a test: it prints a table and goal lines.

    python bench/zoo.py                          # every model (about 10 minutes on 2 idle cores)
    python bench/zoo.py --models ocr_cls,orinet  # some
    python bench/zoo.py --json zoo.json          # also the table as JSON
    python bench/zoo.py --held-out               # only the held-out models (docs/zoo.md)
    python bench/zoo.py --change quant.per_channel=true   # also judge calibrun's job with that change
    python bench/zoo.py --tracked --no-rerun     # calibrun's job tracked in an SQLite store, as users run it

Per model:
(a) bare: a child process runs onnxruntime's quantize_static (MinMax, QDQ, QInt8 activations and weights, the
    calibration rows through a CalibrationDataReader, 16 rows a read) and then the fp32 and int8 models over the
    evaluation rows; wall time and peak RSS from os.wait4;
(b) calibrun: `python -m calibrun <the zoo's overrides> tracking=off` (a fresh cache folder), the same way; with
    `--tracked`, tracked into WORK/mlflow.db (the store created before any timing) through the tracking writer;
(c) the independent check on both int8 models (bare: `bare_label`; calibrun's job folder `int8.onnx`: `label`);
(d) result.json's `verdict` (status) and the first of its `recommendations`: calibrun is run again with that change
    appended and its int8 model (`int8_fallback.onnx` where the change made one) is judged by the check again.

Goals printed at the end: calibrun never says "ok" where the check says "broken"; its verdict agrees with the
check on at least 90% of the models; its best recommendation lifts at least two thirds of the broken ones (lifted:
the check's label after the change is better than broken). And issue 26's for the default job (item 3): at most
1.5x the bare script's wall, beside each model's floor: the fixed costs no job of calibrun's can go under, measured
here as fresh processes that only import (`import calibrun.__main__`: what calibrun's process imports; with
`--tracked` also MLflow's store and client: what the tracking writer imports before it can record anything), the
best of three each, over the bare script's time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import loadavg, log, machine_line, wait_child  # noqa: E402

from calibrun.analysis.recommend import changes_of  # noqa: E402

RANK = {"ok": 0, "degraded": 1, "broken": 2}


# ---------------------------------------------------------------------------------------- the bare script
def bare_child(name: str, folder: str, out: str) -> int:
    """quantize_static over the zoo model's calibration rows, then fp32 and int8 over its evaluation rows."""
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from tests.zoo import ZOO, Built, run_rows

    entry = ZOO[name]
    folder = Path(folder)
    built = Built(folder, folder / "calib.npz", folder / "eval.npz")
    feeds, axes, constants = entry.calibration_feeds(built)
    first = next(iter(feeds))
    rows = feeds[first].shape[axes.get(first, 0)]
    import onnxruntime as ort

    shape = ort.InferenceSession(str(entry.path()), providers=["CPUExecutionProvider"]).get_inputs()[0].shape
    step = shape[0] if shape and isinstance(shape[0], int) and shape[0] > 0 else 16

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.starts = iter(range(0, rows, step))

        def get_next(self):
            start = next(self.starts, None)
            if start is None:
                return None
            feed = {k: np.take(v, range(start, min(start + step, rows)), axis=axes.get(k, 0)) for k, v in feeds.items()}
            return {**feed, **constants}

    quantize_static(str(entry.path()), out, Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    feeds, axes, constants = entry.eval_feeds(built)
    for path in (entry.path(), out):
        run_rows(path, feeds, batch_axes=axes, constants=constants, collect=False)
    return 0


TIME = Path("/usr/bin/time")


def _measured(argv: list[str], cwd: Path, log_path: Path) -> dict:
    """Run a child; its exit code, wall seconds and peak RSS. Linux keeps a process's peak RSS across fork and exec,
    so a child forked from this (large) process would report at least this process's RSS: the child is started by
    GNU time (a small process) and its peak RSS read from time's report; without /usr/bin/time, os.wait4 of the
    child directly (then small children read as large as this process)."""
    start = time.perf_counter()
    report = log_path.with_suffix(".rss")
    wrapped = [str(TIME), "-f", "%M", "-o", str(report), *argv] if TIME.is_file() else argv
    with open(log_path, "w") as err:
        proc = subprocess.Popen(wrapped, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        usage = wait_child(proc, start)
    peak = usage.peak_rss / 2**20
    if TIME.is_file() and report.is_file():
        lines = [line for line in report.read_text().split() if line.isdigit()]
        peak = int(lines[-1]) / 1024 if lines else float("nan")  # KiB
    return {"code": usage.returncode, "seconds": usage.wall, "peak_rss_mb": peak}


def _error_line(log_path: Path) -> str:
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or "Error" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else "(no output)"


TRACKED: list[str] = []  # `--tracked`: the default job's tracking overrides (else tracking=off)


def _calibrun(overrides: list[str], work: Path, run: str) -> tuple[dict, dict | None]:
    job = work / run
    tracking = TRACKED if TRACKED and run == "job" else ["tracking=off"]
    usage = _measured([sys.executable, "-m", "calibrun", *overrides, *tracking, f"cache.dir={work / 'cache'}",
                       f"hydra.run.dir={job}"], ROOT, work / f"{run}.log")
    result = None
    if (job / "result.json").is_file():
        result = json.loads((job / "result.json").read_text())
    if usage["code"] or not result or result.get("status") != "ok":
        usage["error"] = (result or {}).get("error") or _error_line(work / f"{run}.log")
    return usage, result


def _quantize_nodes(path: Path) -> int:
    """QuantizeLinear nodes of a model, subgraphs (If, Loop) included: 0 means nothing was quantised."""
    import onnx

    def count(graph) -> int:
        return sum((n.op_type == "QuantizeLinear") + sum(count(a.g) for a in n.attribute if a.HasField("g"))
                   for n in graph.node)

    return count(onnx.load(str(path)).graph)


def _judge(entry, built, int8: Path) -> dict:
    """The check's label of `int8`; an int8 model the package's decode fails on is broken for the task (the FSMN-VAD's
    log of a probability int8 rounded to 0), but a check that fails on fp32 against itself too, or gives no Score, is
    a fault of the check: no label (session 33: two checks had lost their `return` in a merge and were read as
    broken)."""
    from tests.zoo import Score

    try:
        score = entry.check(entry.path(), int8, built)
    except Exception as exc:  # noqa: BLE001 (whatever the package raises)
        error = f"{type(exc).__name__}: {exc}"
        try:
            entry.check(entry.path(), entry.path(), built)
        except Exception as own:  # noqa: BLE001
            return {"label": "-", "error": f"the check fails on fp32 against itself too: {type(own).__name__}: {own}"}
        return {"label": "broken", "metric": "-", "value": float("nan"), "error": error}
    if not isinstance(score, Score):
        return {"label": "-", "error": f"the check gave {type(score).__name__}, not a Score"}
    return {**score.to_json(), "quantize_nodes": _quantize_nodes(int8)}


def bench(name: str, work_root: Path, rerun: bool = True, change: str | None = None) -> dict:
    from tests.zoo import ZOO

    entry = ZOO[name]
    work = work_root / name
    work.mkdir(parents=True, exist_ok=True)
    load_before = loadavg()
    built = entry.build(work / "data")
    row: dict = {"model": name, "package": entry.package, "task": entry.task, "held_out": entry.held_out}

    bare_int8 = work / "bare_int8.onnx"
    bare = _measured([sys.executable, __file__, "--bare", name, str(built.folder), str(bare_int8)], ROOT,
                     work / "bare.log")
    row["bare_seconds"], row["bare_peak_rss_mb"] = round(bare["seconds"], 2), round(bare["peak_rss_mb"])
    row["bare"] = _judge(entry, built, bare_int8) if not bare["code"] else {"label": "-", "error": _error_line(
        work / "bare.log")}

    overrides = entry.overrides(built)
    usage, result = _calibrun(overrides, work, "job")
    row["calibrun_seconds"], row["calibrun_peak_rss_mb"] = round(usage["seconds"], 1), round(usage["peak_rss_mb"])
    if "error" in usage:
        row["calibrun_error"] = usage["error"]
        row["check"] = {"label": "-"}
    else:
        row["check"] = _judge(entry, built, work / "job" / "int8.onnx")
    verdict = (result or {}).get("verdict")
    row["verdict"] = verdict.get("status") if isinstance(verdict, dict) else None
    row["verdict_detail"] = verdict
    recs = (result or {}).get("recommendations") or []
    best = recs[0] if recs and isinstance(recs[0], dict) else None
    row["recommendation"] = best
    row["diagnosis"] = ((result or {}).get("diagnosis") or {}).get("overall")
    if best and rerun and best.get("change"):
        # the change as a user appends it; recommend=off: the re-run judges the change, it recommends nothing
        usage_r, result_r = _calibrun([*overrides, *changes_of(best), "recommend=off"], work, "job_rec")
        job = work / "job_rec"
        model = job / "int8_fallback.onnx" if (job / "int8_fallback.onnx").is_file() else job / "int8.onnx"
        row["after_recommendation"] = (_judge(entry, built, model) if "error" not in usage_r
                                       else {"label": "-", "error": usage_r["error"]})
    if change and "error" not in usage:  # a change of the caller's, judged the same way (not a recommendation)
        usage_c, _ = _calibrun([*overrides, *change.split()], work, "job_change")
        job = work / "job_change"
        model = job / "int8_fallback.onnx" if (job / "int8_fallback.onnx").is_file() else job / "int8.onnx"
        row["change"] = change
        row["after_change"] = (_judge(entry, built, model) if "error" not in usage_c
                               else {"label": "-", "error": usage_c["error"]})
    if bare["seconds"] and not bare["code"]:
        row["time_ratio"] = round(usage["seconds"] / bare["seconds"], 2)
        row["rss_ratio"] = round(usage["peak_rss_mb"] / bare["peak_rss_mb"], 2)
    row["load"] = [load_before, loadavg()]
    row["folder"] = str(work)
    return row


def _cell(score: dict | None) -> str:
    if not score or score.get("label") in (None, "-"):
        return "-"
    return f"{score['label']} {score.get('metric', '')}={score.get('value')}"


def print_table(rows: list[dict]) -> None:
    head = ("model", "held", "check(calibrun int8)", "check(bare int8)", "verdict", "best recommendation",
            "check after it", "time x", "RSS x")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        rec = r.get("recommendation")
        print(" | ".join(str(v) for v in (
            r["model"], "yes" if r["held_out"] else "no", _cell(r["check"]), _cell(r["bare"]), r["verdict"] or "-",
            rec.get("change", "-") if rec else "-", _cell(r.get("after_recommendation")),
            r.get("time_ratio", "-"), r.get("rss_ratio", "-"))))
        if r.get("change"):
            print(f"    {r['model']} with {r['change']}: {_cell(r.get('after_change'))}")
        if r.get("calibrun_error"):
            print(f"    calibrun failed on {r['model']}: {r['calibrun_error']}")


JOB_GOAL = 1.5  # issue 26 item 3: the default job / the bare script
FLOOR_IMPORTS = {"calibrun": "import calibrun.__main__",
                 "mlflow": "import mlflow.store.tracking.sqlalchemy_store; from mlflow import MlflowClient"}


def import_floor(kinds: list[str]) -> dict[str, float]:
    """Wall seconds of a fresh process that only imports (FLOOR_IMPORTS), the best of three, per kind."""
    floors = {}
    for kind in kinds:
        best = None
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", FLOOR_IMPORTS[kind]], cwd=ROOT, check=True)
            seconds = time.perf_counter() - start
            best = seconds if best is None else min(best, seconds)
        floors[kind] = round(best, 2)
    return floors


def job_goal_line(rows: list[dict], floors: dict[str, float]) -> str:
    """Issue 26 item 3: how many default jobs are within JOB_GOAL x the bare script, with each model's floor."""
    timed = [r for r in rows if isinstance(r.get("time_ratio"), float)]
    floor = max(floors.values()) if floors else 0.0
    within = [r["model"] for r in timed if r["time_ratio"] <= JOB_GOAL]
    parts = ", ".join(f"{r['model']} {r['time_ratio']}x (floor {floor / r['bare_seconds']:.2f}x)" for r in timed)
    return (f"default job <= {JOB_GOAL}x the bare script: {len(within)} of {len(timed)} {within}; fixed costs "
            f"{floors} s, the floor = the largest over the bare script's seconds: {parts}")


def goals(rows: list[dict]) -> dict:
    judged = [r for r in rows if r["check"].get("label") in RANK]
    with_verdict = [r for r in judged if r["verdict"] in RANK]
    ok_where_broken = [r["model"] for r in with_verdict if r["verdict"] == "ok" and r["check"]["label"] == "broken"]
    agree = [r for r in with_verdict if r["verdict"] == r["check"]["label"]]
    broken = [r for r in judged if r["check"]["label"] == "broken"]
    lifted = [r["model"] for r in broken if (r.get("after_recommendation") or {}).get("label") in ("ok", "degraded")]
    return {
        "models": len(rows), "judged": len(judged), "with_verdict": len(with_verdict),
        "ok_where_broken": ok_where_broken,
        "agreement": round(len(agree) / len(with_verdict), 3) if with_verdict else None,
        "broken": [r["model"] for r in broken], "lifted": lifted,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--bare"]:
        return bare_child(*argv[1:4])
    from tests.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated zoo names (default: all)")
    parser.add_argument("--held-out", action="store_true", help="only the held-out models")
    parser.add_argument("--json", type=Path, default=None, help="write the rows and goals as JSON here")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a new temp folder)")
    parser.add_argument("--no-rerun", action="store_true", help="do not re-run calibrun with its recommendation")
    parser.add_argument("--tracked", action="store_true",
                        help="track calibrun's default job in WORK/mlflow.db (SQLite) instead of tracking=off")
    parser.add_argument("--change", default=None,
                        help="also re-run calibrun with these overrides (e.g. quant.per_channel=true) and judge it; "
                             "printed apart, never counted as calibrun's recommendation")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown zoo models {unknown}; choose from {', '.join(ZOO)}")
    if args.held_out:
        names = [n for n in names if ZOO[n].held_out]
    work = args.work or Path(tempfile.mkdtemp(prefix="calibrun-zoo-"))
    if args.tracked:
        from calibrun.tracking import Tracker

        work.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{(work / 'mlflow.db').resolve()}"
        Tracker(uri, "calibrun", check=True)  # the store created and migrated here, not in a timed job
        TRACKED[:] = [f"tracking.uri={uri}"]
    log(f"zoo bench: {len(names)} models in {work}; {machine_line()}")
    rows = []
    for name in names:
        start = time.perf_counter()
        row = bench(name, work, rerun=not args.no_rerun, change=args.change)
        rows.append(row)
        rec = (row.get("recommendation") or {}).get("change", "-")
        log(f"{name}: check {_cell(row['check'])}, bare {_cell(row['bare'])}, verdict {row['verdict'] or '-'}, "
            f"best recommendation {rec} -> {_cell(row.get('after_recommendation') or {'label': '-'})}, "
            f"{time.perf_counter() - start:.0f} s; load {loadavg()}")
        if args.json:  # partial results survive an interrupted run
            args.json.write_text(json.dumps({"rows": rows, "goals": goals(rows)}, indent=1, default=str))
    print_table(rows)
    g = goals(rows)
    print(f"\nmachine: {machine_line()}")
    print(f"calibrun says ok where the check says broken: {len(g['ok_where_broken'])} {g['ok_where_broken']} "
          f"(goal 0; {g['with_verdict']} of {g['judged']} judged models have a verdict)")
    print(f"verdict agrees with the check: {g['agreement'] if g['agreement'] is not None else '-'} (goal >= 0.9)")
    print(f"broken models lifted by the best recommendation: {len(g['lifted'])} of {len(g['broken'])} "
          f"{g['lifted']} (goal >= 2/3)")
    floors = import_floor(["calibrun", "mlflow"] if args.tracked else ["calibrun"])
    print(job_goal_line(rows, floors))
    g["fixed_costs"] = floors
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "goals": g, "machine": machine_line()}, indent=1,
                                        default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
