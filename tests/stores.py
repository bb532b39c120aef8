"""A migrated MLflow store per test without paying for MLflow's schema migration each time."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mlflow import MlflowClient

_MLFLOW_TEMPLATE: list[Path] = []


def fresh_mlflow_store(folder: Path) -> str:
    """A migrated, empty MLflow SQLite store at folder/mlflow.db; returns its URI.

    Creating MLflow's schema costs seconds per database, so it is done once per test session and copied.
    """
    if not _MLFLOW_TEMPLATE:
        template = Path(tempfile.mkdtemp(prefix="calibrun-mlflow-template-")) / "mlflow.db"
        MlflowClient(f"sqlite:///{template}").search_experiments()
        _MLFLOW_TEMPLATE.append(template)
    target = Path(folder) / "mlflow.db"
    shutil.copyfile(_MLFLOW_TEMPLATE[0], target)
    return f"sqlite:///{target}"
