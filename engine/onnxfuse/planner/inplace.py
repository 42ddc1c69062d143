"""In-place reuse: an op's output may take the buffer of an input that dies at that op.

Safe when every output element is computed from the input elements at the same
position only (elementwise ops, per-channel BatchNormalization), or when the
output is the input's bytes unchanged (Reshape and friends): reading element i
before writing element i never reads a clobbered value.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxfuse.planner.baselines import align_up
from onnxfuse.planner.lifetimes import Lifetime, Lifetimes
from onnxfuse.planner.strategies import Block

_UNARY = {
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BatchNormalization",
    "Ceil", "Celu", "Clip", "Cos", "Cosh", "Dropout", "Elu", "Erf", "Exp", "Flatten",
    "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Mish",
    "Neg", "Not", "Reciprocal", "Relu", "Reshape", "Round", "Selu", "Sigmoid", "Sign",
    "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Squeeze", "Tan", "Tanh",
    "ThresholdedRelu", "Unsqueeze",
}  # fmt: skip
_BINARY = {
    "Add", "And", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Max", "Mean", "Min",
    "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum", "Xor",
}  # fmt: skip


def allows_inplace(op_type: str, domain: str = "") -> bool:
    return domain in ("", "ai.onnx") and op_type in _UNARY | _BINARY | {"Where"}


def inplace_inputs(node: ir.Node) -> tuple[int, ...]:
    """Input positions whose buffer output 0 of ``node`` may take."""
    op, n_inputs = node.op_type, len(node.inputs)
    if not allows_inplace(op, node.domain):
        return ()
    if op == "BatchNormalization":
        training = node.attributes.get("training_mode")
        # Training form: batch statistics are read over the whole input first.
        if len(node.outputs) > 1 or (training is not None and training.as_int()):
            return ()
    if op in _UNARY:
        return (0,)
    # Variadic ops fold three or more inputs pairwise into the output, so a
    # later input would be overwritten before it is read.
    if op in _BINARY and n_inputs <= 2:
        return tuple(range(n_inputs))
    if op == "Where":
        return (1, 2)
    return ()


def find_inplace(lifetimes: Lifetimes) -> dict[str, str]:
    """Map output tensor name -> name of the dying input whose buffer it takes."""
    by_name: dict[str, Lifetime] = {t.name: t for t in lifetimes.tensors}
    pairs: dict[str, str] = {}
    for step, node in enumerate(lifetimes.steps):
        if not node.outputs or node.outputs[0].name not in by_name:
            continue
        out = by_name[node.outputs[0].name]
        for pos in inplace_inputs(node):
            value = node.inputs[pos] if pos < len(node.inputs) else None
            src = by_name.get(value.name) if value is not None and value.name is not None else None
            if src is not None and can_share(src, out, step):
                pairs[out.name] = src.name
                break
    return pairs


def can_share(src: Lifetime, out: Lifetime, step: int) -> bool:
    """The input dies at this step and has the output's dtype and shape size."""
    return (
        src.last == step
        and out.first == step
        and src.info.dtype == out.info.dtype
        and src.info.nbytes == out.info.nbytes > 0
    )


def make_blocks(
    lifetimes: Lifetimes, pairs: dict[str, str], alignment: int
) -> tuple[list[Block], list[int]]:
    """One block per buffer: in-place chains share one. Returns blocks and each tensor's block."""
    blocks: list[Block] = []
    block_of: list[int] = []
    index = {t.name: i for i, t in enumerate(lifetimes.tensors)}
    for t in lifetimes.tensors:  # in order of production, so a source comes first
        size = align_up(t.info.nbytes, alignment)
        if t.name in pairs:
            b = block_of[index[pairs[t.name]]]
            blocks[b] = Block(size, blocks[b].first, max(blocks[b].last, t.last))
        else:
            b = len(blocks)
            blocks.append(Block(size, t.first, t.last))
        block_of.append(b)
    return blocks, block_of
