"""Concrete instances of a rule's source pattern, drawn from its verification domain.

The source pattern itself is instantiated: every pattern variable becomes a
graph input or an initializer (or stays absent), every pattern Constant gets
its literal in the instance dtype, every pattern node becomes a node with its
attribute literals and the drawn values of its attribute variables, and the
pattern outputs become the graph outputs. An ``InstanceSpec`` is plain data,
so negative cases are derived by editing it and building again.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxfuse.language.pattern import AttrLiteral, AttrRef, Pattern, PatternNode
from onnxfuse.language.rule import Rule
from onnxfuse.ops import element_types, schemas
from onnxfuse.proof.domain import DTYPES, FLOAT_DTYPES, Domain, ShapeSpec
from onnxfuse.proof.draw import Drawer, Reject, draw, evaluate
from onnxfuse.proof.expr import Expr, ExprError, VarRef
from onnxfuse.rewrite.matcher import attribute_equal

NUMPY_DTYPES: dict[str, Any] = {name: element_types.to_numpy(name) for name in DTYPES}
ONNX_TYPES: dict[str, int] = {name: element_types.to_onnx(name) for name in DTYPES}
DTYPE_NAMES = {code: name for name, code in ONNX_TYPES.items()}

# Largest tensor an instance may hold: keeps every run small.
MAX_ELEMENTS = 1 << 16
# A node that produces or consumes values next to the pattern without being matched by it.
_HELPER_OPS = (
    ("Identity", None),
    ("Neg", ("float", "float16", "double", "int8", "int16", "int32", "int64")),
    ("Abs", ("float", "float16", "double", "int8", "int16", "int32", "int64", "uint8")),
    ("Not", ("bool",)),
)


class DomainError(Exception):
    """The verification domain cannot be evaluated (a mistake in the ``verify:`` mapping)."""


@dataclass
class TensorSpec:
    """A value of the instance that is not computed by a node."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    kind: str  # "input", "initializer", "constant_node" or "absent"
    value: np.ndarray | None = None  # initializer/Constant value, or a fixed graph-input value
    symbolic: dict[int, str] = field(default_factory=dict)  # axis -> dim_param (inputs only)
    range: tuple[float, float] | None = None
    special: frozenset[str] = frozenset()  # special-value kinds random data may hold
    variable: bool = True  # a pattern variable (False: a pattern Constant)
    follows_dtype: bool = True  # has the instance dtype because the domain names no other


@dataclass
class NodeSpec:
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, tuple[Any, int]]  # name -> (value, AttributeProto type)
    pattern_index: int | None = None  # index of the source pattern node, None for helpers
    name: str = ""


@dataclass
class InstanceSpec:
    opset: int
    tensors: dict[str, TensorSpec]
    nodes: list[NodeSpec]
    outputs: list[str]
    extra_opsets: dict[str, int] = field(default_factory=dict)

    def copy(self) -> InstanceSpec:
        # Field by field rather than copy.deepcopy: derive() copies the spec once per
        # negative case (over a hundred for a large pattern), and deepcopy's generic
        # walk of every dict and dataclass was a third of a negative test's time.
        return InstanceSpec(
            self.opset,
            {name: _copy_tensor(t) for name, t in self.tensors.items()},
            [_copy_node(n) for n in self.nodes],
            list(self.outputs),
            dict(self.extra_opsets),
        )


def _copy_tensor(tensor: TensorSpec) -> TensorSpec:
    copied = copy.copy(tensor)
    copied.value = None if tensor.value is None else tensor.value.copy()
    copied.symbolic = dict(tensor.symbolic)
    return copied


_IMMUTABLE = (int, float, str, bytes, bool, type(None))


def _copy_node(node: NodeSpec) -> NodeSpec:
    attributes = {
        name: (value if isinstance(value, _IMMUTABLE) else copy.deepcopy(value), kind)
        for name, (value, kind) in node.attributes.items()
    }
    copied = copy.copy(node)
    copied.inputs, copied.outputs = list(node.inputs), list(node.outputs)
    copied.attributes = attributes
    return copied


