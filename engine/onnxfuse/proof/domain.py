"""A rule's verification domain: the ``verify:`` mapping, parsed and checked.

The domain says which concrete instances of the rule's source pattern its
property test draws: opsets, dtypes, named dimensions and other draws, the
shape, dtype and constness of every pattern variable, attribute values,
special values, a tolerance override, and mutations that must not fire.
The format is documented in docs/rules.md ("Verification domain").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnxfuse.errors import SourceError
from onnxfuse.language.pattern import AttrRef
from onnxfuse.language.rule import Rule
from onnxfuse.language.yaml_lines import LineMap
from onnxfuse.ops import element_types, schemas
from onnxfuse.proof.expr import Expr, ExprError, parse_expr

# The element types an instance may be drawn in (ONNX's names, as everywhere).
DTYPES = (*element_types.FLOATS, *element_types.INTEGERS, *element_types.PACKED_INTEGERS, "bool")
FLOAT_DTYPES = frozenset(element_types.FLOATS)
SPECIAL_KINDS = ("nan", "inf", "neg_zero", "subnormal", "large")

# torch.testing.assert_close's defaults: (rtol, atol). Integers and bool: exact.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "double": (1e-7, 1e-7),
}
DEFAULT_OPSET = 17

_DOMAIN_KEYS = {
    "opsets": "ai.onnx opsets to build instances at",
    "dtypes": "instance element types (T)",
    "dims": "named draws: dimensions, ranks, lists, bounds",
    "where": "conditions on the draws",
    "attributes": "values of the source's attribute variables",
    "node_attributes": "extra attributes of copy_attributes nodes",
    "inputs": "shape, dtype, constness and values of each variable",
    "symbolic": "dimension names that may become symbolic in graph inputs",
    "special_values": "NaN, inf, -0.0, subnormal, large values in data",
    "tolerance": "a looser comparison tolerance, with a reason",
    "negatives": "mutations of an instance that must not fire",
    "target_params": (
        "target parameters instances are optimized with, as the command line reads them "
        "(cpu: {block: auto}, the block size this machine's onnxruntime kernels use)"
    ),
    "target": "the target instances are optimized for, where not the check's (cuda)",
}
_VAR_KEYS = {"shape", "shapes", "dtype", "constant", "present", "value", "range", "reason"}
_NEGATIVE_KEYS = {
    "input",
    "attribute",
    "dtype",
    "value",
    "constant",
    "present",
    "shape",
    "when",
    "reason",
}
_RANGE = re.compile(r"^\s*(.+?)\s*\.\.\s*(.+?)\s*$")


class VerifyError(SourceError):
    """A rule's verification domain is missing or malformed; placed at the rule."""


# -- draw specs --------------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    value: Any


@dataclass(frozen=True)
class Computed:
    expr: Expr


@dataclass(frozen=True)
class Range:
    low: Expr
    high: Expr


@dataclass(frozen=True)
class OneOf:
    options: tuple[Spec, ...]


@dataclass(frozen=True)
class ListOf:
    rank: Spec
    each: Spec


@dataclass(frozen=True)
class Permutation:
    size: Spec


@dataclass(frozen=True)
class Subset:
    pool: Spec
    size: Spec


@dataclass(frozen=True)
class Broadcast:
    shape: Spec


Spec = Literal | Computed | Range | OneOf | ListOf | Permutation | Subset | Broadcast

# A shape: one expression for the whole shape, or entries (ints or expressions
# giving an int or a list of ints, spliced in place).
ShapeSpec = Expr | tuple[int | Expr, ...]


@dataclass
class VarSpec:
    name: str
    shapes: list[ShapeSpec] | None = None
    dtypes: list[str] | None = None  # None: the instance dtype
    constant: Spec | None = None
    present: Spec | None = None
    value: Spec | None = None
    # Random values in [low, high] only: NaN, infinities and values outside are left
    # out, for ``reason`` (the derived negative cases try them).
    range: tuple[float, float] | None = None
    reason: str = ""


