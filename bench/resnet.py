"""A ResNet-50-class conv net built with `onnx.helper`, for the calibration benchmark.

    python bench/resnet.py OUT.onnx                 # the full ResNet-50 shape (~100 MB)
    python bench/resnet.py OUT.onnx --quick         # a small variant for smoke tests

Layer shapes are ResNet-50 v1.5's: 7x7/2 stem conv 64 + Relu + 3x3/2 MaxPool, bottleneck stages
[3, 4, 6, 3] with widths 64/128/256/512 and expansion 4 (stride on the 3x3 conv), a projection shortcut
(1x1 conv) on the first block of each stage, Add + Relu, GlobalAveragePool, Flatten, Gemm 2048 -> 1000.
BatchNormalization is folded into the convs (each conv has a bias), as an inference export would have it.
Weights are random (fixed numpy seed), He-scaled; the last conv of each residual branch is scaled down
so the residual stream stays O(1) over 16 blocks. Input `x` is `[N, 3, H, W]` float32 with a symbolic N.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from _common import CACHE_DIR, write_model
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
INPUT = "x"
OUTPUT = "logits"
GENERATOR_VERSION = 1  # bump when the graph or the weights change, so cached files are rebuilt


@dataclass(frozen=True)
class ResNetConfig:
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    stem: int = 64
    expansion: int = 4
    image: int = 224
    classes: int = 1000
    seed: int = 0
    branch_scale: float = 0.3  # multiplies the He scale of each branch's last conv

    def tag(self) -> str:
        blocks = "".join(str(b) for b in self.blocks)
        return (f"resnet-v{GENERATOR_VERSION}-b{blocks}-w{self.widths[0]}-s{self.stem}-e{self.expansion}"
                f"-i{self.image}-c{self.classes}-seed{self.seed}")


RESNET50 = ResNetConfig()
# Quick: same topology kinds (stem, pool, projection + identity bottlenecks, GAP, Gemm), small and fast.
QUICK = ResNetConfig(blocks=(1, 2, 1, 1), widths=(8, 16, 32, 64), stem=8, image=64, classes=100)


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def conv(self, x: str, cin: int, cout: int, kernel: int, stride: int, prefix: str, scale: float = 1.0) -> str:
        """Conv with folded BN: He-normal weights, small bias."""
        fan_in = cin * kernel * kernel
        w = (self.rng.standard_normal((cout, cin, kernel, kernel), dtype=np.float32)
             * np.float32(scale * np.sqrt(2.0 / fan_in)))
        b = (self.rng.standard_normal(cout, dtype=np.float32) * np.float32(0.05)).astype(np.float32)
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(w, f"{name}.weight"))
        self.inits.append(numpy_helper.from_array(b, f"{name}.bias"))
        pad = kernel // 2
        self.nodes.append(helper.make_node(
            "Conv", [x, f"{name}.weight", f"{name}.bias"], [f"{name}.out"], name=name,
            kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4,
        ))
        return f"{name}.out"

    def op(self, op_type: str, inputs: list[str], prefix: str, **attrs) -> str:
        name = self.name(prefix)
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}.out"], name=name, **attrs))
        return f"{name}.out"

    def bottleneck(self, x: str, cin: int, width: int, stride: int, expansion: int, branch_scale: float,
                   prefix: str) -> str:
        cout = width * expansion
        h = self.op("Relu", [self.conv(x, cin, width, 1, 1, f"{prefix}_conv1")], f"{prefix}_relu1")
        h = self.op("Relu", [self.conv(h, width, width, 3, stride, f"{prefix}_conv2")], f"{prefix}_relu2")
        h = self.conv(h, width, cout, 1, 1, f"{prefix}_conv3", scale=branch_scale)
        shortcut = x
        if stride != 1 or cin != cout:
            shortcut = self.conv(x, cin, cout, 1, stride, f"{prefix}_proj", scale=branch_scale)
        return self.op("Relu", [self.op("Add", [h, shortcut], f"{prefix}_add")], f"{prefix}_out")


def build_resnet(config: ResNetConfig = RESNET50) -> onnx.ModelProto:
    b = _Builder(config.seed)
    h = b.op("Relu", [b.conv(INPUT, 3, config.stem, 7, 2, "stem_conv")], "stem_relu")
    h = b.op("MaxPool", [h], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = config.stem
    for stage, (count, width) in enumerate(zip(config.blocks, config.widths, strict=True), start=1):
        for block in range(count):
            stride = 2 if (block == 0 and stage > 1) else 1
            h = b.bottleneck(h, cin, width, stride, config.expansion, config.branch_scale,
                             f"layer{stage}_{block}")
            cin = width * config.expansion
    h = b.op("GlobalAveragePool", [h], "gap")
    h = b.op("Flatten", [h], "flatten", axis=1)
    fc_w = (b.rng.standard_normal((config.classes, cin), dtype=np.float32)
            * np.float32(np.sqrt(1.0 / cin)))
    fc_b = np.zeros(config.classes, np.float32)
    b.inits += [numpy_helper.from_array(fc_w, "fc.weight"), numpy_helper.from_array(fc_b, "fc.bias")]
    b.nodes.append(helper.make_node("Gemm", [h, "fc.weight", "fc.bias"], [OUTPUT], name="fc", transB=1))
    graph = helper.make_graph(
        b.nodes,
        "bench_resnet",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 3, config.image, config.image])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["N", config.classes])],
        initializer=b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="calibrun-bench")
    model.ir_version = 8
    model.doc_string = repr(asdict(config))
    onnx.checker.check_model(model, full_check=True)
    return model


def write_resnet(path: str | Path, config: ResNetConfig = RESNET50) -> Path:
    """Write atomically (temp file in the same folder, then rename)."""
    return write_model(path, build_resnet(config))


def cached_resnet(config: ResNetConfig = RESNET50, folder: Path = CACHE_DIR) -> Path:
    """The generated model under bench/.cache/, built once and reused by later runs."""
    path = Path(folder) / f"{config.tag()}.onnx"
    if not path.is_file():
        print(f"generating {path.name} ...", file=sys.stderr, flush=True)
        write_resnet(path, config)
    return path


def parameter_count(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(init.dims)) for init in model.graph.initializer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the .onnx file")
    parser.add_argument("--quick", action="store_true", help="the small smoke-test variant")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else RESNET50
    path = write_resnet(args.out, config)
    model = onnx.load(str(path), load_external_data=False)
    print(f"wrote {path}: {path.stat().st_size / 1e6:.1f} MB, {len(model.graph.node)} nodes, "
          f"{parameter_count(model) / 1e6:.2f} M parameters, input [N, 3, {config.image}, {config.image}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
