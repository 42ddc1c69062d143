"""Negative cases derived from a firing instance.

Must not fire (the rule language guarantees it):
  - ``extra-consumer``: an intermediate value gets a consumer outside the match;
  - ``graph-output``: an intermediate value becomes a graph output;
  - ``unused-output``: an output of a matched node the pattern leaves unnamed is used;
  - ``attribute-literal``: an attribute the pattern fixes gets another value;
  - ``unnamed-attribute``: an attribute the pattern does not name gets a
    non-default value (nodes without copy_attributes);
  - ``constant-literal``: a pattern Constant gets another value;
  - ``declared``: the domain's own ``negatives``.

May fire, but then must still be exact (the domain's boundary: guards decide):
  - ``dtype``: the instance in another element type;
  - ``runtime-constant``: a constant variable becomes a graph input;
  - ``kept-consumer``, ``kept-output``: a value the rule may ``keep`` gets
    another consumer or becomes a graph output;
  - ``excluded``: a variable holds what the domain leaves out of it, with its
    reason: NaN, infinities and values outside a ``range``, the special-value
    kinds ``special_values`` excludes. NaN or an infinity in a constant, a guard
    can see (``all_finite``): a rule that fires there and changes the result
    fails. Anything else (those in a graph input, which no guard sees; huge,
    subnormal or out-of-range finite values, whose rounding the reason explains)
    changes the result as an expected failure, shown with the reason (and the
    graph fuzzer, which feeds NaN and infinities to every rule, fails a rule
    that differs there unless its domain says it ``differs`` on purpose).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from onnxfuse.language.pattern import AttrLiteral, AttrRef
from onnxfuse.ops import schemas
from onnxfuse.proof.domain import FLOAT_DTYPES, SPECIAL_KINDS, Domain, Negative
from onnxfuse.proof.draw import RandomDrawer, draw, evaluate
from onnxfuse.proof.instance import (
    Instance,
    InstanceSpec,
    NodeSpec,
    attribute_type,
    eval_shape,
    pick_helper_op,
    random_array,
    to_array,
)

MUST_NOT_FIRE = (
    "extra-consumer",
    "graph-output",
    "unused-output",
    "attribute-literal",
    "unnamed-attribute",
    "constant-literal",
    "declared",
)
BOUNDARY = ("dtype", "runtime-constant", "kept-consumer", "kept-output", "excluded")
_OTHER_DTYPES = ("float", "float16", "double", "bfloat16", "int32", "int64", "int8", "bool")
_OTHER_STRINGS = {
    "constant": "reflect",
    "reflect": "edge",
    "edge": "constant",
    "NOTSET": "SAME_UPPER",
    "SAME_UPPER": "VALID",
    "SAME_LOWER": "VALID",
    "VALID": "NOTSET",
    "none": "tanh",
    "tanh": "none",
}


@dataclass
class Mutation:
    kind: str
    description: str
    spec: InstanceSpec
    must_not_fire: bool
    dtype: str | None = None  # the instance's element type, where the case changes it
    # For ``excluded`` cases: why the domain leaves the values out, and whether a
    # changed result is expected (values in a graph input, which no guard sees).
    reason: str = ""
    expected: bool = False

    def instance(self, base: Instance) -> Instance:
        """The instance this case runs (and a failure saves): ``base`` with its spec."""
        return replace(base, spec=self.spec, dtype=self.dtype or base.dtype)


def derive(
    instance: Instance, domain: Domain, value_types: dict[str, str]
) -> tuple[list[Mutation], list[str]]:
    """Mutations of a firing instance, and notes on those that do not apply here."""
    mutations: list[Mutation] = []
    notes: list[str] = []
    mutations += _structural(instance, value_types)
    mutations += _literals(instance)
    for negative in domain.negatives:
        if instance.reshaped is not None:
            notes.append(f"declared negative '{negative.description}': {instance.reshaped}")
            continue
        mutation = _declared(instance, negative)
        if mutation is None:
            notes.append(f"declared negative '{negative.description}': 'when' is false")
        else:
            mutations.append(mutation)
    rng = np.random.default_rng(instance.data_seed ^ 0x5EED)
    mutations += _boundary(instance, rng)
    mutations += _excluded(instance, domain, rng)
    return mutations, notes


def _pattern_nodes(spec: InstanceSpec) -> list[NodeSpec]:
    return [n for n in spec.nodes if n.pattern_index is not None]


def _structural(instance: Instance, value_types: dict[str, str]) -> list[Mutation]:
    spec = instance.spec
    found: list[Mutation] = []
    pattern_outputs = {v.name for v in instance.source.outputs}  # graph outputs, or used
    intermediates = [
        out
        for node in _pattern_nodes(spec)
        for out in node.outputs
        if out and out not in pattern_outputs
    ]
    for value in intermediates:
        # A kept intermediate may have other uses: the rule may still fire, exactly.
        kept = value in instance.rule.keep
        dtype = value_types.get(value, instance.dtype)
        extra = spec.copy()
        op = pick_helper_op(instance.rule, dtype)
        extra.nodes.append(
            NodeSpec(op, "", [value], [f"{value}__extra"], {}, None, f"extra_{value}")
        )
        extra.outputs.append(f"{value}__extra")
        found.append(
            Mutation(
                "kept-consumer" if kept else "extra-consumer",
                f"{value} also feeds {op}",
                extra,
                not kept,
            )
        )
        exposed = spec.copy()
        exposed.outputs.append(value)
        found.append(
            Mutation(
                "kept-output" if kept else "graph-output",
                f"{value} is also a graph output",
                exposed,
                not kept,
            )
        )
    for position, node in enumerate(spec.nodes):
        if node.pattern_index is None or node.domain != "":
            continue
        schema = schemas.get_schema("", node.op_type, spec.opset)
        if schema is None or not schema.outputs:
            continue
        last = schema.outputs[-1]
        limit = (
            len(schema.outputs) if last.option != last.option.Variadic else len(node.outputs) + 1
        )
        if len(node.outputs) >= limit or any(o == "" for o in node.outputs):
            continue
        if "num_outputs" in node.attributes:
            # Split-18 fixes its output count by the attribute: one more output is an
            # invalid model, on which onnx's shape inference aborts the process.
            continue
        mutated = spec.copy()
        target = mutated.nodes[position]
        name = f"{target.name}__out{len(target.outputs)}"
        target.outputs.append(name)
        mutated.outputs.append(name)
        found.append(
            Mutation(
                "unused-output",
                f"{node.op_type} output {len(node.outputs)} ({name}) is used",
                mutated,
                True,
            )
        )
    return found


def other_value(value: Any, attr_type: int) -> Any:
    """A different, plausible value of the same attribute type."""
    kind = onnx.AttributeProto
    if attr_type == kind.INT:
        return 1 - int(value) if int(value) in (0, 1) else int(value) + 1
    if attr_type == kind.FLOAT:
        return float(value) * 0.5 + 0.125
    if attr_type == kind.STRING:
        return _OTHER_STRINGS.get(str(value), f"{value}_other")
    if attr_type in (kind.INTS, kind.FLOATS):
        items = list(np.asarray(value).reshape(-1).tolist())
        if not items:
            return [1]
        items[0] = items[0] + 1
        return items
    return None


def _literals(instance: Instance) -> list[Mutation]:
    spec = instance.spec
    source = instance.source
    open_nodes = {
        source.values[name].producer.index  # type: ignore[union-attr]
        for name in instance.rule.copy_attributes
    }
    found: list[Mutation] = []
    for position, node in enumerate(spec.nodes):
        if node.pattern_index is None:
            continue
        pnode = source.nodes[node.pattern_index]
        version = spec.opset if node.domain == "" else 1
        schema = schemas.get_schema(node.domain, node.op_type, version)
        for attr_name, attr in pnode.attributes.items():
            if not isinstance(attr, AttrLiteral):
                continue
            attr_type = attribute_type(schema, attr_name, attr.value, attr.attr_type)
            changed = other_value(attr.value, attr_type)
            if changed is None:
                continue
            mutated = spec.copy()
            mutated.nodes[position].attributes[attr_name] = (changed, attr_type)
            found.append(
                Mutation(
                    "attribute-literal",
                    f"{node.op_type}.{attr_name}={changed!r} (pattern: {attr.value!r})",
                    mutated,
                    True,
                )
            )
        if pnode.index in open_nodes or schema is None:
            continue
        for attr_name, attr_schema in schema.attributes.items():
            if attr_name in pnode.attributes:
                continue
            default = schemas.attribute_default(node.domain, node.op_type, version, attr_name)
            if not schemas.has_default(default):
                continue
            # onnx's stub leaves out the __int__ of its pybind11 enums.
            attr_type = int(attr_schema.type)  # type: ignore[call-overload]
            if attr_type not in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT) and not (
                attr_type == onnx.AttributeProto.STRING and str(default) in _OTHER_STRINGS
            ):
                continue
            changed = other_value(default, attr_type)
            mutated = spec.copy()
            mutated.nodes[position].attributes[attr_name] = (changed, attr_type)
            found.append(
                Mutation(
                    "unnamed-attribute",
                    f"{node.op_type}.{attr_name}={changed!r} (default {default!r})",
                    mutated,
                    True,
                )
            )
    for name, tensor in spec.tensors.items():
        if tensor.variable or tensor.value is None:
            continue
        mutated = spec.copy()
        changed = mutated.tensors[name]
        value = tensor.value
        if value.dtype == np.bool_:
            changed.value = ~value
        elif value.dtype.kind in "iu":
            changed.value = (value + 1).astype(value.dtype)
        else:
            changed.value = (value.astype(np.float64) * 2 + 1).astype(value.dtype)
        found.append(
            Mutation(
                "constant-literal",
                f"constant {name} = {changed.value.tolist()!r}",
                mutated,
                True,
            )
        )
    return found


def _declared(instance: Instance, negative: Negative) -> Mutation | None:
    env = instance.env
    if negative.when is not None and not evaluate(negative.when, env, "negatives.when"):
        return None
    spec = instance.spec.copy()
    drawer = RandomDrawer(instance.data_seed)
    rng = np.random.default_rng(instance.data_seed + 1)
    if negative.attribute is not None:
        assert negative.value is not None
        value = draw(negative.value, env, drawer, "negatives.value")
        pattern = instance.source
        for node in spec.nodes:
            if node.pattern_index is None:
                continue
            pnode = pattern.nodes[node.pattern_index]
            for attr_name, attr in pnode.attributes.items():
                if isinstance(attr, AttrRef) and attr.var == negative.attribute:
                    if value is None:
                        node.attributes.pop(attr_name, None)
                    else:
                        schema = schemas.get_schema(node.domain, node.op_type, spec.opset)
                        node.attributes[attr_name] = (
                            value,
                            attribute_type(schema, attr_name, value, attr.attr_type),
                        )
    elif negative.input is not None:
        tensor = spec.tensors.get(negative.input) or spec.tensors.get(f"{negative.input}__in")
        if tensor is None:
            return None
        if negative.present is False:
            tensor.kind = "absent"
            for node in spec.nodes:
                node.inputs = ["" if i == tensor.name else i for i in node.inputs]
                while node.inputs and node.inputs[-1] == "":
                    node.inputs.pop()
        if negative.dtype is not None:
            tensor.dtype = negative.dtype
            if tensor.value is not None:
                tensor.value = to_array(tensor.value.astype(np.float64), negative.dtype)
        if negative.shape is not None:
            dims, _ = eval_shape(negative.shape, env, "negatives.shape")
            tensor.dims = dims
            tensor.symbolic = {}
            tensor.value = None
            if tensor.kind != "input":
                tensor.value = random_array(rng, tensor.dtype, dims, tensor.range, frozenset())
        if negative.value is not None:
            value = draw(negative.value, env, drawer, "negatives.value")
            array = to_array(value, tensor.dtype)
            if negative.shape is not None:
                array = array.reshape(tensor.dims)
            tensor.value = array
            tensor.dims = tuple(array.shape)
            if tensor.kind in ("absent",):
                tensor.kind = "initializer"
        if negative.constant is not None:
            if negative.constant and tensor.kind == "input":
                tensor.kind = "initializer"
                if tensor.value is None:
                    tensor.value = random_array(
                        rng, tensor.dtype, tensor.dims, tensor.range, frozenset()
                    )
                tensor.symbolic = {}
            elif not negative.constant and tensor.kind in ("initializer", "constant_node"):
                tensor.kind = "input"
    elif negative.dtype is not None:
        _change_dtype(spec, instance.dtype, negative.dtype)
        return Mutation("declared", negative.description, spec, True, negative.dtype)
    return Mutation("declared", negative.description, spec, True)


def _change_dtype(spec: InstanceSpec, old: str, new: str) -> None:
    for tensor in spec.tensors.values():
        if tensor.dtype != old or not tensor.follows_dtype:
            continue
        tensor.dtype = new
        if tensor.value is not None:
            tensor.value = to_array(tensor.value.astype(np.float64), new)


def _boundary(instance: Instance, rng: np.random.Generator) -> list[Mutation]:
    found: list[Mutation] = []
    others = [d for d in _OTHER_DTYPES if d != instance.dtype]
    new = others[int(rng.integers(len(others)))]
    spec = instance.spec.copy()
    _change_dtype(spec, instance.dtype, new)
    found.append(
        Mutation("dtype", f"element type {new} instead of {instance.dtype}", spec, False, new)
    )
    constants = [
        name
        for name, tensor in instance.spec.tensors.items()
        if tensor.variable and tensor.kind in ("initializer", "constant_node")
    ]
    if constants:
        name = constants[int(rng.integers(len(constants)))]
        spec = instance.spec.copy()
        spec.tensors[name].kind = "input"
        found.append(
            Mutation("runtime-constant", f"{name} is a graph input, not a constant", spec, False)
        )
    return found


_LABELS = {"outside": "values outside its range", "neg_zero": "-0.0", "large": "huge values"}


def _excluded(instance: Instance, domain: Domain, rng: np.random.Generator) -> list[Mutation]:
    """One case per variable and kind of value its domain leaves out: the variable's
    random data with some elements set to that kind."""
    found: list[Mutation] = []
    for key, tensor in instance.spec.tensors.items():
        if not tensor.variable or tensor.kind == "absent" or tensor.dtype == "bool":
            continue
        spec = domain.inputs.get(key.removesuffix("__in"))
        if spec is not None and spec.value is not None:
            continue  # a value the domain fixes (a shape, axes): it excludes nothing
        runtime = tensor.kind == "input"
        if spec is not None and spec.range is not None:
            kinds, reason = ["nan", "inf", "outside"], spec.reason
            what = f"its range is {list(spec.range)}"
        else:
            allowed = domain.special_inputs if runtime else domain.special_constants
            kinds = [k for k in SPECIAL_KINDS if k not in allowed]
            reason, what = domain.special_reason, "special_values excludes it"
        if tensor.dtype not in FLOAT_DTYPES:
            kinds = [k for k in kinds if k in ("outside", "large")]
        if 0 in tensor.dims or (tensor.value is not None and tensor.value.size == 0):
            continue
        for kind in kinds:
            spec_copy = instance.spec.copy()
            changed = spec_copy.tensors[key]
            base = tensor.value
            if base is None:
                base = random_array(rng, tensor.dtype, tensor.dims, tensor.range, frozenset())
            changed.value = _holding(rng, np.array(base), kind, tensor.range)
            where = "graph input" if runtime else "constant"
            found.append(
                Mutation(
                    "excluded",
                    f"{key} ({where}) holds {_LABELS.get(kind, kind)} ({what})",
                    spec_copy,
                    False,
                    reason=reason,
                    # A guard sees NaN and infinities in a constant (all_finite); other
                    # excluded values are magnitudes whose rounding the reason explains.
                    expected=runtime or kind not in ("nan", "inf"),
                )
            )
    return found


def _holding(
    rng: np.random.Generator,
    array: np.ndarray,
    kind: str,
    value_range: tuple[float, float] | None,
) -> np.ndarray:
    """``array`` with a quarter of its elements (at least one) of ``kind``."""
    flat = array.reshape(-1).copy()
    count = max(1, flat.size // 4)
    positions = rng.choice(flat.size, size=count, replace=False)
    signs = rng.choice([-1.0, 1.0], size=count)
    if flat.dtype.kind in "iu":
        info = np.iinfo(flat.dtype)
        if kind == "outside" and value_range is not None:
            low, high = value_range
            values = np.where(signs < 0, max(low - 4, info.min), min(high + 4, info.max))
        else:
            values = np.where(signs < 0, info.min, info.max)
    else:
        finfo = ml_dtypes.finfo(flat.dtype)
        if kind == "nan":
            values = np.full(count, np.nan)
        elif kind == "inf":
            values = signs * np.inf
        elif kind == "outside":
            assert value_range is not None
            low, high = value_range
            width = max(high - low, 1.0)
            values = np.where(signs < 0, low - width, high + width)
        elif kind == "neg_zero":
            values = np.full(count, -0.0)
        elif kind == "subnormal":
            values = signs * float(finfo.smallest_subnormal)
        else:  # large
            values = signs * float(finfo.max) * rng.uniform(0.25, 1.0, size=count)
    with np.errstate(over="ignore", invalid="ignore"):
        flat[positions] = np.asarray(values).astype(flat.dtype)
    return flat.reshape(array.shape)
