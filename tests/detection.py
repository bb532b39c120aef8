"""A task metric for the YOLOX detector of tests/trained.py (det_yolox), as a user would write one for
`task=custom task.fn=tests.detection:yolox_agreement`: do the int8 model's detections match the fp32 model's?

The model's output [N, 3549, 6] is raw YOLOX: per anchor point of the 8/16/32 stride grids, box centre offsets,
log width/height, objectness and one class score. Decoded as ddddocr does (its detection_engine.py), a detection
is an anchor with objectness x class score > 0.3 (after class-agnostic NMS at IoU 0.45); an fp32 detection is
matched when an int8 detection overlaps it with IoU > 0.5.
"""

from __future__ import annotations

import numpy as np

SIZE = 416
SCORE = 0.3
MATCH_IOU = 0.5


def _grid(size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    grids, strides = [], []
    for stride in (8, 16, 32):
        cells = size // stride
        xv, yv = np.meshgrid(np.arange(cells), np.arange(cells))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((cells * cells, 1), stride))
    return np.concatenate(grids).astype(np.float64), np.concatenate(strides).astype(np.float64)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


def detections(raw: np.ndarray, score: float = SCORE) -> np.ndarray:
    """[anchors, 6] raw output of one image -> [k, 4] boxes (x1, y1, x2, y2) kept after NMS."""
    grid, stride = _grid()
    raw = raw.astype(np.float64)
    centre = (raw[:, :2] + grid) * stride
    size = np.exp(np.clip(raw[:, 2:4], -20, 20)) * stride
    scores = raw[:, 4] * raw[:, 5]
    keep = scores > score
    boxes = np.concatenate([centre - size / 2, centre + size / 2], 1)[keep]
    order = np.argsort(-scores[keep])
    kept = []
    while order.size:
        i = order[0]
        kept.append(i)
        order = order[1:][_iou(boxes[i], boxes[order[1:]]) <= 0.45]
    return boxes[kept]


def agreement(ref: np.ndarray, got: np.ndarray) -> float:
    """Matched fp32 detections / the larger of the two counts (1.0 when neither model detects anything)."""
    if len(ref) == 0 and len(got) == 0:
        return 1.0
    free = np.ones(len(got), bool)
    matched = 0
    for box in ref:
        if not free.any():
            break
        ious = np.where(free, _iou(box, got), 0.0)
        best = int(np.argmax(ious))
        if ious[best] > MATCH_IOU:
            free[best] = False
            matched += 1
    return matched / max(len(ref), len(got))


def yolox_agreement(fp32_outputs: dict, int8_outputs: dict, labels) -> dict:
    """The custom task function: detection agreement and the fp32/int8 detection counts per image."""
    name = next(iter(fp32_outputs))
    ref_all, got_all = fp32_outputs[name], int8_outputs[name]
    values, ref_counts, got_counts = [], [], []
    for ref_raw, got_raw in zip(ref_all, got_all, strict=True):
        ref, got = detections(ref_raw), detections(got_raw)
        values.append(agreement(ref, got))
        ref_counts.append(len(ref))
        got_counts.append(len(got))
    return {"det_agreement": float(np.mean(values)), "fp32_detections": float(np.mean(ref_counts)),
            "int8_detections": float(np.mean(got_counts))}


def map_iou(fp32_outputs: dict, int8_outputs: dict, labels, threshold: float = 0.3) -> dict:
    """A text detector's probability map (DBNet, ocr_det): IoU of the fp32 and int8 maps thresholded at 0.3
    (1.0 when neither finds text), and the fraction of fp32 text pixels the int8 map keeps."""
    name = next(iter(fp32_outputs))
    ref, got = fp32_outputs[name] > threshold, int8_outputs[name] > threshold
    union = np.logical_or(ref, got).sum()
    inter = np.logical_and(ref, got).sum()
    return {"map_iou": float(inter / union) if union else 1.0,
            "text_recall": float(inter / ref.sum()) if ref.sum() else 1.0}
