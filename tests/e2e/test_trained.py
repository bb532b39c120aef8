"""tests/trained.py: two processes filling an empty model cache at once both get the same, complete model file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "from tests.trained import model_path; print(model_path('nudenet'))"


@pytest.mark.slow
def test_two_processes_fill_the_cache_at_once(tmp_path):
    from tests.trained import CACHE, MODELS

    package, version, member = MODELS["nudenet"]
    cache = tmp_path / "cache"
    wheels = sorted((CACHE / "wheels").glob(f"{package}-{version}-*.whl"))
    if wheels:  # the wheel from the machine's cache (else both processes download it from the package index)
        (cache / "wheels").mkdir(parents=True)
        shutil.copyfile(wheels[0], cache / "wheels" / wheels[0].name)
    env = {"CALIBRUN_TEST_CACHE": str(cache), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    paths = {Path(out.strip()) for out, _ in outs}
    assert len(paths) == 1
    (path,) = paths
    assert path.parent == cache / "models"
    with zipfile.ZipFile(next((cache / "wheels").glob("*.whl"))) as archive:
        assert path.stat().st_size == archive.getinfo(member).file_size
    assert [o.name for o in onnx.load(str(path)).graph.output] == ["output0"]
    leftovers = [p.name for p in cache.rglob("*") if p.name.startswith(".")]
    assert leftovers == []  # no temp file or download folder left behind
