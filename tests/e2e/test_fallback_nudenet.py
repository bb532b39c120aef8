"""Issue 11's "done when" on a trained model from the package index: NudeNet's YOLOv8n detector (nudenet 3.4.2,
`tests/trained.py` model "nudenet"), whose default int8 model is broken for its task, repaired by the automatic fp32
fallback judged by a task metric supplied through task=custom (tests.detection:yolov8_agreement).

The model's one output [N, 22, 2100] concatenates box values in pixels (0..320) with 18 sigmoid class scores
(0..1): one int8 scale for the whole tensor (~1.25 per step) rounds every class score to 0 or 1.25, so detections
between 0.25 and ~0.6 vanish. License: the wheel's metadata says MIT, its LICENSE file is AGPL-3.0 (the YOLOv8
model); the model is test data downloaded at test time into the test cache, never redistributed.

Real photos from scikit-image (no network): on these five the fp32 model finds a female face (astronaut), a male
face (camera) and a few low-score false positives (moon, phantom, color), which int8 must reproduce too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_python

REPO = Path(__file__).resolve().parents[2]
PHOTOS = ("astronaut.png", "camera.png", "color.png", "moon.png", "phantom.png")
TARGET = 0.9


def calibrun(tmp: Path, *overrides: str):
    env = clean_env(PYTHONPATH=str(REPO))  # task.fn=tests.detection:... is imported from the repository
    return run_python(["-m", "calibrun", *overrides, f"cache.dir={tmp / 'cache'}"], tmp, env, timeout=900)


def result_of(folder: Path) -> dict:
    return json.loads((folder / "result.json").read_text())


@pytest.mark.slow
def test_fallback_repairs_nudenet_broken_by_its_shared_output_scale(tmp_path):
    from tests.trained import model_path, photo_folder

    photos = photo_folder(tmp_path / "photos", PHOTOS)
    rows = len(PHOTOS)
    common = ["model=file", f"model.path={model_path('nudenet')}", f"batches={rows}", f"eval.rows={rows}",
              "tracking=off", "diagnostics=off", "recommend=off", "task=custom",
              "task.fn=tests.detection:yolov8_agreement",
              "analysis.metric=task.det_f1", "analysis.goal=max"]
    for key in ("data", "eval_data"):  # NudeNet's input: 320x320 RGB, /255, padded with 0, no mean/std
        common += [f"{key}=images", f"{key}.path={photos}", f"{key}.crop=320", f"{key}.letterbox=true",
                   f"{key}.pad_value=0", f"{key}.mean=[0,0,0]", f"{key}.std=[1,1,1]"]

    # 1. one run: the default int8 model (QDQ, minmax; its metrics are the job's own, in result.json), then
    # sensitivity (with the coarse pre-pass over 20 groups of pairs) and the fallback to the target
    proc = calibrun(tmp_path, *common, "analysis=sensitivity", "analysis.kinds=[activation]", "analysis.groups=20",
                    f"analysis.target={TARGET}",
                    f"hydra.run.dir={tmp_path / 'b'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    default = result_of(tmp_path / "b")["metrics"]  # the default int8 model is broken for the task
    assert default["task.fp32_detections"] >= 1  # the photos give the detector something to find
    assert default["task.int8_detections"] < default["task.fp32_detections"]
    assert default["task.det_f1"] < 0.5
    record = json.loads((tmp_path / "b" / "sensitivity.json").read_text())
    assert record["int8_metric"] == default["task.det_f1"]
    assert record["trials"] < record["tensors"] / 3  # the pre-pass spared most single-pair trials
    top = record["ranking"][0]
    assert top["tensor"] == "output0"  # the concatenated output and its shared scale
    assert top["nodes"] == ["/model.22/Concat_25"]
    assert top["gain"] > 0
    fallback = record["fallback"]
    assert fallback["reached"]
    assert fallback["metric"] >= TARGET
    nodes = record["nodes_to_exclude"]
    assert "/model.22/Concat_25" in nodes
    assert 1 <= len(nodes) <= 5  # a short list, not the model
    assert (tmp_path / "b" / "int8_fallback.onnx").is_file()

    # 2. the list pasted into a plain run: the same model and the same task metric
    proc = calibrun(tmp_path, *common, f"quant.nodes_to_exclude=[{','.join(nodes)}]",
                    f"hydra.run.dir={tmp_path / 'c'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fixed = result_of(tmp_path / "c")
    assert fixed["exclusions"]["nodes_to_exclude"] == nodes
    assert fixed["metrics"]["task.det_f1"] == fallback["metric"]
    assert fixed["metrics"]["task.det_f1"] >= TARGET
    assert (tmp_path / "c" / "int8.onnx").read_bytes() == (tmp_path / "b" / "int8_fallback.onnx").read_bytes()
