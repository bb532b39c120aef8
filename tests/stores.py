"""A migrated MLflow store per test without paying for MLflow's schema migration each time."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from tests.trained import CACHE


@functools.cache
def _template() -> Path:
    """An empty store migrated by this MLflow version, made once per machine in the test cache folder (the
    schema depends only on the version) and renamed into place whole: workers that race both migrate one."""
    template = CACHE / "mlflow-template" / f"mlflow-{mlflow.__version__}.db"
    if not template.is_file():
        template.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=template.parent) as tmp:
            db = Path(tmp) / "mlflow.db"
            MlflowClient(f"sqlite:///{db}").search_experiments()
            os.replace(db, template)
    return template


def fresh_mlflow_store(folder: Path) -> str:
    """A migrated, empty MLflow SQLite store at folder/mlflow.db; returns its URI.

    Creating MLflow's schema costs seconds per database, so it is done once per machine and MLflow version, and
    copied.
    """
    target = Path(folder) / "mlflow.db"
    shutil.copyfile(_template(), target)
    return f"sqlite:///{target}"
