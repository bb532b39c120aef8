"""Shared fixtures: the lab model in tmp_path, and a calibtool runner that works from another folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CALIBTOOL = REPO / "calibtool.py"


@pytest.fixture
def lab_model(tmp_path: Path) -> Path:
    """The lab model written by calibrun.model.write_lab_model into tmp_path/models/lab.onnx."""
    from calibrun.model import write_lab_model

    folder = tmp_path / "models"
    folder.mkdir(exist_ok=True)
    return write_lab_model(folder / "lab.onnx")


def run_calibtool(args, cwd: Path, cache: Path | str, timeout: float = 300) -> tuple[int, str, str]:
    """`python calibtool.py ARGS` from `cwd`, CALIBRUN_CACHE=cache -> (returncode, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in {"CALIBRUN_DEBUG", "PYTHONPATH"}}
    env["CALIBRUN_CACHE"] = str(cache)
    proc = subprocess.run(
        [sys.executable, str(CALIBTOOL), *[str(a) for a in args]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty working directory that is not the repository."""
    folder = tmp_path / "cwd"
    folder.mkdir(exist_ok=True)
    assert folder.resolve() != REPO
    return folder


@pytest.fixture
def calibtool(tmp_path: Path, workdir: Path):
    """A runner for calibtool.py as a subprocess from `workdir`, cache in tmp_path/cache.

    `calibtool("scales", path)` -> (returncode, stdout, stderr).
    """
    cache = tmp_path / "cache"

    def run(*args, cwd: Path | None = None) -> tuple[int, str, str]:
        return run_calibtool(args, cwd or workdir, cache)

    run.cwd = workdir
    run.cache = cache
    return run

