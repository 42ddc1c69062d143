"""Capability files: which ops an execution provider runs, and rule gating.

A target file (``targets/NAME.yaml``, format in docs/targets.md) lists ops as
domain, op type and opset range, with the element types per type variable and
the limits its source states (ranks, attributes, constant inputs). A rule may
fire for a target only if every node its target pattern creates is supported
there: at the model's opset, for the element types of its values, within its
limits. Facts unknown when the rule fires (a dtype inside a model-local
function, the rank of a value the rewrite creates) are not held against it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import onnx.defs

from onnxfuse.errors import OnnxfuseError, SourceError
from onnxfuse.language.yaml_lines import LineList, LineMap, load_yaml
from onnxfuse.ops import element_types, schemas
from onnxfuse.support.heap import collector_paused
from onnxfuse.support.load_cache import cached, file_key
from onnxfuse.targets.facts import NodeFacts, dtype_name, standard_schema
from onnxfuse.targets.params import parse_params, split_spec

OPEN_ENDED = None
# How an entry's notes begin when the provider has no kernel for it and runs the op as
# its ONNX function body, which onnxruntime's partitioner inlines (generator/functions.py).
FUNCTION_BODY_NOTE = "no kernel for these types: run as its ONNX function body"

FILE_KEYS = {
    "name": "the target's name (what --target takes)",
    "description": "one line saying what it is",
    "provider": "the execution provider it describes",
    "source": "where the op list comes from",
    "source_kind": "what kind of source that is",
    "generated_by": "the command that wrote the file",
    "notes": "provider-wide notes, in the source's words",
    "all_ops_of": "domains whose every standard op is supported",
    "preferred_layout": "NCHW or NHWC: the layout the provider runs convolutions in",
    "quantization": "qdq_units: the provider consumes QDQ node units itself (kept intact)",
    "ops": "the supported ops",
}
LAYOUTS = ("NCHW", "NHWC")
# How a provider takes quantized models. `qlinear` (the default): rules may fuse QDQ node
# units into the quantized ops it lists. `qdq_units`: it reads DQ -> op -> Q groups itself
# (QNN, NNAPI, CoreML, ...), so no rewrite may break one.
QUANTIZATION_MODES = ("qlinear", "qdq_units")
OP_KEYS = {"domain", "op", "since", "until", "types", "limits", "signature", "notes"}
LIMIT_KEYS = {
    "max_rank": "largest rank of any input or output",
    "input_rank": "{input index: [allowed ranks]}",
    "spatial_dims": "allowed ranks of input 0 minus 2 (Conv, pools)",
    "input_constant": "input indices that must be constants where present",
    "attributes": "{name: [allowed values]} (null: absent)",
    "min_inputs": "fewest inputs (up to the last present one)",
    "max_inputs": "most inputs (up to the last present one)",
    "max_outputs": "most outputs (up to the last used one)",
}


class TargetError(SourceError):
    """A capability file is malformed: the message names the file and line."""


# Quantized ops whose names say "Integer" or "NBits" rather than "Quant".
_QUANTIZED_OPS = frozenset(
    {"ConvInteger", "MatMulInteger", "MatMulIntegerToFloat", "MatMulNBits", "GatherBlockQuantized"}
)


@dataclass(frozen=True)
class Limits:
    """What a provider accepts beyond op, opset and types (vocabulary: LIMIT_KEYS)."""

    max_rank: int | None = None
    input_rank: tuple[tuple[int, tuple[int, ...]], ...] = ()
    spatial_dims: tuple[int, ...] | None = None
    input_constant: tuple[int, ...] = ()
    attributes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    min_inputs: int | None = None
    max_inputs: int | None = None
    max_outputs: int | None = None

    def violation(self, node: NodeFacts) -> str | None:
        """The first limit the node breaks, or None (unknown facts never break one)."""
        values = [v for v in (*node.inputs, *node.outputs) if v is not None]
        if self.max_rank is not None:
            for value in values:
                if value.rank is not None and value.rank > self.max_rank:
                    return f"rank {value.rank} > max_rank {self.max_rank}"
        for index, ranks in self.input_rank:
            rank = node.input_rank(index)
            if rank is not None and rank not in ranks:
                return f"input {index} has rank {rank}, not one of {list(ranks)}"
        if self.spatial_dims is not None:
            rank = node.input_rank(0)
            if rank is not None and rank - 2 not in self.spatial_dims:
                return f"{rank - 2} spatial dims, not one of {list(self.spatial_dims)}"
        for index in self.input_constant:
            given = node.inputs[index] if index < len(node.inputs) else None
            if given is not None and not given.constant:
                return f"input {index} is not a constant"
        for name, allowed in self.attributes:
            known, value = node.attribute(name)
            if known and not any(_same_attribute(value, a) for a in allowed):
                return f"attribute {name}={value!r}, not one of {list(allowed)}"
        count = node.input_count()
        if self.min_inputs is not None and count < self.min_inputs:
            return f"{count} inputs < min_inputs {self.min_inputs}"
        if self.max_inputs is not None and count > self.max_inputs:
            return f"{count} inputs > max_inputs {self.max_inputs}"
        if self.max_outputs is not None and node.output_count() > self.max_outputs:
            return f"{node.output_count()} outputs > max_outputs {self.max_outputs}"
        return None

    def describe(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key in LIMIT_KEYS:
            value = getattr(self, key)
            if value in (None, ()):
                continue
            if key in ("input_rank", "attributes"):
                value = {k: list(v) for k, v in value}
            found[key] = list(value) if isinstance(value, tuple) else value
        return found


def _same_attribute(value: Any, allowed: Any) -> bool:
    if value is None or allowed is None:
        return value is allowed
    if isinstance(value, float) or isinstance(allowed, float):
        try:  # attributes are stored as float32
            return bool(np.float32(value) == np.float32(allowed))
        except (TypeError, ValueError):
            return False
    return bool(value == allowed)


@dataclass(frozen=True)
class OpSupport:
    domain: str
    op_type: str
    since: int
    until: int | None
    types: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)
    limits: Limits = field(default_factory=Limits, hash=False, compare=False)
    signature: tuple[tuple[str, ...], tuple[str, ...]] | None = field(
        default=None, hash=False, compare=False
    )
    notes: str = field(default="", hash=False, compare=False)

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)

    @property
    def function_body(self) -> bool:
        """No kernel: onnxruntime runs the op by inlining its ONNX function body."""
        return self.notes.startswith(FUNCTION_BODY_NOTE)

    def accepts(self, bound: dict[str, str]) -> bool:
        """Every type variable with a known element type is one this entry lists."""
        return all(
            variable not in self.types or dtype in self.types[variable]
            for variable, dtype in bound.items()
        )


@dataclass
class Target:
    name: str
    description: str
    ops: dict[tuple[str, str], list[OpSupport]]
    all_ops_of: frozenset[str] = frozenset()
    provider: str = ""
    source: str = ""
    notes: list[str] = field(default_factory=list)
    path: Path | None = None
    # Target parameters (``cpu:block=8``), seen by guards as ``target_params``.
    params: dict[str, Any] = field(default_factory=dict)
    # From the file's preferred_layout; NHWC makes ``layout=nhwc`` a default parameter.
    preferred_layout: str = "NCHW"
    quantization: str = QUANTIZATION_MODES[0]

    @property
    def keeps_qdq_units(self) -> bool:
        """The provider consumes QDQ node units itself: every unit stays intact."""
        return self.quantization == "qdq_units"

    @property
    def spec(self) -> str:
        """The name with its parameters, as --target takes it."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    def with_params(self, params: dict[str, Any]) -> Target:
        """The same capabilities with these parameters (replacing any it had)."""
        return dataclasses.replace(self, params=dict(params))

    @property
    def op_count(self) -> int:
        """Distinct (domain, op type) pairs listed."""
        return len(self.ops)

    def quantized_ops(self) -> list[str]:
        """The quantized ops this target lists (QuantizeLinear, QLinearConv, MatMulNBits,
        ...): the standard's if it runs all of them."""
        if "" in self.all_ops_of:
            return ["DequantizeLinear", "QuantizeLinear", "QLinearConv"]
        return sorted(
            op_type
            for _, op_type in self.ops
            if "Quant" in op_type or op_type.startswith("QLinear") or op_type in _QUANTIZED_OPS
        )

    def supports(self, domain: str, op_type: str, opset: int) -> bool:
        """Whether some entry runs the op at this opset (types and limits aside)."""
        if domain in self.all_ops_of:
            return standard_schema(domain, op_type, opset) is not None or (
                domain not in schemas.ONNX_DOMAINS
            )
        return any(s.covers(opset) for s in self.ops.get((domain, op_type), ()))

    def check_node(self, node: NodeFacts) -> str | None:
        """Why this target cannot run the node, or None if it can."""
        if node.domain in self.all_ops_of:
            return self._check_standard(node)
        entries = [s for s in self.ops.get((node.domain, node.op_type), ()) if s.covers(node.opset)]
        if not entries:
            return f"{node.label()} at opset {node.opset}"
        bound = node.type_bindings(self.signature(node.domain, node.op_type, node.opset))
        typed = [s for s in entries if s.accepts(bound)]
        if not typed:
            types = ", ".join(f"{k}={v}" for k, v in sorted(bound.items()))
            return f"{node.label()} for {types}"
        problems = [s.limits.violation(node) for s in typed]
        if any(p is None for p in problems):
            return None
        return f"{node.label()} ({problems[0]})"

    def runs_inlined(self, node: NodeFacts) -> bool:
        """The target runs the node, but only as its ONNX function body: every entry that
        accepts it has no kernel (a fusion into it is undone when the model is loaded)."""
        if node.domain in self.all_ops_of:
            return False
        bound = node.type_bindings(self.signature(node.domain, node.op_type, node.opset))
        running = [
            s
            for s in self.ops.get((node.domain, node.op_type), ())
            if s.covers(node.opset) and s.accepts(bound) and s.limits.violation(node) is None
        ]
        return bool(running) and all(s.function_body for s in running)

    def _check_standard(self, node: NodeFacts) -> str | None:
        if node.domain not in schemas.ONNX_DOMAINS:
            return None
        schema = standard_schema(node.domain, node.op_type, node.opset)
        if schema is None:
            return f"{node.label()} at opset {node.opset} (not a standard op there)"
        bound = node.type_bindings(_formal_types(schema))
        allowed = {
            c.type_param_str: {_short(t) for t in c.allowed_type_strs}
            for c in schema.type_constraints
        }
        wrong = {k: v for k, v in bound.items() if k in allowed and v not in allowed[k]}
        if wrong:
            types = ", ".join(f"{k}={v}" for k, v in sorted(wrong.items()))
            return f"{node.label()} for {types}"
        return None

    def signature(
        self, domain: str, op_type: str, opset: int
    ) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """Formal inputs/outputs as type strings: onnx's schema, else the file's own."""
        schema = standard_schema(domain, op_type, opset)
        if schema is not None:
            return _formal_types(schema)
        for support in self.ops.get((domain, op_type), ()):
            if support.signature is not None:
                return support.signature
        return None

    def unsupported(self, kernels: Iterable[NodeFacts]) -> list[str]:
        """What this target cannot run among the nodes a firing would leave in the graph
        (``ReplacementPlan.kernels``), each problem once."""
        missing: list[str] = []
        for node in kernels:
            problem = self.check_node(node)
            if problem is not None and problem not in missing:
                missing.append(problem)
        return missing


