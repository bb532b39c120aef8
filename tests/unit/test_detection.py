"""The YOLOv8 task function of tests/detection.py (yolov8_agreement, for NudeNet's 320n.onnx) on hand-built raw
outputs: decoding, the score threshold, class-agnostic NMS, and the F1 of same-class matches."""

from __future__ import annotations

import numpy as np
import pytest

from tests.detection import f1_same_class, yolov8_agreement, yolov8_detections

CLASSES = 18


def raw(*anchors: tuple[float, float, float, float, int, float], count: int = 8) -> np.ndarray:
    """[4 + CLASSES, count]: the given anchors (cx, cy, w, h, class, score) first, the rest empty."""
    out = np.zeros((4 + CLASSES, count), np.float32)
    for i, (cx, cy, w, h, cls, score) in enumerate(anchors):
        out[:4, i] = cx, cy, w, h
        out[4 + cls, i] = score
    return out


def test_decoding_threshold_and_nms():
    out = raw((100, 100, 40, 40, 1, 0.9),   # a face
              (102, 101, 40, 40, 12, 0.6),  # the same place, another class, lower score: suppressed
              (250, 250, 20, 20, 7, 0.25),  # at the threshold (NudeNet's NMSBoxes keeps > 0.25): dropped
              (250, 60, 20, 30, 7, 0.26))
    boxes, classes = yolov8_detections(out)
    assert classes.tolist() == [1, 7]
    np.testing.assert_allclose(boxes, [[80, 80, 120, 120], [240, 45, 260, 75]])


def test_f1_counts_same_class_matches_at_iou_half():
    ref = yolov8_detections(raw((100, 100, 40, 40, 1, 0.9), (250, 60, 20, 30, 7, 0.5)))
    assert f1_same_class(ref, ref) == 1.0
    shifted = yolov8_detections(raw((110, 100, 40, 40, 1, 0.9), (250, 60, 20, 30, 7, 0.5)))  # IoU 30/50 = 0.6
    assert f1_same_class(ref, shifted) == 1.0
    far = yolov8_detections(raw((125, 100, 40, 40, 1, 0.9), (250, 60, 20, 30, 7, 0.5)))  # IoU 15/65 < 0.5
    assert f1_same_class(ref, far) == pytest.approx(2 * 1 / 4)
    relabelled = yolov8_detections(raw((100, 100, 40, 40, 12, 0.9), (250, 60, 20, 30, 7, 0.5)))
    assert f1_same_class(ref, relabelled) == pytest.approx(0.5)
    missing = yolov8_detections(raw((100, 100, 40, 40, 1, 0.9)))
    assert f1_same_class(ref, missing) == pytest.approx(2 * 1 / 3)
    nothing = yolov8_detections(raw())
    assert f1_same_class(nothing, nothing) == 1.0
    assert f1_same_class(ref, nothing) == 0.0


def test_task_function_averages_images_and_counts_detections():
    # the shared-output-scale breakage: one int8 step of ~1.25 rounds every class score to 0 or 1.25
    fp32 = np.stack([raw((100, 100, 40, 40, 1, 0.9), (250, 60, 20, 30, 7, 0.5)), raw()])
    int8 = np.round(fp32 / 1.25) * 1.25
    metrics = yolov8_agreement({"output0": fp32}, {"output0": int8}, None)
    assert metrics == {"det_f1": pytest.approx((2 / 3 + 1.0) / 2), "fp32_detections": 1.0,
                       "int8_detections": 0.5}
