"""The calibration cache across processes: calibtool's second run is a hit, and two processes filling one key at
the same moment leave one valid file. The in-process tests of the cache are in tests/unit/test_calibrate.py, whose
helpers these reuse."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from calibrun.model import open_float_model
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import quantize_lab
from tests.conftest import clean_env, run_calibtool
from tests.unit.test_calibrate import FACTOR, SEED, SPAN_REL, CalibrationSpy, cache_entries, lab_span

pytestmark = pytest.mark.slow  # subprocesses: calibtool, two racing calibrations


@pytest.fixture
def spy(monkeypatch):
    return CalibrationSpy(monkeypatch)


@pytest.fixture
def fp32(lab_model):
    return open_float_model(lab_model)


def test_calibtool_second_run_reuses_the_cache(tmp_path, lab_model):
    cache_dir = tmp_path / "cache"
    out = tmp_path / "int8.onnx"

    def run() -> dict:
        code, stdout, stderr = run_calibtool(["quantize", lab_model, out, SEED, "0.2", "3"], tmp_path, cache_dir,
                                             timeout=120)
        assert code == 0, stderr
        return json.loads(stdout)

    first = run()
    folder = cache_dir / "ranges"
    entries = cache_entries(folder)
    ranges = [folder / e for e in entries if e.endswith(".json") and not e.endswith(".key.json")]
    assert len(entries) == 3, entries  # the ranges, their key record, the key's lock file
    assert len(ranges) == 1, entries
    before = ranges[0].stat()
    text = ranges[0].read_text()
    model = out.read_bytes()

    second = run()
    assert second == first
    assert cache_entries(folder) == entries
    after = ranges[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten: a hit
    assert ranges[0].read_text() == text
    assert out.read_bytes() == model
    assert first["span"] == pytest.approx(lab_span(lab_model, SEED, 0.2, 3), rel=SPAN_REL)


RACE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from calibrun.model import open_float_model
    from calibrun.quant.quantize import quantize_lab
    from calibrun.quant.calibrate import CalibrationCache

    model, out, folder, barrier, me = sys.argv[1:6]
    barrier = Path(barrier)
    real_load = CalibrationCache.load

    def load_then_wait(self, *args, **kwargs):
        # The real lookup runs; then both processes wait for each other, so both calibrate and
        # both store the same key at the same moment (the worst interleaving, every time).
        found = real_load(self, *args, **kwargs)
        (barrier / me).touch()
        deadline = time.monotonic() + 60
        while len(list(barrier.iterdir())) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the other process never arrived")
            time.sleep(0.005)
        return found

    CalibrationCache.load = load_then_wait
    fp32 = open_float_model(model)
    result = quantize_lab(fp32, out, 4242, 1.0, 16, cache=CalibrationCache(folder))
    print(json.dumps({"key": result["cache_key"], "hit": result["cache_hit"], "span": result["span"]}))
    """
)


def test_two_processes_filling_one_key_leave_one_valid_file(tmp_path, fp32, lab_model, spy):
    cache_dir = tmp_path / "cache"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = clean_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE_SCRIPT, str(lab_model), str(tmp_path / f"int8_{i}.onnx"),
             str(cache_dir), str(barrier), f"p{i}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )
        for i in range(2)
    ]
    outputs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))

    # both missed at the same moment; the key's lock let one calibrate, the other waited and read its ranges
    assert sorted(o["hit"] for o in outputs) == [False, True]
    key = outputs[0]["key"]
    assert outputs[1]["key"] == key
    # no temp files left
    assert cache_entries(cache_dir / "ranges") == sorted([f"{key}.json", f"{key}.key.json", f"{key}.lock"])
    cache = CalibrationCache(cache_dir)
    record = json.loads(cache.path(key).read_text())["calibrun"]["record"]
    expected = lab_span(lab_model, SEED, FACTOR, 16)
    assert cache.load(key, record, "minmax") == pytest.approx(expected, rel=SPAN_REL)
    assert json.loads((cache.folder / f"{key}.key.json").read_text())["key"] == key
    assert (tmp_path / "int8_0.onnx").read_bytes() == (tmp_path / "int8_1.onnx").read_bytes()

    spy.forbid()
    after = quantize_lab(fp32, tmp_path / "after.onnx", SEED, FACTOR, 16, cache=cache)
    assert after["cache_hit"] is True
    assert (tmp_path / "after.onnx").read_bytes() == (tmp_path / "int8_0.onnx").read_bytes()