def _short(type_name: str) -> str:
    if type_name.startswith("tensor(") and type_name.endswith(")"):
        return type_name[len("tensor(") : -1]
    return type_name


def _formal_types(schema: onnx.defs.OpSchema) -> tuple[tuple[str, ...], tuple[str, ...]]:
    def describe(formals: Any) -> tuple[str, ...]:
        return tuple(f.type_str + ("..." if f.option == f.option.Variadic else "") for f in formals)

    return describe(schema.inputs), describe(schema.outputs)


# -- loading ------------------------------------------------------------------------


def builtin_targets_dir() -> Path:
    return Path(str(resources.files("onnxfuse.builtin_targets")))


def builtin_target_names() -> list[str]:
    return sorted(p.stem for p in builtin_targets_dir().glob("*.yaml"))


def resolve_target(target: Target | str | None) -> Target | None:
    if target is None or isinstance(target, Target):
        return target
    return load_target(target)


@functools.cache
def load_target(name_or_path: str) -> Target:
    """A built-in target by name, or a capability file by path (.yaml/.yml),
    optionally with parameters: ``cpu:block=8`` (see ``target_params``)."""
    base, spec = split_spec(name_or_path)
    if spec is not None:
        target = load_target(base)
        return target.with_params({**target.params, **parse_params(target.name, spec)})
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = builtin_targets_dir() / f"{name_or_path}.yaml"
        if not path.exists():
            known = ", ".join(builtin_target_names())
            raise OnnxfuseError(f"unknown target '{name_or_path}' (known: {known})")
    if path.exists() and not path.is_file():
        raise TargetError("not a regular file", path)
    try:
        content = path.read_bytes()
        # As read_text would: universal newlines.
        text = content.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetError(f"cannot read target file: {exc}", path) from None
    with collector_paused():
        # Keyed by the very bytes parsed: no later edit can slip in between.
        return cached(
            "target", lambda: file_key(path, content), lambda: _parse_target_text(text, path)
        )


