"""What a config can do to a run (issue 27 items 6 and 7): a resolver given a wrong argument in an output folder is
one line, an output name MLflow rejects as a metric key is mapped to a valid key (the name kept in a tag), and a
`hydra.callbacks` entry calibrun does not know is refused before Hydra instantiates it (from the command line or a
`--config-dir` preset) unless the user allows it. Real `python -m calibrun` processes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import onnx
import pytest

from tests.conftest import clean_env, run_python
from tests.e2e.faults.record import env_for, one_line_error, runs_of
from tests.stores import fresh_mlflow_store

pytestmark = pytest.mark.slow

QUICK = ("batches=2", "eval.rows=32", "diagnostics=off")


def calibrun(tmp: Path, *args: str, env: dict | None = None):
    return run_python(["-m", "calibrun", *args, f"cache.dir={tmp / 'cache'}"], tmp, env or env_for(tmp), timeout=240)


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_resolver_with_an_argument_in_the_output_folder_is_one_line(tmp_path, key):
    proc = calibrun(tmp_path, *(["-m"] if key == "hydra.sweep.dir" else []), f"{key}=${{calibrun.sweep_id:x}}",
                    "tracking=off")
    line = one_line_error(proc)
    assert proc.returncode == 1
    assert line == (f"calibrun: error: config {key}: ValueError raised while resolving interpolation: "
                    "${calibrun.sweep_id:} takes no argument, got 'x'")
    assert not (tmp_path / "cache").exists()  # nothing ran


def test_output_name_mlflow_rejects_as_a_key_is_mapped_and_kept_in_a_tag(tmp_path):
    """The lab model with its output named `a/../b` (MLflow: a key must not be a path leading elsewhere)."""
    from calibrun.lab.model import write_lab_model

    model = onnx.load(str(write_lab_model(tmp_path / "lab.onnx")))
    old = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = ["a/../b" if o == old else o for o in node.output]
    model.graph.output[0].name = "a/../b"
    onnx.save(model, str(tmp_path / "weird.onnx"))
    fresh_mlflow_store(tmp_path)
    proc = calibrun(tmp_path, "model=file", f"model.path={tmp_path / 'weird.onnx'}", *QUICK,
                    f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [run] = runs_of(tmp_path)
    assert run.info.status == "FINISHED"
    keys = [k for k in run.data.metrics if k.startswith("out.") and k.endswith(".max_abs_error")]
    assert len(keys) == 1, sorted(run.data.metrics)
    key = keys[0][len("out."):-len(".max_abs_error")]
    assert "/" not in key
    assert run.data.tags[f"calibrun.output.{key}"] == "a/../b"


def evil_preset(tmp: Path) -> Path:
    folder = tmp / "confs" / "experiment"
    folder.mkdir(parents=True)
    (folder / "evil.yaml").write_text(textwrap.dedent(f"""\
        # @package _global_
        hydra:
          callbacks:
            evil:
              _target_: builtins.open
              file: {tmp / 'PWNED'}
              mode: w
        """))
    return tmp / "confs"


def test_unknown_callback_is_refused_before_it_runs(tmp_path):
    """From the command line and from a --config-dir preset: one line, nothing executed, nothing written."""
    cli = calibrun(tmp_path, "+hydra.callbacks.x._target_=builtins.open", f"+hydra.callbacks.x.file={tmp_path}/PWNED",
                   "+hydra.callbacks.x.mode=w", "tracking=off")
    preset = calibrun(tmp_path, "--config-dir", str(evil_preset(tmp_path)), "experiment=evil", "tracking=off")
    for proc, name in ((cli, "x"), (preset, "evil")):
        line = one_line_error(proc)
        assert proc.returncode == 1
        assert line == (f"calibrun: error: hydra.callbacks.{name}: 'builtins.open' is not a callback calibrun knows, "
                        "and a config can run any code through one; to run it, allow it: "
                        "CALIBRUN_ALLOW_CALLBACKS=builtins.open")
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "outputs").exists()


def test_a_callback_the_user_allows_runs(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_callback.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        from hydra.experimental.callback import Callback

        class Marker(Callback):
            def __init__(self, path):
                self.path = Path(path)

            def on_run_end(self, config, **kwargs):
                self.path.write_text("ran")
        """))
    args = ("calibration=narrow", *QUICK, "tracking=off", "+hydra.callbacks.mine._target_=my_callback.Marker",
            f"+hydra.callbacks.mine.path={tmp_path / 'MARK'}", f"hydra.run.dir={tmp_path / 'run'}")
    refused = calibrun(tmp_path, *args, env=clean_env(PYTHONPATH=str(tmp_path / "mine")))
    assert refused.returncode == 1
    allowed = calibrun(tmp_path, *args, env=clean_env(PYTHONPATH=str(tmp_path / "mine"),
                                                      CALIBRUN_ALLOW_CALLBACKS="my_callback.Marker"))
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert (tmp_path / "MARK").read_text() == "ran"
    assert (tmp_path / "run" / "result.json").is_file()
