"""A sweep's report: the aggregator that turns a sweep folder into the report files (aggregate; `python -m
calibrun.report SWEEP_DIR`) and report.md with its plots (markdown)."""
