"""calibrun.quant.cache: one key scheme (sha256 of a record's canonical JSON) and one subfolder per kind; entries of the
earlier flat layout are detected and never read."""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
import sys
import time

import pytest

from calibrun.core.errors import CalibrunError
from calibrun.model import open_float_model
from calibrun.quant import cache
from calibrun.quant.calibrate import CalibrationCache
from calibrun.quant.quantize import quantize_lab


def test_key_is_the_sha256_of_the_canonical_record():
    record = {"b": [1, 2.5, None], "a": {"y": "z", "x": True}}
    canonical = '{"a":{"x":true,"y":"z"},"b":[1,2.5,null]}'
    assert cache.key_of(record) == hashlib.sha256(canonical.encode()).hexdigest()[: cache.KEY_CHARS]
    assert cache.key_of(dict(reversed(record.items()))) == cache.key_of(record)  # key order does not matter
    assert cache.key_of({**record, "b": [1, 2.5]}) != cache.key_of(record)


def test_one_subfolder_per_kind(tmp_path):
    assert cache.folder(tmp_path, "ranges") == tmp_path / "ranges"
    assert not (tmp_path / "ranges").exists()  # named, not made
    assert cache.folder(tmp_path, "models", create=True).is_dir()
    assert cache.folders(tmp_path) == [tmp_path, *(tmp_path / kind for kind in cache.KINDS)]
    with pytest.raises(ValueError, match="unknown cache kind 'nope'"):
        cache.folder(tmp_path, "nope")


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "root").write_text("a file where the cache folder should be")
    with pytest.raises(CalibrunError, match="cannot create cache folder .*root/ranges"):
        cache.folder(tmp_path / "root", "ranges", create=True)


def test_ranges_live_in_the_ranges_folder_and_an_old_flat_entry_is_not_read(tmp_path, lab_model, caplog):
    fp32 = open_float_model(lab_model)
    root = tmp_path / "cache"
    first = quantize_lab(fp32, tmp_path / "a.onnx", 4242, 1.0, 4, cache=CalibrationCache(root))
    key = first["cache_key"]
    # <key>.lock: the lock a calibration held (an OS lock; the empty file stays)
    assert sorted(p.name for p in (root / "ranges").iterdir()) == [f"{key}.json", f"{key}.key.json", f"{key}.lock"]
    assert [p.name for p in root.iterdir()] == ["ranges"]
    # The same ranges placed where the earlier layout kept them: seen, named in the log, and not read.
    entry = (root / "ranges" / f"{key}.json").read_text()
    (root / f"{key}.json").write_text(entry)
    for path in (root / "ranges").iterdir():
        path.unlink()
    caplog.set_level(logging.INFO, logger="calibrun")
    again = quantize_lab(fp32, tmp_path / "b.onnx", 4242, 1.0, 4, cache=CalibrationCache(root))
    assert again["cache_hit"] is False
    assert again["cache_key"] == key
    assert any("earlier layout" in r.getMessage() and f"{key}.json" in r.getMessage() for r in caplog.records)
    assert json.loads((root / "ranges" / f"{key}.json").read_text()) == json.loads(entry)
    third = quantize_lab(fp32, tmp_path / "c.onnx", 4242, 1.0, 4, cache=CalibrationCache(root))
    assert third["cache_hit"] is True