@dataclass
class Instance:
    rule: Rule
    source_index: int
    dtype: str
    spec: InstanceSpec
    env: dict[str, Any]  # every drawn name, and VarRefs of the variables
    draws: dict[str, Any]  # the drawn names alone, for reports
    data_seed: int
    # A constant drawn at another rank than the domain gives it (see _broadcast_variant):
    # the domain's expressions, and so its declared negatives, do not describe it.
    reshaped: str | None = None

    @property
    def source(self) -> Pattern:
        return self.rule.sources[self.source_index]

    def describe(self) -> str:
        parts = [f"opset {self.spec.opset}", f"dtype {self.dtype}"]
        if len(self.rule.sources) > 1:
            parts.append(f"source #{self.source_index + 1}")
        shown = {k: v for k, v in self.draws.items() if k not in ("opset", "dt", "alternative")}
        if shown:
            parts.append(", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
        if self.reshaped:
            parts.append(self.reshaped)
        lines = ["; ".join(parts)]
        for tensor in self.spec.tensors.values():
            if tensor.kind == "absent":
                lines.append(f"  {tensor.name}: absent")
                continue
            dims = [tensor.symbolic.get(i, d) for i, d in enumerate(tensor.dims)]
            text = f"  {tensor.name}: {tensor.kind} {tensor.dtype}{dims}"
            if tensor.kind != "input" and tensor.value is not None and tensor.value.size <= 8:
                text += f" = {tensor.value.tolist()}"
            lines.append(text)
        for node in self.spec.nodes:
            attrs = ", ".join(f"{k}={_short(v)}" for k, (v, _) in node.attributes.items())
            inputs = ", ".join(node.inputs)
            outputs = ", ".join(node.outputs)
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            lines.append(f"  {outputs} = {op}<{attrs}>({inputs})")
        return "\n".join(lines)


def _short(value: Any) -> str:
    text = repr(value.tolist() if isinstance(value, np.ndarray) else value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- generation --------------------------------------------------------------------


def generate(rule: Rule, domain: Domain, drawer: Drawer) -> Instance:
    """Draw one instance; Reject if the draw is outside what the domain can build."""
    try:
        return _Builder(rule, domain, drawer).build()
    except ExprError as exc:
        raise DomainError(str(exc)) from None


class _Builder:
    def __init__(self, rule: Rule, domain: Domain, drawer: Drawer):
        self.rule = rule
        self.domain = domain
        self.drawer = drawer

    def pick(self, options: list[Any]) -> Any:
        return options[self.drawer.index(len(options))]

    def build(self) -> Instance:
        rule, domain = self.rule, self.domain
        source_index = self.drawer.index(len(rule.sources))
        source = rule.sources[source_index]
        opset = self.pick(domain.opsets)
        dtype = self.pick(domain.dtypes)
        env: dict[str, Any] = {"opset": opset, "dt": dtype, "alternative": source_index}
        for name, spec in domain.dims.items():
            env[name] = draw(spec, env, self.drawer, f"dims.{name}")
        for name, spec in domain.attributes.items():
            env[name] = draw(spec, env, self.drawer, f"attributes.{name}")
        node_attrs = {
            value: {
                a: draw(s, env, self.drawer, f"node_attributes.{value}.{a}")
                for a, s in attrs.items()
            }
            for value, attrs in domain.node_attributes.items()
        }
        for condition in domain.where:
            if not evaluate(condition, env, "where"):
                raise Reject(f"verify where '{condition.text}' is false")
        draws = dict(env)
        symbolic = {name for name in domain.symbolic if self.drawer.index(2) == 1}
        data_seed = self.drawer.integer(0, 2**31 - 1)
        rng = np.random.default_rng(data_seed)

        tensors: dict[str, TensorSpec] = {}
        listed = [n for n in domain.inputs if n in source.input_names()]
        for name in listed + [n for n in source.input_names() if n not in listed]:
            tensor = self._variable(name, env, dtype, symbolic, rng)
            tensors[name] = tensor
            env[name] = _ref(tensor)
        # After every draw: the domain's expressions see the shapes it wrote.
        reshaped = self._broadcast_variant(tensors)
        for pvalue in source.values.values():
            if pvalue.kind == "constant":
                tensors[pvalue.name] = self._pattern_constant(pvalue.name, pvalue, dtype, env)

        nodes: list[NodeSpec] = []
        passthrough = {
            v.name for v in rule.replacement.outputs if v.kind == "input" and v.name in tensors
        }
        for name in sorted(passthrough):
            tensor = tensors[name]
            if tensor.kind != "input":
                continue
            # A graph output cannot be renamed onto a graph input: give X a producer.
            outer = f"{name}__in"
            tensors = {
                (outer if key == name else key): (_renamed(value, outer) if key == name else value)
                for key, value in tensors.items()
            }
            op = pick_helper_op(rule, tensor.dtype)
            nodes.append(NodeSpec(op, "", [outer], [name], {}, None, f"producer_{name}"))
        absent = {name for name, tensor in tensors.items() if tensor.kind == "absent"}
        for pnode in source.nodes:
            node = self._node(pnode, opset, node_attrs, env)
            node.inputs = ["" if name in absent else name for name in node.inputs]
            while node.inputs and node.inputs[-1] == "":
                node.inputs.pop()
            nodes.append(node)
        for name, tensor in tensors.items():
            if tensor.kind != "absent" and math.prod(tensor.dims) > MAX_ELEMENTS:
                raise Reject(f"{name} has more than {MAX_ELEMENTS} elements")
        outputs = [v.name for v in source.outputs]
        if self.drawer.index(2) == 1:
            # Used inside a graph, not as its outputs: the engine keeps a graph output's
            # declared type, and a rewrite that changes the value's shape shows here.
            nodes += [
                NodeSpec("Identity", "", [name], [f"{name}__use"], {}, None, f"use_{name}")
                for name in outputs
            ]
            outputs = [f"{name}__use" for name in outputs]
        instance_spec = InstanceSpec(
            opset=opset,
            tensors=tensors,
            nodes=nodes,
            outputs=outputs,
            extra_opsets={d: 1 for d in {n.domain for n in nodes} if d not in ("", "ai.onnx")},
        )
        return Instance(rule, source_index, dtype, instance_spec, env, draws, data_seed, reshaped)

    def _variable(
        self,
        name: str,
        env: dict[str, Any],
        dtype: str,
        symbolic: set[str],
        rng: np.random.Generator,
    ) -> TensorSpec:
        spec = self.domain.inputs.get(name)
        if spec is None:  # an optional variable the domain leaves out
            return TensorSpec(name, dtype, (), "absent")
        where = f"inputs.{name}"
        present = True
        if spec.present is not None:
            present = bool(draw(spec.present, env, self.drawer, f"{where}.present"))
        if not present:
            return TensorSpec(name, dtype, (), "absent")
        var_dtype = self.pick(spec.dtypes) if spec.dtypes else dtype
        follows = not spec.dtypes
        value = None
        if spec.value is not None:
            value = draw(spec.value, env, self.drawer, f"{where}.value")
        constant = value is not None
        if spec.constant is not None:
            constant = bool(draw(spec.constant, env, self.drawer, f"{where}.constant"))
        dims: tuple[int, ...] | None = None
        symbols: dict[int, str] = {}
        if spec.shapes is not None:
            shape_spec = self.pick(spec.shapes)
            dims, symbols = eval_shape(shape_spec, env, f"{where}.shape")
        array = None
        if value is not None:
            array = to_array(value, var_dtype)
            if dims is not None:
                if array.size != math.prod(dims):
                    raise DomainError(
                        f"{where}: value has {array.size} elements, shape {list(dims)} needs "
                        f"{math.prod(dims)}"
                    )
                array = array.reshape(dims)
            dims = tuple(array.shape)
        assert dims is not None
        special = self.domain.special_constants if constant else self.domain.special_inputs
        if spec.range is not None:
            special = frozenset()
        if constant and array is None:
            if math.prod(dims) > MAX_ELEMENTS:
                raise Reject(f"{name} has more than {MAX_ELEMENTS} elements")
            with_special = special if rng.random() < 0.5 else frozenset()
            array = random_array(rng, var_dtype, dims, spec.range, with_special)
        tensor = TensorSpec(
            name,
            var_dtype,
            dims,
            self.pick(["initializer", "initializer", "constant_node"]) if constant else "input",
            array,
            {} if constant else {i: s for i, s in symbols.items() if s in symbolic},
            spec.range,
            special,
            follows_dtype=follows,
        )
        return tensor

    def _broadcast_variant(self, tensors: dict[str, TensorSpec]) -> str | None:
        """In half the instances, one constant variable gets leading 1-dims added,
        to one more than the highest rank of the others, or removed: the same values at
        another rank, as exporters write a bias ([1, 1, C] or [C]). An op that broadcasts
        it then gives a result of a higher (or lower) rank than its other inputs, which a
        rule passing one of those through must guard against. Where the op does not
        broadcast, onnx rejects the instance and it is discarded. Returns what changed."""
        constants = [
            t
            for t in tensors.values()
            if t.variable and t.kind in ("initializer", "constant_node") and t.value is not None
        ]
        if not constants or self.drawer.index(2) == 0:  # 0: shrinks to the domain's shapes
            return None
        tensor = constants[self.drawer.index(len(constants))]
        assert tensor.value is not None
        dims = tensor.dims
        ones = next((i for i, d in enumerate(dims) if d != 1), len(dims))  # leading 1-dims
        if ones and self.drawer.index(3) == 2:
            dims = dims[ones:]
        else:
            highest = max(len(t.dims) for t in tensors.values() if t.kind != "absent")
            dims = (1,) * max(1, highest + 1 - len(dims)) + dims
        note = f"{tensor.name} drawn as {list(dims)}, not {list(tensor.dims)}"
        tensor.dims = dims
        tensor.value = tensor.value.reshape(dims)
        return note

    def _pattern_constant(
        self, name: str, pvalue: Any, dtype: str, env: dict[str, Any]
    ) -> TensorSpec:
        literal = np.asarray(pvalue.constant)
        spec = self.domain.inputs.get(name)
        if spec is not None and spec.dtypes:
            const_dtype = self.pick(spec.dtypes)
        elif literal.dtype.kind == "f" and dtype in FLOAT_DTYPES:
            const_dtype = dtype
        else:
            const_dtype = DTYPE_NAMES.get(helper.np_dtype_to_tensor_dtype(literal.dtype), "float")
        if spec is not None and spec.shapes is not None:
            dims, _ = eval_shape(self.pick(spec.shapes), env, f"inputs.{name}.shape")
        elif pvalue.scalar or literal.size == 1:
            dims = tuple(self.pick([(), (1,), (1, 1)]))
        else:
            dims = tuple(literal.shape)
        if math.prod(dims) != literal.size:
            raise DomainError(
                f"inputs.{name}: shape {list(dims)} does not hold {literal.size} values"
            )
        array = to_array(literal.reshape(dims), const_dtype)
        kind = self.pick(["constant_node", "initializer"])
        follows = const_dtype == dtype and not (spec is not None and spec.dtypes)
        return TensorSpec(
            name, const_dtype, dims, kind, array, variable=False, follows_dtype=follows
        )

    def _node(
        self,
        pnode: PatternNode,
        opset: int,
        node_attrs: dict[str, dict[str, Any]],
        env: dict[str, Any],
    ) -> NodeSpec:
        version = opset if pnode.domain == "" else 1
        schema = schemas.get_schema(pnode.domain, pnode.op_type, version)
        attributes: dict[str, tuple[Any, int]] = {}
        for attr_name, attr in pnode.attributes.items():
            if isinstance(attr, AttrLiteral):
                value = attr.value
            else:
                assert isinstance(attr, AttrRef)
                value = env.get(attr.var)
            if value is None:
                continue
            if schema is not None and attr_name not in schema.attributes:
                continue  # the op has no such attribute at this opset: leave it out
            default = schemas.attribute_default(pnode.domain, pnode.op_type, version, attr_name)
            if (
                schemas.has_default(default)
                and attribute_equal(value, default)
                and self.drawer.index(2) == 1
            ):
                continue  # absent means the default
            attributes[attr_name] = (
                value,
                attribute_type(schema, attr_name, value, attr.attr_type),
            )
        for output in pnode.outputs:
            if output is None or output.name not in node_attrs:
                continue
            for attr_name, value in node_attrs[output.name].items():
                if value is None or attr_name in attributes:
                    continue
                if schema is not None and attr_name not in schema.attributes:
                    continue
                default = schemas.attribute_default(pnode.domain, pnode.op_type, version, attr_name)
                if (
                    schemas.has_default(default)
                    and attribute_equal(value, default)
                    and self.drawer.index(2) == 1
                ):
                    continue
                attributes[attr_name] = (value, attribute_type(schema, attr_name, value, 0))
        inputs = ["" if v is None else v.name for v in pnode.inputs]
        while inputs and inputs[-1] == "":
            inputs.pop()
        outputs = ["" if v is None else v.name for v in pnode.outputs]
        while outputs and outputs[-1] == "":
            outputs.pop()
        return NodeSpec(
            pnode.op_type,
            pnode.domain,
            inputs,
            outputs,
            attributes,
            pnode.index,
            f"{pnode.op_type.lower()}_{pnode.index}",
        )


def _renamed(tensor: TensorSpec, name: str) -> TensorSpec:
    result = copy.copy(tensor)
    result.name = name
    return result


def _ref(tensor: TensorSpec) -> VarRef:
    if tensor.kind == "absent":
        return VarRef(tensor.name, None, None, None, present=False)
    value = tensor.value if tensor.kind != "input" else None
    return VarRef(tensor.name, tuple(tensor.dims), tensor.dtype, value)


def eval_shape(
    spec: ShapeSpec, env: dict[str, Any], where: str
) -> tuple[tuple[int, ...], dict[int, str]]:
    """Concrete dims, and the axes written as a bare dimension name (candidates for symbols)."""
    if isinstance(spec, Expr):
        dims = _dims(evaluate(spec, env, where), where)
        return dims, {}
    result: list[int] = []
    names: dict[int, str] = {}
    for entry in spec:
        if isinstance(entry, int):
            result.append(entry)
            continue
        value = evaluate(entry, env, where)
        if isinstance(value, (list, tuple)):
            result.extend(_dims(value, where))
        else:
            if entry.text.isidentifier():
                names[len(result)] = entry.text
            result.extend(_dims([value], where))
    return tuple(result), names


def _dims(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise DomainError(f"{where}: a shape must be a list of integers, got {value!r}")
    dims = []
    for dim in value:
        if isinstance(dim, np.integer):
            dim = int(dim)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise DomainError(f"{where}: dimension {dim!r} is not a non-negative integer")
        dims.append(dim)
    return tuple(dims)


def attribute_type(schema: onnx.defs.OpSchema | None, name: str, value: Any, written: int) -> int:
    if schema is not None and name in schema.attributes:
        # onnx's stub leaves out the __int__ of its pybind11 enums.
        return int(schema.attributes[name].type)  # type: ignore[call-overload]
    if written:
        return written
    return helper.make_attribute(name, _attr_python(value)).type


def _attr_python(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    return value


def make_attribute(name: str, value: Any, attr_type: int) -> onnx.AttributeProto:
    kind = onnx.AttributeProto
    if attr_type == kind.FLOAT:
        return helper.make_attribute(name, float(value), attr_type=attr_type)
    if attr_type == kind.INT:
        return helper.make_attribute(name, int(value), attr_type=attr_type)
    if attr_type == kind.STRING:
        return helper.make_attribute(name, str(value), attr_type=attr_type)
    if attr_type == kind.FLOATS:
        return helper.make_attribute(name, [float(v) for v in _as_list(value)], attr_type=attr_type)
    if attr_type == kind.INTS:
        return helper.make_attribute(name, [int(v) for v in _as_list(value)], attr_type=attr_type)
    if attr_type == kind.STRINGS:
        return helper.make_attribute(name, [str(v) for v in _as_list(value)], attr_type=attr_type)
    if attr_type == kind.TENSOR:
        return helper.make_attribute(name, numpy_helper.from_array(np.asarray(value)))
    return helper.make_attribute(name, _attr_python(value))


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def pick_helper_op(rule: Rule, dtype: str) -> str:
    """A type-preserving unary op no source of the rule contains."""
    used = {node.op_type for source in rule.sources for node in source.nodes if node.domain == ""}
    for op, types in _HELPER_OPS:
        if op not in used and (types is None or dtype in types):
            return op
    return "Identity"


# -- values ------------------------------------------------------------------------


def _integer_info(dtype: str) -> Any:
    """The limits of an integer type (ml_dtypes' for the 4-bit ones), None for others."""
    if dtype in element_types.PACKED_INTEGERS:
        return ml_dtypes.iinfo(NUMPY_DTYPES[dtype])
    target = NUMPY_DTYPES[dtype]
    return np.iinfo(target) if target.kind in "iu" else None


def to_array(value: Any, dtype: str) -> np.ndarray:
    """A value as an array of ``dtype``; integer types saturate, NaN becomes 0."""
    target = NUMPY_DTYPES[dtype]
    array = np.asarray(value)
    if array.dtype == object:
        raise DomainError(f"value {value!r} is not a rectangular list of numbers")
    if dtype == "bool":
        return array.astype(np.bool_)
    info = _integer_info(dtype)
    if info is not None:
        as_float = np.round(np.nan_to_num(array.astype(np.float64), nan=0.0))
        high, low = as_float >= float(info.max), as_float <= float(info.min)
        middle = np.where(high | low, 0.0, as_float).astype(target)
        top, bottom = np.asarray(info.max, dtype=target), np.asarray(info.min, dtype=target)
        return np.where(high, top, np.where(low, bottom, middle)).astype(target)
    with np.errstate(over="ignore", invalid="ignore"):
        return array.astype(np.float64).astype(target)


def random_array(
    rng: np.random.Generator,
    dtype: str,
    dims: tuple[int, ...],
    value_range: tuple[float, float] | None,
    special: frozenset[str],
) -> np.ndarray:
    """Random data of ``dtype``; some elements special values when ``special`` allows."""
    target = NUMPY_DTYPES[dtype]
    if dtype == "bool":
        return np.asarray(rng.random(dims) < 0.5)
    info = _integer_info(dtype)
    if info is not None:
        low, high = (-5, 5) if int(info.min) < 0 else (0, 10)
        if value_range is not None:
            low, high = math.ceil(value_range[0]), math.floor(value_range[1])
        array = rng.integers(max(low, info.min), min(high, info.max) + 1, size=dims)
        if "large" in special and array.size:
            mask = rng.random(dims) < rng.uniform(0.05, 0.3)
            extremes = rng.choice([info.min, info.max], size=dims)
            array = np.where(mask, extremes, array)
        return array.astype(target)
    if value_range is not None:
        data = rng.uniform(value_range[0], value_range[1], size=dims)
    else:
        data = rng.standard_normal(dims)
    if special and data.size:
        data = _with_special(rng, data, dtype, special)
    return data.astype(target)


def _with_special(
    rng: np.random.Generator, data: np.ndarray, dtype: str, special: frozenset[str]
) -> np.ndarray:
    info = ml_dtypes.finfo(NUMPY_DTYPES[dtype])
    kinds = sorted(special)
    flat = data.reshape(-1).copy()
    count = max(1, int(flat.size * rng.uniform(0.05, 0.3)))
    positions = rng.choice(flat.size, size=min(count, flat.size), replace=False)
    for position in positions:
        kind = kinds[rng.integers(len(kinds))]
        sign = -1.0 if rng.random() < 0.5 else 1.0
        if kind == "nan":
            flat[position] = np.nan
        elif kind == "inf":
            flat[position] = sign * np.inf
        elif kind == "neg_zero":
            flat[position] = -0.0
        elif kind == "subnormal":
            flat[position] = sign * float(info.smallest_subnormal) * int(rng.integers(1, 8))
        elif kind == "large":
            flat[position] = sign * float(info.max) * rng.uniform(0.25, 1.0)
    return flat.reshape(data.shape)


# -- building models -------------------------------------------------------------------


def ir_version_for(opset: int) -> int:
    return max(8, helper.find_min_ir_version_for([helper.make_opsetid("", opset)]))


def build_model(
    spec: InstanceSpec, check: bool = True, fallback_dtype: str = "float"
) -> onnx.ModelProto:
    """The ONNX model of an instance; Reject if onnx cannot infer or check it.

    ``check=False`` builds models that need not be valid (negative cases only
    need the matcher to look at them): an output onnx cannot type gets
    ``fallback_dtype`` and no shape.
    """
    inputs = []
    initializers = []
    nodes: list[onnx.NodeProto] = []
    for tensor in spec.tensors.values():
        if tensor.kind == "input":
            shape = [tensor.symbolic.get(i, d) for i, d in enumerate(tensor.dims)]
            inputs.append(
                helper.make_tensor_value_info(tensor.name, ONNX_TYPES[tensor.dtype], shape)
            )
        elif tensor.kind == "initializer":
            assert tensor.value is not None
            initializers.append(numpy_helper.from_array(tensor.value, tensor.name))
        elif tensor.kind == "constant_node":
            assert tensor.value is not None
            nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [tensor.name],
                    name=f"const_{tensor.name}",
                    value=numpy_helper.from_array(tensor.value, tensor.name),
                )
            )
    for node in spec.nodes:
        attrs = [make_attribute(k, v, t) for k, (v, t) in node.attributes.items()]
        proto = helper.make_node(
            node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain or None
        )
        proto.attribute.extend(attrs)
        nodes.append(proto)
    opsets = [helper.make_opsetid("", spec.opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in sorted(spec.extra_opsets.items())]
    ir_version = ir_version_for(spec.opset)
    untyped = [helper.make_value_info(name, onnx.TypeProto()) for name in spec.outputs]
    graph = helper.make_graph(nodes, "instance", inputs, untyped, initializers)
    probe = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=check)
    except Exception as exc:  # onnx raises several types for ill-formed instances
        if check:
            raise Reject(f"onnx shape inference rejects the instance: {_first_line(exc)}") from None
        inferred = probe
    known = {v.name: v for v in inferred.graph.output}
    known.update({v.name: v for v in inferred.graph.value_info})
    outputs = []
    untyped_outputs = []
    for name in spec.outputs:
        found = known.get(name)
        if found is None or not found.type.tensor_type.elem_type:
            untyped_outputs.append(name)
            found = helper.make_tensor_value_info(name, ONNX_TYPES[fallback_dtype], None)
        outputs.append(found)
    graph = helper.make_graph(nodes, "instance", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    if untyped_outputs and check:
        # onnx cannot type ops of other domains (com.microsoft): ask onnxruntime.
        model = _typed_by_running(model, spec, untyped_outputs)
    intermediates = [
        o for n in spec.nodes for o in n.outputs if o and o not in spec.outputs and o not in known
    ]
    if intermediates and check:
        # Guards may read their shapes, as they do in a real graph, where the values a
        # rewrite replaces keep theirs (an nchwc.ReorderOutput's NCHW shape).
        model = _intermediates_typed_by_running(model, spec, intermediates)
    if check:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:
            raise Reject(f"the instance fails the ONNX checker: {_first_line(exc)}") from None
    return model


def _typed_by_running(
    model: onnx.ModelProto, spec: InstanceSpec, names: list[str]
) -> onnx.ModelProto:
    from onnxfuse.proof.runtime import ORT, Runner, RuntimeFailure

    # Run with those outputs untyped: the fallback type may be wrong (a double FusedMatMul).
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for value in probe.graph.output:
        if value.name in names:
            value.type.Clear()
    try:
        results = Runner(ORT).run(probe, make_feeds(spec, 0, sets=1))[0]
    except RuntimeFailure as exc:
        raise Reject(f"onnx cannot infer the type of output {names[0]!r} ({exc})") from None
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for value, result in zip(typed.graph.output, results):
        if value.name in names:
            code = helper.np_dtype_to_tensor_dtype(np.asarray(result).dtype)
            value.CopyFrom(helper.make_tensor_value_info(value.name, code, list(result.shape)))
    return typed


def _intermediates_typed_by_running(
    model: onnx.ModelProto, spec: InstanceSpec, names: list[str]
) -> onnx.ModelProto:
    from onnxfuse.proof.runtime import ORT, Runner, RuntimeFailure

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_value_info(n, onnx.TypeProto()) for n in names)
    try:
        results = Runner(ORT).run(probe, make_feeds(spec, 0, sets=1))[0]
    except RuntimeFailure:
        return model  # left untyped: a guard that needs them cannot be decided
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for name, result in zip(names, results[len(model.graph.output) :]):
        code = helper.np_dtype_to_tensor_dtype(np.asarray(result).dtype)
        typed.graph.value_info.append(
            helper.make_tensor_value_info(name, code, list(np.asarray(result).shape))
        )
    return typed


def make_feeds(spec: InstanceSpec, seed: int, sets: int = 2) -> list[dict[str, np.ndarray]]:
    """Input data: the first set plain, the others with special values where allowed."""
    rng = np.random.default_rng(seed)
    feeds: list[dict[str, np.ndarray]] = []
    for index in range(sets):
        feed = {}
        for tensor in spec.tensors.values():
            if tensor.kind != "input":
                continue
            if tensor.value is not None:
                feed[tensor.name] = tensor.value
                continue
            special = tensor.special if index > 0 else frozenset()
            feed[tensor.name] = random_array(rng, tensor.dtype, tensor.dims, tensor.range, special)
        feeds.append(feed)
    return feeds


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else text)[:300]
