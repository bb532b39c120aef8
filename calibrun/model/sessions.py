"""Every onnxruntime session calibrun opens comes from `session()`: one place for the options calibrun sets and
for the one-line error when onnxruntime cannot load a model. (onnxruntime's calibrators open their own; calibrun
replaces that one, calibrun.quant.calibrate.) `ReusedOutputs` runs a session that returns many large outputs
(the histogram calibration's, the per-tensor diagnostics') into the same arrays run after run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from calibrun.core.errors import CalibrunError, one_line

log = logging.getLogger(__name__)

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


class ReusedOutputs:
    """A session as onnxruntime's `collect_data` uses it (`run(None, feeds)`, `get_inputs`, `get_outputs`), writing
    the outputs of every run into the same arrays instead of fresh ones (onnxruntime's IOBinding): the histogram
    calibration's augmented session (calibrun.quant.calibrate) and the per-tensor diagnostics' one-pass sessions
    (calibrun.measure.tensor_stats), whose hundreds of outputs are otherwise fresh pages every run. The values are
    the same (onnxruntime computes them alike; only where they land differs).

    `sets` buffer sets are used in turn (`rewind()` goes back to the first, `single()` keeps only it): onnxruntime's
    histogram `collect_data` holds every output of a chunk until the chunk ends, so a chunk of n batches needs n
    sets; the diagnostics take a run's statistics while the next run computes, two sets. The
    first batch of a set (and a batch whose input shapes differ from the set's last) runs `session.run`, and its
    outputs become the set's buffers (IOBinding onto their memory); later batches run `run_with_iobinding` into
    them. An output that is also a graph input is not bound: onnxruntime hands back the input there and leaves a
    bound buffer untouched, so the input itself is returned, as `run` does. If a bound run fails (an output whose
    shape depends on the data, not only on the input shapes), this and every later batch run `session.run`.
    A set's arrays are valid until that set is run again: a caller that keeps values beyond that copies them.
    """

    def __init__(self, session, sets: int = 1):
        self.session, self.sets, self.slot = session, sets, 0
        self.input_names = {node.name for node in session.get_inputs()}
        self.output_names = [node.name for node in session.get_outputs()]
        self.held: list = [None] * sets  # per set: (input shapes and types, IOBinding, output arrays)
        self.reuse = True
        import onnxruntime

        self.quiet = onnxruntime.RunOptions()
        self.quiet.log_severity_level = 4  # a failed bound run is retried with run(): no error line for it

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def rewind(self) -> None:
        self.slot = 0

    def release(self) -> None:
        """Drop the buffers (the threshold search does not need them)."""
        self.held = [None] * self.sets

    def single(self) -> None:
        """The next run goes to the first set and the others' buffers go: one set held, where two would not fit
        the memory a caller allows."""
        self.slot = 0
        self.held[1:] = [None] * (self.sets - 1)

    def run(self, output_names, input_feed, run_options=None):
        if output_names is not None or run_options is not None or not self.reuse:
            return self.session.run(output_names, input_feed, run_options)
        slot = self.slot
        self.slot = (slot + 1) % self.sets
        feeds = {name: np.ascontiguousarray(value) for name, value in input_feed.items()}
        key = sorted((name, value.shape, value.dtype.str) for name, value in feeds.items())
        held = self.held[slot]
        if held is None or held[0] != key:
            self.held[slot] = None  # the old buffers go before the new outputs are allocated
            outputs = self.session.run(None, feeds)
            if not all(isinstance(a, np.ndarray) and a.dtype.kind in "fiub" for a in outputs):
                self.reuse = False  # sequences, maps or strings among the outputs: nothing to bind
                return outputs
            binding = self.session.io_binding()
            for name, array in zip(self.output_names, outputs, strict=True):
                if name not in self.input_names:
                    binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
            self.held[slot] = (key, binding, outputs)
            return list(outputs)
        _, binding, outputs = held
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        try:
            self.session.run_with_iobinding(binding, self.quiet)
        except Exception as exc:  # noqa: BLE001 (a real failure is raised again by run(), with its own message)
            log.debug("reusing output buffers failed (%s); fresh outputs from now on", exc)
            self.reuse, self.held = False, [None] * self.sets
            return self.session.run(None, input_feed)
        binding.clear_binding_inputs()  # no reference to this batch's input beyond the run
        return [feeds[name] if name in self.input_names else array
                for name, array in zip(self.output_names, outputs, strict=True)]