def test_prepared_models_are_keyed_by_their_record(tmp_path, caplog):
    import onnxruntime
    from omegaconf import OmegaConf

    from calibrun.config import Config
    from calibrun.job import prepare
    from calibrun.lab.model import write_lab_model
    from calibrun.model import file_sha256
    from calibrun.model.prepare import PREPARE_VERSION
    from calibrun.model.prepared import prepared_record

    src = write_lab_model(tmp_path / "lab.onnx")
    cfg = OmegaConf.structured(Config)
    cfg.model.name, cfg.model.path, cfg.cache.dir = "file", str(src), str(tmp_path / "cache")
    job = tmp_path / "job"
    job.mkdir()
    sha256 = file_sha256(src)
    models = tmp_path / "cache" / "models"
    old = models / f"{sha256[:32]}-prep{PREPARE_VERSION}-ort{onnxruntime.__version__}.onnx"
    models.mkdir(parents=True)
    old.write_bytes(b"an entry of the earlier naming: never read")
    caplog.set_level(logging.INFO, logger="calibrun")
    fp32, _ = prepare(cfg, job)
    assert fp32.path == models / f"{cache.key_of(prepared_record(sha256))}.onnx"
    assert prepared_record(sha256)["source_sha256"] == sha256
    assert fp32.path.with_suffix(".steps.json").is_file()
    assert any("earlier naming" in r.getMessage() and old.name in r.getMessage() for r in caplog.records)
    assert old.read_bytes().startswith(b"an entry")  # left alone, not read


def test_a_ranges_file_has_the_same_bytes_whatever_order_the_tensors_come_in(tmp_path):
    """onnxruntime collects tensors in set order (it varies with PYTHONHASHSEED): the file must not."""
    import numpy as np
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    from calibrun.quant.calibrate import write_ranges

    ranges = {name: TensorData(lowest=np.float32(-i - 1), highest=np.float32(i + 1))
              for i, name in enumerate(["x", "h", "relu_out", "y"])}
    forward = TensorsData(CalibrationMethod.MinMax, dict(ranges))
    backward = TensorsData(CalibrationMethod.MinMax, dict(reversed(list(ranges.items()))))
    a = write_ranges(tmp_path / "a.json", forward, {"k": 1}, 2.0).read_bytes()
    b = write_ranges(tmp_path / "b.json", backward, {"k": 1}, 2.0).read_bytes()
    assert a == b


# --- one calibration per key across processes (CalibrationCache.claim) ---------------------------------------------

HOLD = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(path, seconds: float) -> subprocess.Popen:
    """Another process holding the lock file `path` for `seconds` (it has it once this returns)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_waits_for_the_key_another_one_is_calibrating(tmp_path):
    store = CalibrationCache(tmp_path)
    (tmp_path / "ranges").mkdir()
    holder = _holder(tmp_path / "ranges" / "k.lock", 1.0)
    try:
        with store.claim("k") as waited:
            pass
        assert 0.5 < waited < 10  # had only once the other process let go (it holds it for 1 s)
    finally:
        holder.wait(timeout=30)
    with store.claim("k") as waited:  # nobody holds it: no wait
        assert waited < 0.5


def test_a_killed_holder_releases_the_key_at_once(tmp_path):
    store = CalibrationCache(tmp_path)
    (tmp_path / "ranges").mkdir()
    holder = _holder(tmp_path / "ranges" / "k.lock", 600)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    started = time.perf_counter()
    with store.claim("k"):
        pass
    assert time.perf_counter() - started < 5  # the lock died with its process: no stale lock to time out


def test_a_holder_that_never_finishes_costs_the_wait_then_a_warning_not_a_deadlock(tmp_path, caplog):
    store = CalibrationCache(tmp_path, wait=0.3)
    (tmp_path / "ranges").mkdir()
    holder = _holder(tmp_path / "ranges" / "k.lock", 600)
    try:
        with caplog.at_level(logging.WARNING), store.claim("k") as waited:
            assert holder.poll() is None  # the other one still holds it: this block runs without it
        assert 0.3 <= waited < 5
        assert "has been calibrating k for" in caplog.text
        assert "doing it here too" in caplog.text
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_waiting_job_reads_the_first_ones_ranges_as_a_hit(tmp_path, lab_model):
    """The key held by another process that writes the ranges meanwhile: this job waits, then finds them."""
    fp32 = open_float_model(lab_model)
    first_cache, second_cache = tmp_path / "first", tmp_path / "second"
    first = quantize_lab(fp32, tmp_path / "a.onnx", 4242, 1.0, 4, cache=CalibrationCache(first_cache))
    key = first["cache_key"]
    (second_cache / "ranges").mkdir(parents=True)
    copy = ("import shutil, sys, time\nfrom filelock import FileLock\nlock = FileLock(sys.argv[1]); lock.acquire()\n"
            "print('held', flush=True); time.sleep(1.0)\nfor name in sys.argv[3:]: shutil.copy(name, sys.argv[2])\n")
    holder = subprocess.Popen([sys.executable, "-c", copy, str(second_cache / "ranges" / f"{key}.lock"),
                               str(second_cache / "ranges"), *(str(first_cache / "ranges" / f"{key}{suffix}")
                                                               for suffix in (".json", ".key.json"))],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    try:
        second = quantize_lab(fp32, tmp_path / "b.onnx", 4242, 1.0, 4, cache=CalibrationCache(second_cache))
    finally:
        holder.wait(timeout=30)
    assert second["cache_hit"] is True
    assert second["cache_key"] == key
    assert 0.5 < second["calibration_wait_seconds"] < 10
    assert first["calibration_wait_seconds"] < 0.5


PREPARE = """
import logging, sys, time
from pathlib import Path
from omegaconf import OmegaConf
from calibrun.job import prepare
go, cache_dir, model, job_dir = sys.argv[1:5]
cfg = OmegaConf.create({"model": {"name": "file", "path": model},
                        "cache": {"enabled": True, "dir": cache_dir, "wait": 60.0}})
