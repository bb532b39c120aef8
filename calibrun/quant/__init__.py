"""Calibration and quantisation: the calibration pass and its ranges (calibrate), histogram calibration at
inference speed (histogram), the content-addressed cache (cache), quantize_static fed from cached ranges (quantize),
the CalibrationDataReader contract (reader)."""
