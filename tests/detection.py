"""The task metric for NudeNet's YOLOv8 detector (tests/trained.py "nudenet"), as a user would write one for
`task=custom task.fn=tests.detection:yolov8_agreement`: do the int8 model's detections match the fp32 model's?
"""

from __future__ import annotations

import numpy as np

MATCH_IOU = 0.5


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


# ----------------------------------------------------------------------------- YOLOv8 (NudeNet's 320n.onnx)
# The output [N, 4 + classes, anchors] holds, per anchor, the box (centre x, centre y, width, height in input
# pixels) and one sigmoid score per class. NudeNet's _postprocess keeps anchors whose best class score is >= 0.2,
# then cv2.dnn.NMSBoxes(boxes, scores, 0.25, 0.45), which also drops scores <= 0.25 and suppresses across classes:
# a detection is an anchor whose best class score is > 0.25, kept by class-agnostic NMS at IoU 0.45.

YOLOV8_SCORE = 0.25
YOLOV8_NMS_IOU = 0.45


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> list[int]:
    order = np.argsort(-scores, kind="stable")
    kept = []
    while order.size:
        i = order[0]
        kept.append(int(i))
        order = order[1:][_iou(boxes[i], boxes[order[1:]]) <= iou]
    return kept


def yolov8_detections(raw: np.ndarray, score: float = YOLOV8_SCORE) -> tuple[np.ndarray, np.ndarray]:
    """[4 + classes, anchors] raw output of one image -> ([k, 4] boxes x1, y1, x2, y2; [k] classes) after NMS."""
    raw = raw.astype(np.float64)
    scores = raw[4:]
    best = scores.max(axis=0)
    keep = np.flatnonzero(best > score)
    if not keep.size:
        return np.zeros((0, 4)), np.zeros(0, np.int64)
    cx, cy, w, h = raw[:4, keep]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    kept = _nms(boxes, best[keep], YOLOV8_NMS_IOU)
    return boxes[kept], scores[:, keep].argmax(axis=0)[kept]


def f1_same_class(ref: tuple[np.ndarray, np.ndarray], got: tuple[np.ndarray, np.ndarray],
                  iou: float = MATCH_IOU) -> float:
    """F1 of the int8 detections against the fp32 ones: a match is the same class with IoU >= `iou` (greedy, each
    detection matched once); 1.0 when neither model detects anything."""
    (ref_boxes, ref_classes), (got_boxes, got_classes) = ref, got
    if len(ref_boxes) == 0 and len(got_boxes) == 0:
        return 1.0
    free = np.ones(len(got_boxes), bool)
    matched = 0
    for box, cls in zip(ref_boxes, ref_classes, strict=True):
        candidates = free & (got_classes == cls)
        if not candidates.any():
            continue
        ious = np.where(candidates, _iou(box, got_boxes), -1.0)
        best = int(np.argmax(ious))
        if ious[best] >= iou:
            free[best] = False
            matched += 1
    return 2 * matched / (len(ref_boxes) + len(got_boxes))


def yolov8_agreement(fp32_outputs: dict, int8_outputs: dict, labels) -> dict:
    """The custom task function for a YOLOv8 detector (`task.fn=tests.detection:yolov8_agreement`): per image, the
    F1 of int8 detections matching fp32 ones (same class, IoU >= 0.5), and the detection counts of both."""
    name = next(iter(fp32_outputs))
    values, ref_counts, got_counts = [], [], []
    for ref_raw, got_raw in zip(fp32_outputs[name], int8_outputs[name], strict=True):
        ref, got = yolov8_detections(ref_raw), yolov8_detections(got_raw)
        values.append(f1_same_class(ref, got))
        ref_counts.append(len(ref[0]))
        got_counts.append(len(got[0]))
    return {"det_f1": float(np.mean(values)), "fp32_detections": float(np.mean(ref_counts)),
            "int8_detections": float(np.mean(got_counts))}