def _parse_target_text(text: str, path: Path) -> Target:
    try:
        data = load_yaml(text)
    except SourceError as exc:
        raise TargetError(exc.message, path, exc.line) from None
    return parse_target(data, path)


def parse_target(data: Any, path: Path) -> Target:
    if not isinstance(data, LineMap) or "name" not in data:
        raise TargetError("a target file is a mapping with 'name' and 'ops'", path, 1)
    for key in data:
        if key not in FILE_KEYS:
            known = ", ".join(FILE_KEYS)
            raise TargetError(f"unknown key '{key}' (known: {known})", path, data.line_of(key))
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise TargetError("'name' must be a non-empty string", path, data.line_of("name"))
    entries = data.get("ops")
    if entries is None:
        entries = LineList()
        entries.item_lines = []
    if not isinstance(entries, LineList):
        raise TargetError("'ops' must be a list of op entries", path, data.line_of("ops"))
    ops: dict[tuple[str, str], list[OpSupport]] = {}
    for entry, line in zip(entries, entries.item_lines):
        support = _parse_op(entry, path, line)
        ops.setdefault((support.domain, support.op_type), []).append(support)
    domains = data.get("all_ops_of") or []
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise TargetError(
            "'all_ops_of' must be a list of domains", path, data.line_of("all_ops_of")
        )
    notes = data.get("notes") or []
    layout = data.get("preferred_layout", "NCHW")
    if layout not in LAYOUTS:
        raise TargetError(
            f"'preferred_layout' must be NCHW or NHWC, got {layout!r}",
            path,
            data.line_of("preferred_layout"),
        )
    quantization = data.get("quantization", QUANTIZATION_MODES[0])
    if quantization not in QUANTIZATION_MODES:
        raise TargetError(
            f"'quantization' must be one of {', '.join(QUANTIZATION_MODES)}, got {quantization!r}",
            path,
            data.line_of("quantization"),
        )
    return Target(
        name=name,
        description=str(data.get("description", "")),
        ops=ops,
        all_ops_of=frozenset(domains),
        provider=str(data.get("provider", "")),
        source=str(data.get("source", "")),
        notes=[str(n) for n in notes] if isinstance(notes, list) else [str(notes)],
        path=path,
        params={"layout": "nhwc"} if layout == "NHWC" else {},
        preferred_layout=layout,
        quantization=quantization,
    )


