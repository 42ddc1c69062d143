"""A graph-fuzzer step that embeds an instance of any rule's source (the built-in
packs' and a run's ``--rules``).

The hand-written steps of `fuzz.graphs` cover the rules that existed when they
were written. This step covers every rule, including ones added later: it
draws a concrete instance of a rule's source from the rule's own `verify:`
domain (the generator the property tests use), at the opset of the graph being
built, and splices it into that graph. Its variable inputs are wired to earlier
values of the same type and shape when there are any, else to new graph inputs;
its constants become initializers, Constant nodes or (rarely) overridable
initializers, which must block the rule. Later steps may consume its outputs,
so the instance meets other rules' sources, shared uses and graph outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import helper

from onnxfuse.fuzz import oracle
from onnxfuse.fuzz.graphs import MAX_ELEMENTS, Builder, Val, _RandomBuilder, ort_ok, s_unary
from onnxfuse.language.rule import Rule
from onnxfuse.ops import element_types
from onnxfuse.proof.domain import DTYPES, Domain
from onnxfuse.proof.draw import Reject
from onnxfuse.proof.expr import ExprError
from onnxfuse.proof.instance import (
    DomainError,
    build_model,
    generate,
    make_attribute,
    random_array,
)


def _rules_with_domains() -> tuple[tuple[Rule, Domain], ...]:
    """(rule, verification domain) for every rule of the run, in pack order."""
    return _with_domains(oracle.rule_files())


@functools.cache
def _with_domains(files: tuple[str, ...]) -> tuple[tuple[Rule, Domain], ...]:
    from onnxfuse.proof.domain import VerifyError, parse_domain

    found = []
    for rule in oracle.run_rules():
        try:
            found.append((rule, parse_domain(rule)))
        except VerifyError:
            continue  # a rule without a usable domain is not generated here
    return tuple(found)


class _BuilderDrawer:
    """The proof generator's Drawer, answered by the fuzz builder's own choices
    (hypothesis draws, or the seeded choices of the rule fuzzer's zoo)."""

    def __init__(self, b: Builder):
        self.b = b

    def integer(self, low: int, high: int) -> int:
        return self.b.int(low, high)

    def floating(self, low: float, high: float) -> float:
        if high <= low:
            return float(low)
        if isinstance(self.b.root, _RandomBuilder):
            return self.b.root.choices.uniform(low, high)
        return self.b.draw(
            st.floats(low, high, allow_nan=False, allow_infinity=False, allow_subnormal=False)
        )

    def index(self, count: int) -> int:
        return self.b.int(0, count - 1) if count > 1 else 0

    def permutation(self, count: int) -> list[int]:
        items = list(range(count))
        for i in range(count - 1, 0, -1):  # Fisher-Yates, one draw per position
            j = self.b.int(0, i)
            items[i], items[j] = items[j], items[i]
        return items


def candidate_rules(opset: int) -> list[tuple[Rule, Domain]]:
    """The rules whose domain can draw an instance at ``opset``, with the domain
    narrowed to exactly that opset."""
    return [
        (rule, dataclasses.replace(domain, opsets=[opset]))
        for rule, domain in _rules_with_domains()
        if opset in domain.opsets
    ]


# Draws of one instance: half of them reshape a constant, which onnx may reject.
_DRAWS = 4


def draw_instance(b: Builder, rule, domain, fire_target=None):
    """A built instance of ``rule`` (spec and typed model), or None if it cannot be drawn
    (or, with ``fire_target``, if the rule alone does not fire on it for that target)."""
    for _ in range(_DRAWS):
        instance = None
        try:
            instance = generate(rule, domain, _BuilderDrawer(b))
            spec = instance.spec.copy()
            concrete = spec.copy()
            for tensor in concrete.tensors.values():
                tensor.symbolic = {}  # output shapes must be concrete for the fuzz graph
            model = build_model(concrete)
            if fire_target is not None and not _fires_alone(spec, rule, fire_target):
                return None
            break
        except Reject:
            if instance is None or instance.reshaped is None:
                return None
            # A constant drawn at another rank that the op does not broadcast: draw again.
        except (DomainError, ExprError):
            return None
    else:
        return None
    if not _runs_in_onnxruntime(model) or any(
        t.kind == "input" and t.dtype not in _FEEDABLE for t in spec.tensors.values()
    ):
        return None  # a dtype or opset onnxruntime lacks: the whole graph would be discarded
    return spec, model


def _fires_alone(spec, rule, target) -> bool:
    """Whether ``rule`` alone fires on the instance (with its symbolic dims) for ``target``."""
    from onnxfuse.proof.check import optimize_with

    try:
        applied, _ = optimize_with(build_model(spec), rule, target, check=False)
    except (Reject, DomainError, ExprError):
        return False
    except Exception:  # an engine error here is the proof's to report, not the fuzzer's
        return False
    return applied > 0


# Element types the runner can feed as NumPy arrays (NumPy has no bfloat16).
_FEEDABLE = frozenset(DTYPES) - {"bfloat16"}


def _runs_in_onnxruntime(model: onnx.ModelProto) -> bool:
    """Whether onnxruntime loads the instance, at ORT_DISABLE_ALL as the oracle runs it:
    its ALL level crashes the process on some valid models (onnxruntime 1.32: a
    Transpose, a Cast to double and a MatMul broadcasting a rank-5 constant)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception:  # onnxruntime raises several types for models it cannot run
        return False
    return True


def _output_vals(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
    found = {}
    for value in model.graph.output:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        if not tensor.HasField("shape") or any(d < 0 for d in dims):
            return None
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        found[value.name] = (dtype, dims)
    return found


def _output_vals_by_running(model: onnx.ModelProto, spec):
    """Output types and shapes from a run, for outputs onnx cannot infer a static shape of
    (a Reshape to a computed shape): the fuzz graph wires static shapes."""
    from onnxfuse.proof.instance import make_feeds
    from onnxfuse.proof.runtime import ORT, Runner, RuntimeFailure

    try:
        results = Runner(ORT).run(model, make_feeds(spec, 0, sets=1))[0]
    except RuntimeFailure:
        return None
    return {
        value.name: (np.asarray(result).dtype, tuple(np.asarray(result).shape))
        for value, result in zip(model.graph.output, results)
    }


def _ranged_input(
    b: Builder, dtype: np.dtype, dims: tuple[int, ...], low: float, high: float, symbolic
):
    """A graph input mapped into [low, high] by ops, so the value stays computed."""
    x = b.new_input(dtype, dims, symbolic)
    squashed = b.op("Sigmoid", [x], dtype, dims)
    width = b.scalar(high - low, dtype, override_ok=False)
    scaled = b.op("Mul", [squashed, width], dtype, dims)
    offset = b.scalar(low, dtype, override_ok=False)
    return b.op("Add", [scaled, offset], dtype, dims)


def _wire_input(b: Builder, tensor) -> Val:
    dtype = element_types.to_numpy(tensor.dtype)
    dims = tuple(int(d) for d in tensor.dims)
    # The instance's symbolic dims stay symbolic (a rule may need a shape that does not fold).
    symbolic = {axis: f"{name}_{dims[axis]}" for axis, name in tensor.symbolic.items()}
    if tensor.value is not None:
        if dtype.kind in "iu" and ort_ok("Min", dtype, b.opset) and ort_ok("Max", dtype, b.opset):
            # The instance feeds this input a fixed value (a shape, an index): computed as
            # Max(Min(x, v), v), which is v, so that it does not fold to a constant either.
            value = b.const(np.asarray(tensor.value, dtype=dtype), override_ok=False)
            x = b.new_input(dtype, dims, symbolic)
            low = b.op("Min", [x, value], dtype, dims)
            return b.op("Max", [low, value], dtype, dims)
        return b.const(tensor.value, override_ok=False)
    if tensor.range is not None:
        low, high = tensor.range
        if dtype.kind == "f" and math.isfinite(low) and math.isfinite(high):
            return _ranged_input(b, dtype, dims, float(low), float(high), symbolic)
        finite = math.isfinite(low) and math.isfinite(high)
        if dtype.kind in "iu" and finite and ort_ok("Clip", dtype, b.opset):
            # Computed, not a constant: an index or size a rule must not see folded.
            x = b.new_input(dtype, dims, symbolic)
            bounds = [b.scalar(v, dtype, override_ok=False) for v in (low, high)]
            return b.op("Clip", [x, *bounds], dtype, dims)
        return b.const(random_array(b.rng, tensor.dtype, dims, tensor.range, frozenset()))
    earlier = [
        v
        for v in b.visible()
        if v.dtype == dtype and v.shape == dims and v.const is None and v.numel <= MAX_ELEMENTS
    ]
    if earlier and b.flag(0.6):
        return earlier[-1 - b.int(0, len(earlier) - 1)]
    return b.new_input(dtype, dims, symbolic)


def splice_rule_instance(b: Builder, x: Val | None = None, same: bool = False) -> Val:
    """An instance of a randomly chosen built-in rule's source, spliced into the graph."""
    rules = candidate_rules(b.opset)
    if b.parent is not None or not rules:
        return s_unary(b, x, same)
    rule, domain = rules[b.int(0, len(rules) - 1)]
    spliced = embed_instance(b, rule, domain)
    return s_unary(b, x, same) if spliced is None else spliced


def embed_instance(
    b: Builder, rule, domain, distractors: bool = True, fire_target=None
) -> Val | None:
    """An instance of ``rule``'s source drawn from ``domain`` and spliced into the main
    graph; its last output, or None if no instance can be drawn at the builder's opset.

    Without ``distractors`` no constant of the instance becomes an overridable
    initializer (which must block the rule), and every output gets a consumer (a
    rewrite cannot connect a graph input straight to a graph output): the instance
    should fire. With ``fire_target``, only an instance the rule alone fires on (for
    that target) is spliced in.
    """
    drawn = draw_instance(b, rule, domain, fire_target)
    if drawn is None:
        return None
    spec, model = drawn
    outputs = _output_vals(model) or _output_vals_by_running(model, spec)
    if outputs is None:
        return None
    b.root.steps.append(f"rule:{rule.name}")
    names: dict[str, str] = {}
    for name, tensor in spec.tensors.items():
        if tensor.kind == "absent":
            names[name] = ""
        elif tensor.kind == "input":
            names[name] = _wire_input(b, tensor).name
        else:
            assert tensor.value is not None
            names[name] = b.const(tensor.value, override_ok=distractors).name
    for node in spec.nodes:
        for output in node.outputs:
            if output and output not in names:
                names[output] = b.fresh("r")
        inputs = [names[i] if i else "" for i in node.inputs]
        for name in inputs:
            if name:
                b.root.uses[name] += 1
        proto = helper.make_node(
            node.op_type,
            inputs,
            [names[o] if o else "" for o in node.outputs],
            name="" if b.root.unnamed_nodes else b.fresh(f"{node.op_type.lower()}_"),
            domain=node.domain or None,
        )
        proto.attribute.extend(make_attribute(k, v, t) for k, (v, t) in node.attributes.items())
        b.nodes.append(proto)
        if node.domain and node.domain != "ai.onnx":
            b.root.domains.setdefault(node.domain, spec.extra_opsets.get(node.domain, 1))
    # Outputs of ops of other domains are typed by running the instance: declare them too,
    # as the property tests' instance does (a guard may read their shapes).
    foreign = {o for n in spec.nodes if n.domain not in ("", "ai.onnx") for o in n.outputs}
    typed_outputs = [v for v in model.graph.output if v.name in foreign]
    for value in [*model.graph.value_info, *typed_outputs]:
        if names.get(value.name):
            typed = onnx.ValueInfoProto()
            typed.CopyFrom(value)
            typed.name = names[value.name]
            b.root.known_types.append(typed)
    last = None
    for name in spec.outputs:
        dtype, dims = outputs[name]
        last = b.add(names[name], dtype, dims)
        if not distractors:
            _consume(b, last)
    assert last is not None
    return last


def _consume(b: Builder, value: Val) -> None:
    """A consumer for ``value`` that no rule rewrites with it: Add (Or for bool) of the
    value and itself (a second operand of a static shape could pin symbolic dims), else
    a Concat of the two."""
    op = "Or" if value.dtype == np.bool_ else "Add"
    if ort_ok(op, value.dtype, b.opset):
        b.op(op, [value, value], value.dtype, value.shape)
    elif value.rank >= 1:  # no Add kernel for the type (float16 before opset 14): Concat
        shape = (2 * value.shape[0], *value.shape[1:])
        b.op("Concat", [value, value], value.dtype, shape, axis=0)