@dataclass
class Negative:
    """A change to a firing instance after which the rule must not fire."""

    description: str
    input: str | None = None
    attribute: str | None = None
    dtype: str | None = None
    value: Spec | None = None
    constant: bool | None = None
    present: bool | None = None
    shape: ShapeSpec | None = None
    when: Expr | None = None
    reason: str = ""


@dataclass
class Domain:
    rule: str
    opsets: list[int]
    dtypes: list[str]
    dims: dict[str, Spec] = field(default_factory=dict)
    where: list[Expr] = field(default_factory=list)
    attributes: dict[str, Spec] = field(default_factory=dict)
    node_attributes: dict[str, dict[str, Spec]] = field(default_factory=dict)
    inputs: dict[str, VarSpec] = field(default_factory=dict)
    symbolic: list[str] = field(default_factory=list)
    special_inputs: frozenset[str] = frozenset(SPECIAL_KINDS)
    special_constants: frozenset[str] = frozenset(SPECIAL_KINDS)
    special_reason: str = ""
    # The rule changes the result on the excluded special values of graph inputs, as
    # onnxruntime's own rewrite does (the reason says how): the graph fuzzer then
    # compares it on plain inputs only.
    special_differs: bool = False
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    tolerance_reason: str = ""
    # Integer outputs (quantized values) may differ by this many quantization steps.
    steps: int = 0
    negatives: list[Negative] = field(default_factory=list)
    target_params: dict[str, Any] = field(default_factory=dict)
    target: str | None = None

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(rtol, atol) for outputs of this element type; an integer type's atol is the
        number of quantization steps its values may move."""
        if dtype in element_types.INTEGERS:
            return 0.0, float(self.steps)
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0)))


# -- parsing -----------------------------------------------------------------------


def parse_domain(rule: Rule) -> Domain:
    """The rule's verification domain; VerifyError if it is missing or malformed."""
    raw = rule.verify
    where = f"rule '{rule.name}'"
    if not raw:
        raise VerifyError(f"{where}: no verification domain (a 'verify:' mapping)", *rule.place)
    try:
        domain = _parse(rule, raw)
        _check_against_rule(rule, domain)
    except (ExprError, VerifyError) as exc:
        path, line = rule.place
        if isinstance(exc, VerifyError) and exc.line is not None:
            line = exc.line  # the line of the entry at fault, inside the rule
        message = exc.message if isinstance(exc, VerifyError) else str(exc)
        raise VerifyError(f"{where}: verify: {message}", path, line) from None
    return domain


def _parse(rule: Rule, raw: dict[str, Any]) -> Domain:
    for key in raw:
        if key not in _DOMAIN_KEYS:
            raise VerifyError(f"unknown key '{key}' (expected one of: {', '.join(_DOMAIN_KEYS)})")
    dtypes = _dtype_list(raw.get("dtypes"), "dtypes")
    if not dtypes:
        raise VerifyError("'dtypes' must list at least one element type")
    domain = Domain(rule=rule.name, opsets=_opsets(rule, raw.get("opsets")), dtypes=dtypes)
    domain.dims = {str(k): parse_spec(v, f"dims.{k}") for k, v in _mapping(raw, "dims").items()}
    domain.where = [parse_expr(text) for text in _string_list(raw.get("where"), "where")]
    domain.attributes = {
        str(k): parse_spec(v, f"attributes.{k}") for k, v in _mapping(raw, "attributes").items()
    }
    for node, attrs in _mapping(raw, "node_attributes").items():
        if not isinstance(attrs, dict):
            raise VerifyError(f"node_attributes.{node} must map attribute names to values")
        domain.node_attributes[str(node)] = {
            str(k): parse_spec(v, f"node_attributes.{node}.{k}") for k, v in attrs.items()
        }
    inputs = _mapping(raw, "inputs")
    for name, spec in inputs.items():
        try:
            domain.inputs[str(name)] = _var_spec(str(name), spec)
        except VerifyError as exc:
            line = inputs.line_of(str(name)) if isinstance(inputs, LineMap) else None
            raise VerifyError(exc.message, None, exc.line or line) from None
    domain.symbolic = _string_list(raw.get("symbolic"), "symbolic")
    _special_values(domain, raw.get("special_values", True))
    _tolerance(domain, raw.get("tolerance"))
    negatives = raw.get("negatives", [])
    if not isinstance(negatives, list):
        raise VerifyError("'negatives' must be a list of mutations")
    domain.negatives = [_negative(entry, i) for i, entry in enumerate(negatives)]
    domain.target_params = dict(_mapping(raw, "target_params"))
    target = raw.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        raise VerifyError("'target' must be a target name")
    domain.target = target
    return domain


