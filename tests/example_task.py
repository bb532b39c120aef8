"""The README's worked example of a custom task metric (task=custom task.fn=tests.example_task:detections)."""

import numpy as np


def detections(fp32, int8, labels):
    """fp32, int8: {output name: array of this batch}; labels: this batch's labels or None."""
    ref, got = fp32["output"][..., 4], int8["output"][..., 4]  # objectness of a YOLO-style output
    kept_ref, kept_got = ref > 0.3, got > 0.3
    return {"kept_agreement": float(np.mean(kept_ref == kept_got)),
            "objectness_max_error": float(np.abs(ref - got).max())}
