"""A recurrent state fed back in the evaluation (`eval_data.inputs.<name>.from_output`, docs/data.md).

A stateful model (a VAD, a noise suppressor, a streaming recogniser) takes back an output as an input on its next
call. Fed the state its data recorded (the fp32 stream's), each row measures one call; an error the int8 model makes
in its state never reaches a later row. With the state fed back, the rows run in order, one at a time, and each
model (fp32, int8, every candidate the analysis measures) feeds the state input its own output of the previous row:
the first row takes the state its data holds, every later one the model's own. What the measurement then sees is
what streaming the int8 model does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from calibrun.core.errors import CalibrunError
from calibrun.data.inputs import fmt_shape, is_float
from calibrun.data.rows import is_fixed


def output_indices(state: Mapping[str, str], output_names: Sequence[str]) -> dict[str, int]:
    """{state input: the index of the output it takes back} (`state`: EvalData.state, input -> output name)."""
    return {name: list(output_names).index(output) for name, output in state.items()}


def streamed(state: Mapping[str, str]) -> tuple[str, ...]:
    """The outputs fed back (`state`: EvalData.state, input -> output) as their metric keys name them: what the
    worst-output verdict reads through the other outputs (calibrun.measure.verdict.rule_for)."""
    from calibrun.measure.errors import metric_key

    return tuple(metric_key(output) for output in state.values())


def rows_per_run(state: Mapping[str, str], pinned: int | None) -> int:
    """The rows a run holds when a state is fed back: one (the next row needs this one's state)."""
    if state and pinned is not None and pinned != 1:
        name = next(iter(state))
        raise CalibrunError(f"config eval_data.inputs.{name}.from_output: the rows run one at a time, in order, but "
                            f"the model pins its batch at {pinned} rows")
    return 1


class Carried:
    """One model's state over the evaluation rows in order: `feeds(part)` is the run's feeds with each state input
    replaced by the model's own output of the previous run (`took(outputs)` records it); the first run keeps its
    data's state. `pairs`: output_indices."""

    def __init__(self, pairs: Mapping[str, int], output_names: Sequence[str]):
        self.pairs = dict(pairs)
        self.output_names = list(output_names)
        self.last: dict[str, np.ndarray] | None = None

    def feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self.last:
            return dict(feeds)
        for name, value in self.last.items():
            want = feeds[name]
            if value.shape != want.shape or value.dtype != want.dtype:
                output = self.output_names[self.pairs[name]]
                raise CalibrunError(f"config eval_data.inputs.{name}.from_output: output {output!r} gives "
                                    f"{value.dtype} {fmt_shape(value.shape)} on a row, input {name!r} takes "
                                    f"{want.dtype} {fmt_shape(want.shape)}")
        return {**feeds, **self.last}

    def took(self, outputs: Sequence[np.ndarray]) -> None:
        if self.pairs:
            self.last = {name: np.asarray(outputs[index]) for name, index in self.pairs.items()}


def look_alike(inputs: Sequence, outputs: Sequence) -> list[tuple[str, str]]:
    """(input, output) pairs where a float input other than the primary one (calibrun.model.primary) has an output's
    element type, rank and sizes (an axis free on either side fits any size): what a recurrent state looks like.
    Each output pairs once, the closest pairs first over every input (not input by input: a pair taken early by a
    lesser match would push the next input to a wrong one): one of the same sizes, free axes alike, then the one whose
    name shares the longest run of characters with the input's, then the longest start (`h` -> `hn`; Robust Video
    Matting's `r1i` -> `r1o`, not its first output `fgr`, which every free axis fits too; DeepFilterNet's
    `analysis_mem` -> `new_analysis_mem`, which shares no start with it: by start alone it had taken the audio frame
    out, and each state after it the next one's output). A hint only: nothing in a graph says that the caller feeds
    the output back."""
    from difflib import SequenceMatcher

    from calibrun.model import primary

    def shared(a: str, b: str) -> int:  # the longest run of characters both names hold
        return SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b)).size

    first = primary(inputs).name if inputs else None
    shapes = {}
    for output in outputs:
        tensor = output.type.tensor_type
        if tensor.HasField("shape"):
            shapes[output.name] = (tensor.elem_type, [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                                                      else None for d in tensor.shape.dim])
    fits = []
    for i, info in enumerate(inputs):
        if info.name == first or not info.has_shape or not info.shape or not is_float(info):
            continue
        sizes = [d if is_fixed(d) else None for d in info.shape]
        fits += [(dims != sizes, -shared(name, info.name), -len(os.path.commonprefix([name, info.name])), i, k,
                  info.name, name)
                 for k, (name, (elem, dims)) in enumerate(shapes.items())
                 if elem == info.elem_type and len(dims) == len(sizes)
                 and all(a is None or b is None or a == b for a, b in zip(dims, sizes, strict=True))]
    paired: dict[int, tuple[str, str]] = {}
    used: set[str] = set()
    for *_, i, _k, name, output in sorted(fits):
        if i not in paired and output not in used:
            paired[i] = (name, output)
            used.add(output)
    return [paired[i] for i in sorted(paired)]