def parse_spec(raw: Any, where: str) -> Spec:
    """A draw spec: literal, expression, 'lo..hi' range, list (one of), or a mapping."""
    if raw is None or isinstance(raw, (bool, int, float)):
        return Literal(raw)
    if isinstance(raw, str):
        try:
            return Computed(parse_expr(raw))
        except ExprError as exc:
            match = _RANGE.match(raw)  # "lo..hi" is never a valid expression
            if match is None:
                raise VerifyError(f"{where}: {exc}") from None
            return Range(_expr(match.group(1), where), _expr(match.group(2), where))
    if isinstance(raw, list):
        if not raw:
            raise VerifyError(f"{where}: an empty list offers nothing to choose from")
        return OneOf(tuple(parse_spec(item, where) for item in raw))
    if isinstance(raw, dict):
        keys = set(raw)
        if keys == {"rank", "each"}:
            return ListOf(parse_spec(raw["rank"], where), parse_spec(raw["each"], where))
        if keys == {"permutation"}:
            return Permutation(parse_spec(raw["permutation"], where))
        if keys == {"subset", "size"}:
            return Subset(parse_spec(raw["subset"], where), parse_spec(raw["size"], where))
        if keys == {"broadcast"}:
            return Broadcast(parse_spec(raw["broadcast"], where))
        raise VerifyError(
            f"{where}: a mapping must be {{rank, each}}, {{permutation}}, {{subset, size}} "
            f"or {{broadcast}}, not {{{', '.join(map(str, raw))}}}"
        )
    raise VerifyError(f"{where}: unexpected {type(raw).__name__} {raw!r}")


def _expr(text: str, where: str) -> Expr:
    try:
        return parse_expr(str(text))
    except ExprError as exc:
        raise VerifyError(f"{where}: {exc}") from None


def parse_shape(raw: Any, where: str) -> ShapeSpec:
    if isinstance(raw, str):
        return _expr(raw, where)
    if not isinstance(raw, list):
        raise VerifyError(f"{where}: a shape is a list of dimensions or an expression")
    entries: list[int | Expr] = []
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise VerifyError(f"{where}: shape entry {item!r} must be an integer or an expression")
        entries.append(item if isinstance(item, int) else _expr(item, where))
    return tuple(entries)


def _var_spec(name: str, raw: Any) -> VarSpec:
    where = f"inputs.{name}"
    if isinstance(raw, (list, str)):
        return VarSpec(name, shapes=[parse_shape(raw, where)])
    if not isinstance(raw, dict):
        raise VerifyError(
            f"{where}: expected a shape or a mapping of {', '.join(sorted(_VAR_KEYS))}"
        )
    for key in raw:
        if key not in _VAR_KEYS:
            raise VerifyError(
                f"{where}: unknown key '{key}' (expected: {', '.join(sorted(_VAR_KEYS))})"
            )
    spec = VarSpec(name)
    if "shape" in raw and "shapes" in raw:
        raise VerifyError(f"{where}: give 'shape' or 'shapes', not both")
    if "shape" in raw:
        spec.shapes = [parse_shape(raw["shape"], f"{where}.shape")]
    if "shapes" in raw:
        if not isinstance(raw["shapes"], list) or not raw["shapes"]:
            raise VerifyError(f"{where}.shapes: a non-empty list of shapes")
        spec.shapes = [parse_shape(s, f"{where}.shapes") for s in raw["shapes"]]
    if "dtype" in raw:
        spec.dtypes = _dtype_list(raw["dtype"], f"{where}.dtype")
    for key in ("constant", "present", "value"):
        if key in raw:
            setattr(spec, key, parse_spec(raw[key], f"{where}.{key}"))
    if "range" in raw:
        bounds = raw["range"]
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
            or bounds[0] > bounds[1]
        ):
            raise VerifyError(f"{where}.range: expected [low, high] numbers")
        spec.range = (float(bounds[0]), float(bounds[1]))
        spec.reason = " ".join(str(raw.get("reason", "")).split())
        if not spec.reason:
            raise VerifyError(
                f"{where}.range: narrowing the values (which leaves NaN, infinities and "
                f"values outside [{bounds[0]}, {bounds[1]}] out) needs a reason: "
                f"{name}: {{..., range: [...], reason: ...}}"
            )
    elif "reason" in raw:
        raise VerifyError(f"{where}.reason: a reason is for a 'range'")
    if spec.shapes is None and spec.value is None:
        raise VerifyError(f"{where}: give a 'shape' (or 'shapes', or a 'value')")
    return spec


