"""The cluster presets conf/cluster/ray.yaml and conf/cluster/slurm.yaml.

Compose tests for both (the launcher each selects and the values it sets; with the launcher plugin missing,
composition fails naming the launcher). The Ray preset also runs for real: a 3-job sweep against a Ray head
started on loopback, inside a network and PID namespace of its own (`unshare`), so that nothing Ray starts
listens beyond 127.0.0.1 and every Ray process ends with the namespace. SLURM is composition only: there is
no SLURM cluster here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

from calibrun import config as calibrun_config
from calibrun.core.errors import CalibrunError
from tests.conftest import clean_env, extra_missing, installed, requires_extra, run_python
from tests.stores import fresh_mlflow_store

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = str(REPO / "conf")
RAY_PLUGIN = "hydra_plugins.hydra_ray_launcher"
needs_ray = requires_extra(RAY_PLUGIN, "ray")
needs_submitit = requires_extra("hydra_plugins.hydra_submitit_launcher", "slurm")
CALIBRATIONS = ("narrow", "match", "wide")


@pytest.fixture
def preset(monkeypatch):
    """compose(+cluster=NAME, ...) with the Hydra config, set as the current HydraConfig so that `${hydra:...}`
    resolves as it does in a job; Hydra and HydraConfig are cleared afterwards."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    calibrun_config.register()
    GlobalHydra.instance().clear()
    previous = HydraConfig.instance().cfg

    def make(name: str, *overrides: str):
        cfg = compose(config_name="config", overrides=[f"+cluster={name}", *overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        return cfg

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        yield make
    HydraConfig.instance().cfg = previous


def _common_values(cfg) -> None:
    """What both presets set: absolute sweep and cache folders (jobs run elsewhere), one onnxruntime thread,
    tracking on an MLflow server unless the command line says otherwise."""
    assert cfg.hydra.runtime.choices.cluster in {"ray", "slurm"}
    assert Path(cfg.hydra.sweep.dir).is_absolute()
    assert Path(cfg.hydra.sweep.dir).parent.parent == Path(os.getcwd()) / "multirun"
    assert cfg.cache.dir == str(Path(os.getcwd()) / ".calibrun-cache")
    assert cfg.ort.intra_op_threads == 1
    assert cfg.tracking.name == "server"
    assert cfg.tracking.uri is None


@needs_ray
def test_ray_preset_composes(preset):
    cfg = preset("ray")
    _common_values(cfg)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "ray"
    assert launcher.ray.init.address is None  # no RAY_ADDRESS: a Ray of this machine
    assert launcher.ray.init.object_store_memory is None  # ray.init refuses it when joining a cluster
    assert "num_cpus" not in launcher.ray.init  # likewise: resources are asked per job
    assert launcher.ray.remote.num_cpus == 1
    # tracking=local without a URI: the workers get the driver's store, absolute
    forwarded = launcher.ray.init.runtime_env.env_vars.MLFLOW_TRACKING_URI
    assert forwarded == f"sqlite:///{Path(os.getcwd()) / 'mlflow.db'}"


@needs_ray
def test_ray_preset_takes_the_address_and_tracking_from_the_environment(preset, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head.example:10001")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    cfg = preset("ray")
    assert cfg.hydra.launcher.ray.init.address == "ray://head.example:10001"
    assert cfg.hydra.launcher.ray.init.runtime_env.env_vars.MLFLOW_TRACKING_URI == "http://mlflow.example:5000"
    cfg = preset("ray", "hydra.launcher.ray.init.address=127.0.0.1:6380")
    assert cfg.hydra.launcher.ray.init.address == "127.0.0.1:6380"


@needs_submitit
def test_slurm_preset_composes(preset):
    cfg = preset("slurm")
    _common_values(cfg)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "submitit_slurm"
    assert launcher.partition is None
    assert launcher.timeout_min == 30
    assert launcher.cpus_per_task == 1 == cfg.ort.intra_op_threads
    assert launcher.mem_gb == 4
    assert launcher.nodes == 1
    assert launcher.tasks_per_node == 1
    assert launcher.array_parallelism == 64
    assert launcher.submitit_folder == f"{cfg.hydra.sweep.dir}/.submitit/%j"
    cfg = preset("slurm", "hydra.launcher.partition=cpu", "hydra.launcher.timeout_min=90")
    assert (cfg.hydra.launcher.partition, cfg.hydra.launcher.timeout_min) == ("cpu", 90)


class _Submitted(Exception):
    pass


@needs_submitit
def test_slurm_preset_becomes_this_sbatch_script(preset, tmp_path, monkeypatch):
    """The plugin's own launch() with the preset's values, up to the point of submission: submitit needs an
    `srun` on PATH to build a SLURM executor (a stub here) and the array is caught instead of submitted."""
    import submitit
    from hydra.utils import instantiate

    stub = tmp_path / "bin" / "srun"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    seen = {}

    def capture(executor, fn, *args):
        seen["jobs"] = len(args[0])
        seen["sbatch"] = executor._executor._make_submission_file_text("COMMAND", "UID")
        raise _Submitted

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", capture)
    cfg = preset("slurm", "hydra.launcher.partition=cpu", "hydra.launcher.account=lab")
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=lambda _: None, config=cfg)
    with pytest.raises(_Submitted):
        launcher.launch([[f"calibration={c}"] for c in CALIBRATIONS], initial_job_idx=0)
    assert seen["jobs"] == 3
    lines = set(seen["sbatch"].splitlines())
    folder = f"{cfg.hydra.sweep.dir}/.submitit/%j"
    for line in ("#SBATCH --partition=cpu", "#SBATCH --account=lab", "#SBATCH --time=30",
                 "#SBATCH --cpus-per-task=1", "#SBATCH --mem=4GB", "#SBATCH --nodes=1",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --job-name=calibrun",
                 f"#SBATCH --output={folder}/%j_0_log.out"):
        assert line in lines, seen["sbatch"]


@pytest.mark.parametrize("name", [
    pytest.param("ray", marks=needs_ray), pytest.param("slurm", marks=needs_submitit)])
def test_preset_tracking_needs_a_server_uri_unless_told_otherwise(preset, name):
    cfg = preset(name)
    with pytest.raises(CalibrunError, match=r"tracking\.uri"):
        calibrun_config.validate(cfg)
    calibrun_config.validate(preset(name, "tracking.uri=http://127.0.0.1:5000"))
    cfg = preset(name, "tracking=local")  # the command line wins over the preset
    assert cfg.tracking.name == "local"
    calibrun_config.validate(cfg)


@pytest.mark.parametrize(("name", "plugin", "launcher"), [
    ("ray", "hydra_plugins.hydra_ray_launcher", "ray"),
    ("slurm", "hydra_plugins.hydra_submitit_launcher", "submitit_slurm")])
@pytest.mark.slow
def test_preset_without_its_plugin_fails_naming_the_launcher(tmp_path, name, plugin, launcher):
    """The plugin made unimportable (as if not installed): the CLI stops at composition, before any job."""
    code = ("import runpy, sys\n"
            f"sys.modules[{plugin!r}] = None\n"
            f"sys.argv = ['calibrun', '+cluster={name}', '--cfg', 'hydra']\n"
            "runpy.run_module('calibrun', run_name='__main__')\n")
    proc = run_python(["-W", "ignore", "-c", code], tmp_path, timeout=120)
    assert proc.returncode == 1
    assert f"Could not find 'hydra/launcher/{launcher}'" in proc.stderr
    assert not (tmp_path / "multirun").exists()


@needs_submitit
def test_submitit_local_preset_composes(preset):
    cfg = preset("submitit_local")
    assert cfg.hydra.launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
    assert cfg.hydra.sweeper.max_batch_size == 2  # jobs at a time (submitit's local executor starts them all)
    assert cfg.hydra.launcher.cpus_per_task == 1 == cfg.ort.intra_op_threads
    assert Path(cfg.hydra.sweep.dir).is_absolute()
    assert cfg.cache.dir == str(Path(os.getcwd()) / ".calibrun-cache")
    assert cfg.tracking.name == "local"
    assert preset("submitit_local", "hydra.sweeper.max_batch_size=3").hydra.sweeper.max_batch_size == 3


@needs_submitit
@pytest.mark.slow
def test_submitit_local_runs_at_most_max_batch_size_jobs_at_a_time(tmp_path):
    store = fresh_mlflow_store(tmp_path)
    proc = run_python(["-m", "calibrun", "-m", "+cluster=submitit_local", "calibration=narrow,match,wide",
                       "batches=2", "eval.rows=32", "diagnostics=off"], tmp_path, clean_env(MLFLOW_TRACKING_URI=store),
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = tmp_path.glob("multirun/*/*")
    assert len(list(sweep.glob(".submitit/*/*_log.out"))) == 3  # run by submitit, in processes of their own
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store)
    parent = json.loads((sweep / "mlflow_parent.json").read_text())
    runs = client.search_runs([parent["experiment_id"]], max_results=100)
    assert {r.info.status for r in runs} == {"FINISHED"}
    spans = [(r.info.start_time, r.info.end_time) for r in runs if r.info.run_id != parent["run_id"]]
    assert len(spans) == 3
    at_once = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert at_once <= 2


@needs_submitit
@pytest.mark.slow
def test_slurm_preset_without_slurm_is_one_line_and_records_nothing(tmp_path):
    path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())
    if shutil.which("srun", path=path) or shutil.which("sbatch", path=path):
        pytest.skip("SLURM is installed here")
    store = tmp_path / "mlflow.db"
    proc = run_python(["-m", "calibrun", "-m", "+cluster=slurm", "tracking=local", "calibration=narrow,match"],
                      tmp_path, clean_env(PATH=path, MLFLOW_TRACKING_URI=f"sqlite:///{store}"), timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == ["calibrun: error: hydra/launcher=submitit_slurm: srun and sbatch not found on PATH: run the "
                     "sweep on a SLURM login node, or use +cluster=submitit_local to run its jobs on this machine"]
    assert not list(tmp_path.glob("multirun/*/*"))  # no sweep folder
    assert not store.exists()  # no store, no parent run


# --------------------------------------------------------------------------------------------- Ray, for real

# Runs as PID 1 of its own PID namespace: every process it starts ends with it. The head is docs/scaling.md's
# local recipe (the node and every port on 127.0.0.1, no dashboard); the namespace holds only loopback, so that a
# port the recipe failed to keep there shows up as 0.0.0.0 in `ss` without reaching any network. The head starts in
# another folder and without the driver's MLFLOW_TRACKING_URI, as on a real cluster where the workers share neither.
RAY_SCRIPT = r"""
set -u
"$IP" link set lo up
ray="$1"; shift
(cd "$RAY_TMP" && env -u MLFLOW_TRACKING_URI "$ray" start --head --node-ip-address=127.0.0.1 --port=6379 \
    --include-dashboard=false --num-cpus=2 --disable-usage-stats --temp-dir="$RAY_TMP" > "$LOGS/head.log" 2>&1) \
    || exit 90
"$@" > "$LOGS/sweep.out" 2> "$LOGS/sweep.err"
rc=$?
"$SS" -ltnH > "$LOGS/listening.txt" 2>&1
"$ray" stop --force > "$LOGS/stop.log" 2>&1
exit $rc
"""


SYSTEM_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
TOOLS = {name: shutil.which(name, path=SYSTEM_PATH) for name in ("unshare", "ip", "ss")}


def _isolation_problem() -> str | None:
    """Why a loopback-only network namespace cannot be made here (None when it can)."""
    missing = [name for name, path in TOOLS.items() if path is None]
    if missing:
        return f"needs {', '.join(missing)} (util-linux, iproute2)"
    probe = subprocess.run([TOOLS["unshare"], "--net", "--pid", "--fork", "--mount-proc", TOOLS["ip"], "link", "set",
                            "lo", "up"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"cannot make a network namespace (needs root): {probe.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="module")
def ray_sweep(tmp_path_factory):
    if not installed(RAY_PLUGIN):
        pytest.skip(extra_missing("ray"))
    problem = _isolation_problem()
    if problem:
        pytest.skip(f"a Ray head here must listen on loopback only: {problem}")
    ray = Path(sys.executable).parent / "ray"
    assert ray.is_file(), f"the ray command is not beside {sys.executable}"
    tmp = tmp_path_factory.mktemp("ray")
    cwd, logs = tmp / "cwd", tmp / "logs"
    cwd.mkdir()
    logs.mkdir()
    store = tmp / "mlflow.db"
    fresh_mlflow_store(tmp)  # migrated already (MLflow's schema costs seconds per new store)
    # Ray's socket paths must stay short (AF_UNIX): its temp dir goes straight under /tmp
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "RAY_ADDRESS"}}
    # HOME of its own: Ray 2.60 keeps a token in ~/.ray/auth_token (any local ray.init writes one), and a head
    # started while one is there turns token authentication on, which the driver is then refused by
    home = tmp / "home"
    home.mkdir()
    env.update({"HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMP": ray_tmp, "LOGS": str(logs),
                "IP": TOOLS["ip"],
                "SS": TOOLS["ss"], "MLFLOW_TRACKING_URI": f"sqlite:///{store}"})  # the driver's only: see RAY_SCRIPT
    sweep = [sys.executable, "-m", "calibrun", "-m", "+cluster=ray", "calibration=" + ",".join(CALIBRATIONS),
             "hydra.launcher.ray.init.address=127.0.0.1:6379", "tracking=local"]
    try:
        proc = subprocess.run([TOOLS["unshare"], "--net", "--pid", "--fork", "--mount-proc", "--kill-child",
                               "bash", "-c", RAY_SCRIPT, "ray-sweep", str(ray), *sweep],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=480)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    text = {p.name: p.read_text(errors="replace") for p in logs.iterdir()}
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stderr[-2000:]}\n" + "\n".join(
        f"--- {name}\n{body[-3000:]}" for name, body in sorted(text.items()))
    sweeps = sorted(cwd.glob("multirun/*/*"))
    assert len(sweeps) == 1, sweeps
    return sweeps[0], store, text