def _parse_op(entry: Any, path: Path, line: int) -> OpSupport:
    if not isinstance(entry, LineMap) or not isinstance(entry.get("op"), str):
        raise TargetError(f"an op entry needs 'op' (an op type), got {entry!r}", path, line)
    for key in entry:
        if key not in OP_KEYS:
            known = ", ".join(sorted(OP_KEYS))
            raise TargetError(
                f"op '{entry['op']}': unknown key '{key}' (known: {known})",
                path,
                entry.line_of(key),
            )
    where = f"op '{entry['op']}'"
    since, until = entry.get("since", 1), entry.get("until")
    if not _is_int(since) or not (until is None or _is_int(until)):
        raise TargetError(f"{where}: 'since'/'until' must be integers (or null)", path, line)
    types = entry.get("types") or {}
    if not isinstance(types, dict) or not all(
        isinstance(v, list) and all(isinstance(t, str) for t in v) for v in types.values()
    ):
        raise TargetError(
            f"{where}: 'types' maps type variables to lists of element types",
            path,
            entry.line_of("types"),
        )
    _check_types(types, where, path, entry)
    return OpSupport(
        domain=str(entry.get("domain") or ""),
        op_type=entry["op"],
        since=int(since),
        until=None if until is None else int(until),
        types={str(k): list(v) for k, v in types.items()},
        limits=_parse_limits(entry.get("limits"), f"{where} limits", path, entry),
        signature=_parse_signature(entry.get("signature"), where, path, entry),
        notes=str(entry.get("notes") or ""),
    )


def _check_types(types: dict[str, Any], where: str, path: Path, entry: LineMap) -> None:
    """Every type a `types` list names is an element type as ONNX spells it ('float',
    not 'float32'), or a container of them as onnxruntime's registry writes one
    ('seq(tensor(float))'): an entry naming another would never accept a node."""
    for variable, listed in types.items():
        at = types.line_of(variable) if isinstance(types, LineMap) else None
        lines = getattr(listed, "item_lines", None) or []
        for index, type_str in enumerate(listed):
            problem = _type_problem(type_str)
            if problem is not None:
                line = lines[index] if index < len(lines) else None
                raise TargetError(problem, path, line or at or entry.line_of("types"))


