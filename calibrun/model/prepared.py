"""A user's float model, prepared once per source file (calibrun.model.prepare) and kept in the cache's `models`
folder (calibrun.quant.cache), so that a sweep of many jobs, or calibtool run after run, shares one prepared copy.
The Hydra runner (calibrun.job.prepare) and calibtool's `quantize` both take their model from here: the same file
gives the same prepared model, so the same int8 model, whichever of the two quantises it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import onnxruntime

from calibrun.core.errors import one_line
from calibrun.core.files import temp_dir, write_json
from calibrun.model import FloatModel, file_sha256, model_sha256, open_float_model
from calibrun.model.prepare import PREPARE_VERSION, external_data_path, prepare_model
from calibrun.quant import cache as cache_store

log = logging.getLogger("calibrun")


def prepared_record(source_sha256: str) -> dict:
    """What decides a prepared model (its cache key, calibrun.quant.cache.key_of): the source's model_sha256 (its
    file and its external data files), calibrun's preparation and onnxruntime's versions."""
    return {"kind": "prepared model", "source_sha256": source_sha256, "prepare_version": PREPARE_VERSION,
            "onnxruntime": onnxruntime.__version__}


@contextlib.contextmanager
def prepared_source(fp32: FloatModel, cache=None) -> Iterator[FloatModel]:
    """calibtool's float model: `fp32`, the file as the user gives it (opened: open_float_model), prepared as the
    runner prepares it (below), in the cache's `models` folder (`cache`: a CalibrationCache), else in a temp folder
    removed when the block ends. An opset onnxruntime no longer runs is converted there, as in a job, instead of
    refused."""
    with temp_dir("src") if cache is None else contextlib.nullcontext() as tmp:
        root, wait = (cache.root, cache.wait) if cache is not None else (None, 0.0)
        prepared, steps = prepared_model(fp32.path, root, wait, Path(tmp) if tmp else None)
        for step in steps:
            log.info("prepared %s: %s", fp32.path.name, step)
        yield prepared


def prepared_model(source: Path, cache_root: str | Path | None, wait: float,
                   folder: Path | None) -> tuple[FloatModel, list[str]]:
    """The prepared float model of `source` and its preparation steps (one human line each).

    With a cache (`cache_root`) it is prepared once into `<cache_root>/models/<key>.onnx`; a cached copy is used
    only when its bytes (and its external data file's) still have the sha256 recorded beside it when it was made; a
    truncated or replaced one is reported in one warning line and prepared again. One process prepares a model at
    a time; the others wait for it (at most `wait` seconds), then reuse its file. Without a cache, into
    `folder/fp32.onnx` (`folder` is needed only then).
    """
    if cache_root is None:
        if folder is None:
            raise ValueError("prepared_model: without a cache, a folder to prepare the model into")
        target = folder / "fp32.onnx"
    else:
        models = cache_store.folder(cache_root, "models", create=True)
        sha256 = model_sha256(source)  # its data files too: a model retrained in place keeps its .onnx bytes
        target = models / f"{cache_store.key_of(prepared_record(sha256))}.onnx"
        old = models / f"{sha256[:32]}-prep{PREPARE_VERSION}-ort{onnxruntime.__version__}.onnx"
        if old.is_file() and not target.is_file():
            log.info("prepared model cache: %s is of the earlier naming and is not read; preparing the "
                     "model again as %s", old, target.name)
    record_file = target.with_suffix(".steps.json")
    cached = cache_root is not None
    with (cache_store.claim(target.with_suffix(".lock"), wait, f"preparing {source}") if cached
          else contextlib.nullcontext()):
        if cached and target.is_file():
            reused = _verified(target, record_file)
            if reused is not None:
                log.info("prepared model %s (reused, sha256 verified)", target)
                return replace(open_float_model(target, sha256=reused["model_sha256"]), source=source), \
                    list(reused["steps"])
        prepared = prepare_model(source, target)
        file_sha = file_sha256(prepared.path)  # with its weights inline, that is the model's whole identity
        data_sha: dict[Path, str] = {}  # its data file's, hashed once for both entries

        def hashed(data: Path) -> str:
            key = Path(data).resolve()
            if key not in data_sha:
                data_sha[key] = file_sha256(key)
            return data_sha[key]

        record = {"steps": list(prepared.steps),
                  "model_sha256": model_sha256(prepared.path, hashed) if prepared.data_path else file_sha,
                  "file_sha256": file_sha,
                  "data_sha256": hashed(Path(prepared.data_path)) if prepared.data_path else None}
        write_json(record_file, record)
    return replace(open_float_model(prepared.path, sha256=record["model_sha256"]), source=source), list(prepared.steps)


def _verified(target: Path, record_file: Path) -> dict | None:
    """The record of a cached prepared model whose files still match it; None (with one warning line when
    something is wrong rather than merely missing) when it must be prepared again."""
    problem = None
    try:
        record = json.loads(record_file.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("model_sha256"), str) \
                or not isinstance(record.get("file_sha256"), str):
            problem = "it has no recorded sha256"
        elif file_sha256(target) != record["file_sha256"]:
            problem = "its bytes do not match the sha256 recorded when it was made (truncated or replaced?)"
        else:
            data = external_data_path(target)
            want = record.get("data_sha256")
            if want is not None and (not data.is_file() or file_sha256(data) != want):
                problem = f"its data file {data.name} is missing or does not match its recorded sha256"
            elif not isinstance(record.get("steps"), list):
                problem = "its record has no preparation steps"
    except FileNotFoundError:
        # No record yet: another job may have just placed the model and be hashing it (a parallel sweep on a
        # fresh cache). Preparing again gives the same bytes; nothing is wrong, so no warning.
        log.info("prepared model %s has no sha256 record beside it (yet); preparing it again", target)
        return None
    except (OSError, ValueError) as exc:
        problem = f"its record is unreadable ({one_line(exc)})"
    if problem is None:
        return record
    log.warning("prepared model cache %s is unusable: %s; preparing it again", target, problem)
    return None