def _negative(raw: Any, index: int) -> Negative:
    where = f"negatives[{index}]"
    if not isinstance(raw, dict):
        raise VerifyError(f"{where}: expected a mapping")
    for key in raw:
        if key not in _NEGATIVE_KEYS:
            raise VerifyError(
                f"{where}: unknown key '{key}' (expected: {', '.join(sorted(_NEGATIVE_KEYS))})"
            )
    negative = Negative(description="", reason=str(raw.get("reason", "")))
    targets = [k for k in ("input", "attribute") if k in raw]
    if len(targets) > 1:
        raise VerifyError(f"{where}: name one 'input' or one 'attribute'")
    if "input" in raw:
        negative.input = str(raw["input"])
    if "attribute" in raw:
        negative.attribute = str(raw["attribute"])
        if "value" not in raw:
            raise VerifyError(f"{where}: an attribute mutation needs a 'value'")
    if "dtype" in raw:
        negative.dtype = _dtype_list(raw["dtype"], f"{where}.dtype")[0]
    if "value" in raw:
        negative.value = parse_spec(raw["value"], f"{where}.value")
    if "constant" in raw:
        negative.constant = bool(raw["constant"])
    if "present" in raw:
        negative.present = bool(raw["present"])
    if "shape" in raw:
        negative.shape = parse_shape(raw["shape"], f"{where}.shape")
    if "when" in raw:
        negative.when = _expr(raw["when"], f"{where}.when")
    changes = [k for k in ("dtype", "value", "constant", "present", "shape") if k in raw]
    if not changes:
        raise VerifyError(f"{where}: change something (dtype, value, constant, present or shape)")
    if negative.input is None and negative.attribute is None and changes != ["dtype"]:
        raise VerifyError(f"{where}: without 'input' or 'attribute' only 'dtype' can change")
    subject = negative.input or negative.attribute or "instance"
    negative.description = f"{subject}: " + ", ".join(f"{k}={raw[k]!r}" for k in changes)
    return negative


def _opsets(rule: Rule, raw: Any) -> list[int]:
    low, high = rule.opset.get("", (None, None))
    if raw is None:
        default = DEFAULT_OPSET
        if low is not None and default < low:
            default = low
        if high is not None and default > high:
            default = high
        return [default]
    values = raw if isinstance(raw, list) else [raw]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise VerifyError("'opsets' must be an opset or a list of them")
    newest = onnx.defs.onnx_opset_version()
    for value in values:
        if (low is not None and value < low) or (high is not None and value > high):
            raise VerifyError(f"opset {value} is outside the rule's opset range [{low}, {high}]")
        if not 1 <= value <= newest:
            raise VerifyError(f"opset {value} is not one onnx knows (1 to {newest})")
    return list(values)