messages = []
handler = logging.Handler()
handler.emit = lambda record: messages.append(record.getMessage())
logging.getLogger("calibrun").addHandler(handler)
logging.getLogger("calibrun").setLevel(logging.INFO)
while not Path(go).exists():
    time.sleep(0.002)
prepare(cfg, Path(job_dir))
print("reused" if any("(reused, sha256 verified)" in m for m in messages) else
      "prepared" if any(m.startswith("preparing ") for m in messages) else "neither")
"""


def test_workers_that_prepare_one_model_together_prepare_it_once(tmp_path, lab_model):
    """Two processes asking for the same prepared model at the same moment (parallel workers on a shared cache
    folder): one prepares it, the other waits for its lock and reuses the file (without the lock both prepared)."""
    go = tmp_path / "go"
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", PREPARE, str(go), str(tmp_path / "cache"),
                                       str(lab_model), str(tmp_path / name)], stdout=subprocess.PIPE, text=True))
    time.sleep(3)  # both have imported calibrun and wait for the go file
    go.touch()
    said = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert said == ["prepared", "reused"]
    assert len(list((tmp_path / "cache" / "models").glob("*.onnx"))) == 1


def test_a_cache_file_removed_under_a_running_job_is_said_as_such(tmp_path):
    """A probe removed cache.dir while a job ran: the job failed with a bare `[Errno 2] No such file or directory:
    '.../models/<key>.onnx'`. A file not found under the cache root is now named as the cache's, with what to do;
    any other error, or a missing file elsewhere, keeps its own words."""
    from omegaconf import OmegaConf

    from calibrun.runner import _said

    root = tmp_path / "cache"
    gone = FileNotFoundError(2, "No such file or directory", str(root / "models" / "k.onnx"))
    assert cache.vanished(gone, root) == (
        f"{root / 'models' / 'k.onnx'} is gone from the calibration cache ({root}) while the job used it: was the "
        "cache folder removed or cleaned meanwhile? Run the job again (it computes what is missing)")
    assert cache.vanished(FileNotFoundError(2, "No such file or directory", str(tmp_path / "data.npz")), root) is None
    assert cache.vanished(PermissionError(13, "Permission denied", str(root / "ranges" / "k.json")), root) is None
    assert cache.vanished(FileNotFoundError("no filename"), root) is None
    on = OmegaConf.create({"cache": {"enabled": True, "dir": str(root)}})
    assert _said(gone, on) == cache.vanished(gone, root)
    assert _said(gone, OmegaConf.create({"cache": {"enabled": False, "dir": str(root)}})) == (
        f"[Errno 2] No such file or directory: '{root / 'models' / 'k.onnx'}'")
