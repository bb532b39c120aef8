"""A job's result, typed: what `result.json` holds (docs/results.md), built by the job's stages and read by tracking,
resume, the aggregator and the search summary.

`JobResult.to_json()` is the file's object with its keys in one fixed order; `JobResult.from_json(record)` reads
one back and refuses a record no reader could use (ValueError naming what is wrong). Keys this version does not
know are kept (`extra`) and written back after the known ones, so that rewriting a record loses nothing.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields
from pathlib import Path

STATUSES = ("ok", "failed")


@dataclass
class JobResult:
    status: str  # "ok" | "failed"
    error: str | None = None  # a failed job: its one line
    verdict: dict | None = None  # the headline: status ok|degraded|broken, metric, value, because (measure/verdict.py)
    recommendations: list | None = None  # measured changes that made the model better, best first (analysis/recommend)
    params: dict = field(default_factory=dict)  # what decides the job (its identity, options, model hash)
    metrics: dict | None = None  # every number measured
    ops: dict | None = None  # op type -> node count of the int8 model
    cache_key: str | None = None  # the calibration cache key of the ranges
    preparation: list | None = None  # what model preparation did
    exclusions: dict | None = None  # quant.nodes_to_exclude / op_types_to_quantize resolved against the model
    eval_source: dict | None = None  # everything that rebuilds the evaluation rows
    used: dict | None = None  # what the job really used (batches, rows, sources)
    task: dict | None = None  # the task metric chosen and why
    files: dict | None = None  # the job's files (relative to its folder) and their sha256
    diagnosis: dict | None = None  # per-tensor diagnosis (QDQ runs with diagnostics)
    analysis: dict | None = None  # sensitivity analysis / fallback summary
    mlflow: dict | None = None  # the job's MLflow run: run_id, experiment_id, model_id
    extra: dict = field(default_factory=dict)  # keys of the record this version does not know, kept as they are

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failed(cls, error: str, params: dict, mlflow: dict | None = None) -> JobResult:
        return cls("failed", error=error, params=params, mlflow=mlflow)

    def to_json(self) -> dict:
        """The record as result.json holds it: the known keys in this class's order (those set), then `extra`."""
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in record.items() if v is not None}, **self.extra}

    @classmethod
    def from_json(cls, record) -> JobResult:
        """The result a result.json object describes; ValueError (the problem, as a phrase) when no reader could use
        it: not an object, no valid status, or a completed job without params, metrics, files, a numeric
        max_abs_error or an int8 model name."""
        if not isinstance(record, dict):
            raise ValueError("is not a JSON object")
        if record.get("status") not in STATUSES:
            raise ValueError(f"has no valid status (got {record.get('status')!r})")
        if record["status"] == "ok":
            for key in ("params", "metrics", "files"):
                if not isinstance(record.get(key), dict):
                    raise ValueError(f"has no {key!r} object")
            error = record["metrics"].get("max_abs_error")
            if not isinstance(error, numbers.Real) or isinstance(error, bool):
                raise ValueError("has no numeric metrics.max_abs_error")
            if not isinstance(record["files"].get("int8"), str):
                raise ValueError("names no int8 model (files.int8)")
        known = {f.name for f in fields(cls)} - {"extra"}
        values = {k: v for k, v in record.items() if k in known}
        if not isinstance(values.get("params"), dict):
            values["params"] = {}
        return cls(**values, extra={k: v for k, v in record.items() if k not in known})

    @classmethod
    def read(cls, path: str | Path) -> JobResult:
        """result.json read and checked (OSError, ValueError on an unreadable or unusable file)."""
        import json

        return cls.from_json(json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        from calibrun.core.files import write_json

        write_json(Path(path), self.to_json())