def _dtype_list(raw: Any, where: str) -> list[str]:
    values = raw if isinstance(raw, list) else [raw] if raw is not None else []
    result = []
    for value in values:
        if value in DTYPES:
            result.append(str(value))
        elif element_types.is_name(value):
            raise VerifyError(
                f"{where}: instances are not drawn in {value} (element types: {', '.join(DTYPES)})"
            )
        else:
            raise VerifyError(f"{where}: {element_types.unknown(value)}")
    return result


def _mapping(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {}) or {}
    if not isinstance(value, dict):
        raise VerifyError(f"'{key}' must be a mapping")
    return value


def _string_list(raw: Any, key: str) -> list[str]:
    if raw is None:
        return []
    values = [raw] if isinstance(raw, str) else raw
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise VerifyError(f"'{key}' must be a string or a list of strings")
    return list(values)


def _kinds(raw: Any, key: str) -> frozenset[str]:
    if raw in (True, "all"):
        return frozenset(SPECIAL_KINDS)
    if raw in (False, "none", None):
        return frozenset()
    values = raw if isinstance(raw, list) else [raw]
    for value in values:
        if value not in SPECIAL_KINDS:
            raise VerifyError(
                f"special_values.{key}: unknown kind {value!r} "
                f"(known: {', '.join(SPECIAL_KINDS)}, or all / none)"
            )
    return frozenset(values)


def _special_values(domain: Domain, raw: Any) -> None:
    reason = ""
    if isinstance(raw, bool):
        inputs = constants = _kinds(raw, "inputs")
    elif isinstance(raw, dict):
        for key in raw:
            if key not in ("inputs", "constants", "reason", "differs"):
                raise VerifyError(
                    f"special_values: unknown key '{key}' (inputs, constants, reason, differs)"
                )
        differs = raw.get("differs", False)
        if not isinstance(differs, bool):
            raise VerifyError("special_values.differs: true or false")
        domain.special_differs = differs
        inputs = _kinds(raw.get("inputs", "all"), "inputs")
        constants = _kinds(raw.get("constants", "all"), "constants")
        reason = str(raw.get("reason", "")).strip()
    else:
        raise VerifyError("special_values: true, false, or {inputs, constants, reason}")
    if (inputs != frozenset(SPECIAL_KINDS) or constants != frozenset(SPECIAL_KINDS)) and not reason:
        raise VerifyError(
            "special_values: excluding special values needs a reason "
            "(special_values: {inputs: ..., constants: ..., reason: ...})"
        )
    domain.special_inputs, domain.special_constants, domain.special_reason = (
        inputs,
        constants,
        reason,
    )


def _tolerance(domain: Domain, raw: Any) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise VerifyError(
            "tolerance: {rtol, atol, reason}, {<dtype>: {rtol, atol}, reason} or {steps, reason}"
        )
    reason = str(raw.get("reason", "")).strip()
    if not reason:
        raise VerifyError("tolerance: a tolerance override needs a 'reason'")
    domain.tolerance_reason = reason
    overall = {k: raw[k] for k in ("rtol", "atol") if k in raw}
    steps = raw.get("steps", 0)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise VerifyError("tolerance.steps: a count of quantization steps (0, 1, ...)")
    domain.steps = steps
    for key, value in raw.items():
        if key in ("rtol", "atol", "reason", "steps"):
            continue
        if key not in DEFAULT_TOLERANCES:
            if not element_types.is_name(key) and element_types.suggest(key) is not None:
                raise VerifyError(f"tolerance: {element_types.unknown(key)}")
            raise VerifyError(
                f"tolerance: unknown key '{key}' (rtol, atol, steps, reason, or a float type: "
                f"{', '.join(DEFAULT_TOLERANCES)})"
            )
        if not isinstance(value, dict) or not set(value) <= {"rtol", "atol"}:
            raise VerifyError(f"tolerance.{key}: expected {{rtol, atol}}")
        domain.tolerances[key] = _pair(key, value)
    if overall:
        for dtype in DEFAULT_TOLERANCES:
            domain.tolerances.setdefault(dtype, _pair(dtype, overall))


