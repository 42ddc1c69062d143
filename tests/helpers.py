"""Helpers for tests: build small models, run them in onnxruntime, compare outputs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper, numpy_helper

# onnx's helpers default to an opset/IR onnxruntime cannot load: always pin them.
OPSET = 17
IR_VERSION = 8

# Per-dtype tolerances no looser than torch.testing.assert_close's defaults.
TOLERANCES = {
    np.dtype(np.float32): (1.3e-6, 1e-5),
    np.dtype(np.float16): (1e-3, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-7),
}


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    opset: int = OPSET,
    ir_version: int = IR_VERSION,
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    onnx.checker.check_model(model, full_check=True)
    return model


def to_ir(model: onnx.ModelProto) -> ir.Model:
    return ir.from_proto(model)


def to_proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def run(model: onnx.ModelProto | ir.Model | str | Path, feeds: dict[str, np.ndarray]) -> list:
    if isinstance(model, ir.Model):
        model = to_proto(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    source = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, int] | None = None):
    """Random inputs for every graph input that is not an initializer."""
    rng = np.random.default_rng(seed)
    initializer_names = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializer_names:
            continue
        tensor_type = value.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 2)
            for d in tensor_type.shape.dim
        ]
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            array = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            array = rng.random(shape) > 0.5
        else:
            array = rng.integers(0, 4, shape).astype(dtype)
        feeds[value.name] = np.asarray(array)
    return feeds


def assert_close(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
        rtol, atol = TOLERANCES.get(e.dtype, (0.0, 0.0))
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)


def op_types(model: onnx.ModelProto | ir.Model) -> list[str]:
    if isinstance(model, ir.Model):
        return [n.op_type for n in model.graph]
    return [n.op_type for n in model.graph.node]


def rules_from_text(text: str, path: str = "test.yaml"):
    from onnxfuse.language.rulefile import parse_rule_text

    return parse_rule_text(text, path)


def optimize_proto(model: onnx.ModelProto, rules, **options):
    """Optimize a copy of ``model``; return (report, optimized proto)."""
    from onnxfuse.files.model_io import check_model
    from onnxfuse.passes.pipeline import Options, optimize

    ir_model = to_ir(model)
    report = optimize(ir_model, list(rules), Options(**options))
    check_model(ir_model)
    return report, to_proto(ir_model)


def assert_same_outputs(original: onnx.ModelProto, optimized: onnx.ModelProto, seed: int = 0):
    feeds = random_feeds(original, seed)
    assert_close(run(optimized, feeds), run(original, feeds))


def tensor_input(name: str, shape, elem_type: int = onnx.TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def mish_rule(name: str) -> str:
    """A rule file with one rule, x * tanh(softplus(x)) -> Mish(x), with its domain: a
    fusion into an op cpu runs only as its ONNX function body."""
    return f"""
rules:
  - name: {name}
    description: x * tanh(softplus(x)) is Mish
    opset: {{"": [18, null]}}
    source: |
      f (X) => (Y) {{
        s = Softplus(X)
        t = Tanh(s)
        Y = Mul(X, t)
      }}
    replacement: |
      f (X) => (Y) {{
        Y = Mish(X)
      }}
    verify:
      opsets: [18]
      dtypes: [float]
      inputs: {{X: [4]}}
"""


def relu_relu_rule(name: str, description: str | None = None) -> str:
    """A rule file with one rule, Relu(Relu(X)) -> Relu(X); more keys may be appended."""
    described = f"    description: {description}\n" if description is not None else ""
    return f"""\
rules:
  - name: {name}
{described}    source: |
      f (X) => (Y) {{
        T = Relu(X)
        Y = Relu(T)
      }}
    target: |
      f (X) => (Y) {{
        Y = Relu(X)
      }}
"""


def residual_norm(shape=(2, 16, 128)) -> onnx.ModelProto:
    """Add(x, skip) then LayerNormalization: what ort-skip-layer-norm fuses."""
    shape = list(shape)
    hidden = shape[-1]
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), name)
        for name in ("gamma", "beta")
    ]
    nodes = [
        helper.make_node("Add", ["x", "skip"], ["sum"], name="residual"),
        helper.make_node(
            "LayerNormalization", ["sum", "gamma", "beta"], ["y"], name="norm", axis=-1
        ),
    ]
    inputs = [tensor_input("x", shape), tensor_input("skip", shape)]
    return make_model(nodes, inputs, [tensor_input("y", shape)], inits, opset=17)


def model_bytes(model: onnx.ModelProto) -> int:
    """The serialized size without what onnxfuse records beside the computation, each a
    reason its report states: the inferred types as value_info and each created node's
    provenance (on the quantized corpus up to 24% and 18% of the file)."""
    from onnxfuse.files.model_size import provenance_bytes

    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    del stripped.graph.value_info[:]
    return stripped.ByteSize() - provenance_bytes(stripped)


# Rewrites x / sqrt(2) as x * 0.7072: off by 1e-4 relative, a wrong constant.
NEARLY_RIGHT = """
rules:
  - name: div-sqrt2-as-rounded-mul
    description: a wrong constant, for the fuzzer to find
    source: |
      f (X) => (Y) {
        r = Constant<value_float = 1.4142135>()
        Y = Div(X, r)
      }
    replacement: |
      f (X) => (Y) {
        k = Constant<value_float = 0.7072>()
        Y = Mul(X, k)
      }
    verify:
      dtypes: [float]
      inputs: {X: [3, 5]}
"""


FUSION = Path(__file__).resolve().parent / "data" / "ort-fusion"
FIVE_MODELS = [
    "bias_softmax_fusion_allleadingones",
    "conv_hardsigmoid",
    "gemm_transpose_2inputs_transposed",
    "gemm_transpose_output_transposed",
    "transpose_matmul_trans_batch_fusion3",
]


def five_models(folder: Path) -> Path:
    """Five small models of the repository (symbolic dimensions among their inputs)."""
    folder.mkdir()
    for name in FIVE_MODELS:
        shutil.copy(FUSION / f"{name}.onnx", folder / f"{name}.onnx")
    return folder


# -- Ray ----------------------------------------------------------------------------------


def _descendants() -> dict[int, str]:
    """This process's descendants (Ray's workers among them): pid -> command line."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        lines[int(entry.name)] = line
    found, todo = {}, [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = lines[pid]
                todo.append(pid)
    return found


def kill_a_busy_worker(killed: list[int], seconds: float = 60.0) -> threading.Thread:
    """A thread that kills (SIGKILL) the first Ray worker it finds running a job."""

    def hunt() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not killed:
            for pid, line in _descendants().items():
                if line.startswith("ray::_run_task"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=hunt, daemon=True)
    thread.start()
    return thread


def fuzz_summary(result) -> tuple[int, int]:
    """The ``N passed, M failed`` a fuzz command ends with (its last stdout line)."""
    last = result.stdout.rstrip("\n").splitlines()[-1]
    match = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert match, f"last line is {last!r}: {result.stderr[-2000:]}"
    return int(match.group(1)), int(match.group(2))


# A rule as a new user writes it: no rank guard, the replacement a new node. On a C of
# shape [1, 1] it would hand X's shape on where Mul broadcasts X[N] to [1, N].
MUL_ONE_RULE = """
rules:
  - name: my-mul-one
    source: |
      f (X, C) => (Y) {
        Y = Mul(X, C)
      }
    where:
      - is_constant(C) and all_equal(C, 1.0)
    replacement: |
      f (X, C) => (Y) {
        Y = Identity(X)
      }
"""