_CONTAINERS = ("seq(", "optional(", "sparse_tensor(", "tensor(", "map(")


def _type_problem(type_str: str, inner: bool = False) -> str | None:
    """What is wrong with a type of a `types` list (None: nothing). At the top an
    element type stands alone; inside a container it is written tensor(T)."""
    text = type_str.strip()
    for prefix in _CONTAINERS:
        if not (text.startswith(prefix) and text.endswith(")")):
            continue
        body = text[len(prefix) : -1]
        if prefix == "tensor(":
            if not inner:  # an element type is listed bare: 'float', not 'tensor(float)'
                return element_types.unknown(type_str)
            return _element_problem(body)
        if prefix == "sparse_tensor(":
            return _element_problem(body)
        if prefix == "map(":
            key, comma, value = body.partition(",")
            if not comma:
                return f"type '{type_str}': a map is map(key type, value type)"
            return _element_problem(key) or _type_problem(value, inner=True)
        return _type_problem(body, inner=True)
    return _element_problem(text)  # a map's value may be bare too: map(int64,float)


def _element_problem(name: str) -> str | None:
    text = name.strip()
    return None if element_types.is_name(text) else element_types.unknown(text)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_list(value: Any) -> bool:
    """A list of counts or indices: ints, none negative."""
    return isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)


def _parse_limits(raw: Any, where: str, path: Path, entry: LineMap) -> Limits:
    if raw is None:
        return Limits()
    line = entry.line_of("limits")
    if not isinstance(raw, dict):
        raise TargetError(f"{where}: a mapping of limits", path, line)
    for key in raw:
        if key not in LIMIT_KEYS:
            known = ", ".join(LIMIT_KEYS)
            raise TargetError(f"{where}: unknown limit '{key}' (known: {known})", path, line)

    def bad(key: str) -> TargetError:
        return TargetError(f"{where}: '{key}' must be {LIMIT_KEYS[key]}", path, line)

    counts: dict[str, int | None] = {}
    for key in ("max_rank", "min_inputs", "max_inputs", "max_outputs"):
        value = raw.get(key)
        if value is not None and (not _is_int(value) or value < 0):
            raise bad(key)
        counts[key] = value
    ranks = raw.get("input_rank") or {}
    if not isinstance(ranks, dict) or not all(
        _is_int(k) and k >= 0 and _int_list(v) for k, v in ranks.items()
    ):
        raise bad("input_rank")
    spatial = raw.get("spatial_dims")
    if spatial is not None and not _int_list(spatial):
        raise bad("spatial_dims")
    constant = raw.get("input_constant") or []
    if not _int_list(constant):
        raise bad("input_constant")
    attributes = raw.get("attributes") or {}
    if not isinstance(attributes, dict) or not all(
        isinstance(v, list) for v in attributes.values()
    ):
        raise bad("attributes")
    return Limits(
        max_rank=counts["max_rank"],
        input_rank=tuple((int(k), tuple(v)) for k, v in sorted(ranks.items())),
        spatial_dims=None if spatial is None else tuple(spatial),
        input_constant=tuple(constant),
        attributes=tuple((str(k), tuple(v)) for k, v in attributes.items()),
        min_inputs=counts["min_inputs"],
        max_inputs=counts["max_inputs"],
        max_outputs=counts["max_outputs"],
    )


def _parse_signature(
    raw: Any, where: str, path: Path, entry: LineMap
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    if raw is None:
        return None
    ok = isinstance(raw, dict) and set(raw) <= {"inputs", "outputs"}
    ok = ok and all(
        isinstance(raw.get(k, []), list) and all(isinstance(t, str) for t in raw.get(k, []))
        for k in ("inputs", "outputs")
    )
    if not ok:
        raise TargetError(
            f"{where}: 'signature' is {{inputs: [type strings], outputs: [type strings]}}",
            path,
            entry.line_of("signature"),
        )
    return tuple(raw.get("inputs", [])), tuple(raw.get("outputs", []))


__all__ = [
    "Limits",
    "NodeFacts",
    "OpSupport",
    "Target",
    "TargetError",
    "builtin_target_names",
    "builtin_targets_dir",
    "dtype_name",
    "load_target",
    "resolve_target",
]