def _pair(dtype: str, raw: dict[str, Any]) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOLERANCES[dtype]
    try:
        rtol = float(raw.get("rtol", rtol))
        atol = float(raw.get("atol", atol))
    except (TypeError, ValueError):
        raise VerifyError(f"tolerance.{dtype}: rtol and atol must be numbers") from None
    if not (0 <= rtol < 1 and atol >= 0):
        raise VerifyError(f"tolerance.{dtype}: need 0 <= rtol < 1 and atol >= 0")
    return rtol, atol


# -- consistency with the rule -------------------------------------------------------


def latest_schema(domain: str, op_type: str):
    """The newest schema of an op, or None for domains onnx does not define."""
    versions = schemas.schemas_in_range(domain, op_type, None, None)
    return versions[-1] if versions else None


def _check_against_rule(rule: Rule, domain: Domain) -> None:
    variables = set(rule.sources[0].input_names())
    reserved = {"opset", "dt", "alternative"}
    seen: dict[str, str] = {}
    for kind, names in (
        ("a variable", variables),
        ("a dimension", domain.dims),
        ("an attribute variable", domain.attributes),
    ):
        for name in names:
            if name in reserved:
                raise VerifyError(
                    f"'{name}' is reserved (opset, dt and alternative are drawn first)"
                )
            if name in seen:
                raise VerifyError(f"'{name}' is both {seen[name]} and {kind}: rename one")
            seen[name] = kind
    constants = {
        name
        for source in rule.sources
        for name, value in source.values.items()
        if value.kind == "constant"
    }
    for name in domain.inputs:
        if name not in variables and name not in constants:
            raise VerifyError(
                f"inputs.{name}: not a variable of the source "
                f"(variables: {', '.join(sorted(variables))})"
            )
    for name in sorted(variables):
        if name not in domain.inputs and name not in rule.optional:
            raise VerifyError(f"inputs: no shape for variable '{name}'")
    for name, spec in domain.inputs.items():
        if spec.present is not None and name not in rule.optional:
            raise VerifyError(f"inputs.{name}.present: '{name}' is not an optional variable")
    attribute_vars = set(rule.sources[0].attribute_vars)
    for name in domain.attributes:
        if name not in attribute_vars:
            raise VerifyError(
                f"attributes.{name}: not an attribute variable of the source "
                f"(attribute variables: {', '.join(sorted(attribute_vars)) or 'none'})"
            )
    for name in attribute_vars - set(domain.attributes):
        for source in rule.sources:
            for node in source.nodes:
                for attr_name, attribute in node.attributes.items():
                    if not (isinstance(attribute, AttrRef) and attribute.var == name):
                        continue
                    schema = latest_schema(node.domain, node.op_type)
                    if (
                        schema is not None
                        and attr_name in schema.attributes
                        and schema.attributes[attr_name].required
                    ):
                        raise VerifyError(
                            f"attributes: '{name}' binds the required attribute "
                            f"{node.op_type}.{attr_name}: give it values"
                        )
    for value_name, attrs in domain.node_attributes.items():
        if value_name not in rule.copy_attributes:
            raise VerifyError(
                f"node_attributes.{value_name}: only nodes named in copy_attributes accept "
                "attributes the pattern does not name"
            )
        # With alternatives (Conv or FusedConv), an attribute one of them has is
        # drawn for that one (an expression on `alternative` leaves it out elsewhere).
        for attr_name in attrs:
            missing = []
            for source in rule.sources:
                producer = source.values[value_name].producer
                assert producer is not None
                schema = latest_schema(producer.domain, producer.op_type)
                if schema is not None and attr_name not in schema.attributes:
                    missing.append(producer.op_type)
            if len(missing) == len(rule.sources):
                raise VerifyError(
                    f"node_attributes.{value_name}: {missing[0]} has no attribute '{attr_name}'"
                )
    for negative in domain.negatives:
        if negative.input is not None and negative.input not in variables | constants:
            raise VerifyError(f"negatives: '{negative.input}' is not a variable of the source")
        if negative.attribute is not None and negative.attribute not in attribute_vars:
            raise VerifyError(f"negatives: '{negative.attribute}' is not an attribute variable")
