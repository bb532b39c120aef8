"""Every onnxruntime session calibrun opens comes from `session()`: one place for the options calibrun sets and
for the one-line error when onnxruntime cannot load a model. (onnxruntime's calibrators open their own; calibrun
replaces that one, calibrun.quant.calibrate.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from calibrun.core.errors import CalibrunError, one_line

CPU = ("CPUExecutionProvider",)
LEVELS = ("all", "basic", "none")  # onnxruntime's graph optimisation: its default, constant folding only, none


def no_spinning(options) -> None:
    """onnxruntime's intra-op threads wait for work by spinning (allow_spinning=1, its default): between the many short
    runs of a job they burn their cores, and every other process on the machine (a parallel job, a second sweep)
    gets less. calibrun's sessions let them sleep instead (`session.intra_op.allow_spinning=0`; results unchanged).
    Measured on 2 cores beside other work: the lab sweep (24 jobs, untracked) 8.9 -> 7.2 CPU s; one det_yolox job
    7.4 -> 5.9 s wall."""
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")


def session(path: str | Path, intra_op_threads: int = 0, *, optimize: bool | str = True, arena: bool = True,
            mem_pattern: bool = False, priority_order: bool = False, log_level: int = 4,
            save_optimized: Path | None = None, config: dict[str, str] | None = None,
            disabled_optimizers: Sequence[str] = (), providers: Sequence[str] = CPU, shown: str | None = None,
            failed: Callable[[BaseException], str] | None = None):
    """An onnxruntime session with a clear error when it cannot be loaded: `failed(exc)` when given, else
    "onnxruntime cannot load <shown or path>: <reason>".

    `optimize`: True (onnxruntime's default, every optimisation), "basic" (constant folding and the like), False
    (none: QDQ pairs stay unfused, as qdq_loss_debug runs them). `arena=False`: plain allocations returned after
    each run (sessions with hundreds of extra outputs: the arena fragments and grows over runs). onnxruntime's
    memory pattern is off by default: it adds a second, planned block after the first run (ocr_det, 16 rows of
    320x320: 594 -> 962 MB on the second run); without it memory stays flat over the runs (594 -> 645 MB), same
    numbers. `priority_order`: onnxruntime's priority-based execution order (frees activations as soon as their
    readers ran). `save_optimized`: write the optimised model there (`config` adds session config entries, e.g.
    where its external initializers go). Intra-op threads never spin (`no_spinning`).
    `log_level` 4 (fatal only): onnxruntime's own error lines are not printed, every failure is raised and
    calibrun reports it once, in one line (a model that fails on two rows printed a red line of onnxruntime's
    before the job ran it one row at a time and ended ok).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    level = {True: "all", False: "none"}.get(optimize, optimize)
    if level not in LEVELS:
        raise ValueError(f"optimize={optimize!r}")
    if level != "all":
        options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if level == "basic"
                                            else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if priority_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if save_optimized is not None:
        options.optimized_model_filepath = str(save_optimized)
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    options.intra_op_num_threads = intra_op_threads
    no_spinning(options)
    options.log_severity_level = log_level
    options.enable_cpu_mem_arena = arena
    options.enable_mem_pattern = mem_pattern
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=list(providers),
                                    disabled_optimizers=list(disabled_optimizers) or None)
    except Exception as exc:
        message = failed(exc) if failed is not None else f"onnxruntime cannot load {shown or path}: {one_line(exc)}"
        raise CalibrunError(message) from exc