@pytest.mark.slow
def test_ray_head_listened_on_loopback_only(ray_sweep):
    _, _, text = ray_sweep
    addresses = [line.split()[3] for line in text["listening.txt"].splitlines() if line.strip()]
    assert addresses, text["listening.txt"]
    assert all(a.rsplit(":", 1)[0] in {"127.0.0.1", "[::ffff:127.0.0.1]", "[::1]"} for a in addresses), addresses


@pytest.mark.slow
def test_ray_ran_the_three_jobs_on_workers(ray_sweep):
    sweep, _, text = ray_sweep
    assert "Connecting to existing Ray cluster at address: 127.0.0.1:6379" in text["sweep.err"]
    assert "(_run_job pid=" in text["sweep.err"]  # job logs come back from Ray worker processes
    results = {}
    for num in range(3):
        result = json.loads((sweep / str(num) / "result.json").read_text())
        assert result["status"] == "ok", result
        results[result["params"]["calibration"]] = result
    assert set(results) == set(CALIBRATIONS)
    assert all(r["params"]["batches"] == 64 for r in results.values())
    cache = sweep.parents[2] / ".calibrun-cache"  # the preset's absolute cache folder, in the driver's cwd
    assert len(list((cache / "ranges").glob("*.key.json"))) == 3


@pytest.mark.slow
def test_ray_sweep_report_was_built(ray_sweep):
    sweep, _, _ = ray_sweep
    report = json.loads((sweep / "report" / "calib_report.json").read_text())
    assert {"narrow", "match", "wide", "best"} <= set(report)
    assert report["best"] == "match"
    assert report["clipping_worse_than_coarse"] is True
    assert (sweep / "report" / "report.md").is_file()


@pytest.mark.slow
def test_ray_jobs_are_children_of_the_sweep_run(ray_sweep):
    from mlflow import MlflowClient

    sweep, store, _ = ray_sweep
    parent = json.loads((sweep / "mlflow_parent.json").read_text())
    assert parent["tracking_uri"] == f"sqlite:///{store}"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    runs = client.search_runs([parent["experiment_id"]], max_results=100)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent["run_id"]]
    assert sorted(r.data.params["calibration.name"] for r in children) == sorted(CALIBRATIONS)
    assert all(r.info.status == "FINISHED" for r in children)
    assert client.get_run(parent["run_id"]).info.status == "FINISHED"
