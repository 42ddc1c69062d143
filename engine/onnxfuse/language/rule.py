"""Rules: source patterns, a replacement pattern, guards and metadata."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.parser

from onnxfuse.errors import RuleError
from onnxfuse.language import opsets
from onnxfuse.language.guards import Guard, GuardUnknown, parse_guard
from onnxfuse.language.pattern import (
    COMMUTATIVE_OPS,
    AttrLiteral,
    AttrRef,
    Pattern,
    compile_function,
    normalize_domain,
)
from onnxfuse.ops import schemas

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")
_PATTERN_HEADER = '<domain: "onnxfuse.pattern", opset_import: ["" : {opset}]>\n'
_DEFAULT_PATTERN_OPSET = 21
# Guard name for the index of the source alternative that matched.
ALTERNATIVE = "alternative"
# Guard name for the target's parameters (a mapping, empty without any: `cpu:block=8`).
TARGET_PARAMS = "target_params"
# Rewrite phases, in the order they run; each reaches its own fixpoint before the next.
# `packing` merges ops of one input (Q/K/V projections) once the fusions that read them
# one by one (encoder Attention) have had their chance.
PHASES = ("fusion", "packing", "layout")


@dataclass(eq=False)
class Rule:
    name: str
    sources: list[Pattern]
    replacement: Pattern
    description: str = ""
    benefit: int = 1
    references: list[str] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)
    lets: dict[str, Guard] = field(default_factory=dict)
    optional: frozenset[str] = frozenset()
    opset: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)
    imports: dict[str, int] = field(default_factory=dict)
    tolerance: float | None = None
    verify: dict[str, Any] = field(default_factory=dict)
    copy_attributes: dict[str, str] = field(default_factory=dict)
    keep: frozenset[str] = frozenset()
    # Targets on which the rule fires only where a target profile measured it no slower
    # than what it replaces (its op is slower on some machines of that target).
    needs_profile: frozenset[str] = frozenset()
    # The rewrite leaves QDQ node units whole (a level-1 Q/DQ cleanup): it also runs for
    # a target that consumes units, which still refuses a match touching a unit's node.
    keeps_units: bool = False
    pack: str = ""
    origin: str = ""
    phase: str = PHASES[0]  # set from the pack manifest's `phase`
    # Later phases it runs in again: a pack of that phase `reuses` it (see packs.py).
    also_phases: frozenset[str] = frozenset()
    # A rule expanded from an op set (`ops:`): the name written in the file, and the
    # op each op-type variable stands for here ('Relu', 'com.microsoft::Gelu').
    family: str = ""
    op_bindings: dict[str, str] = field(default_factory=dict)

    @property
    def place(self) -> tuple[str | None, int | None]:
        """Where the rule is written, from its origin: (file, line), or ('python:NAME',
        None) for a rule written in Python, (None, None) for one without an origin."""
        path, _, line = self.origin.rpartition(":")
        if path and line.isdecimal():
            return path, int(line)
        return self.origin or None, None

    def runs_in(self, phase: str) -> bool:
        return phase == self.phase or phase in self.also_phases

    @property
    def anchor_keys(self) -> set[tuple[str, str]]:
        return {source.anchor.key for source in self.sources}

    def created_ops(self) -> set[tuple[str, str]]:
        return {node.key for node in self.replacement.nodes}

    def refused_by(self, params: dict[str, object]) -> str | None:
        """The first guard that reads only the target's parameters and is false for
        ``params``: the rule can then match nowhere on that target (None: none is)."""
        for guard in self.guards:
            if guard.names <= {TARGET_PARAMS}:
                try:
                    holds = guard.evaluate({TARGET_PARAMS: dict(params)})
                except GuardUnknown:  # matching will say why
                    continue
                if not holds:
                    return guard.text
        return None


def parse_pattern_text(
    text: str,
    *,
    role: str,
    commutative: frozenset[tuple[str, str]],
    first_line: int,
    op_types: dict[str, tuple[str, str]] | None = None,
) -> Pattern:
    """Parse a pattern written in the ONNX text syntax (header optional).

    ``op_types`` binds op-type variables (a rule's ``ops:``) to the ops they stand
    for in this expansion; a source must use every one of them as an op type.
    """
    if not isinstance(text, str) or not text.strip():
        raise RuleError(f"{role} must be a pattern in the ONNX text syntax", line=first_line)
    has_header = text.lstrip().startswith("<")
    full = text if has_header else _PATTERN_HEADER.format(opset=_DEFAULT_PATTERN_OPSET) + text
    offset = first_line - (0 if has_header else 1)
    try:
        function, lines = _parse_function(full, private=bool(op_types))
    except onnx.parser.ParseError as exc:
        message, line = _parse_error(exc)
        raise RuleError(
            f"{role}: syntax error in pattern: {message}",
            line=None if line is None else line - 1 + offset,
        ) from None
    except (RuntimeError, ValueError, IndexError) as exc:  # e.g. a literal out of range
        raise RuleError(f"{role}: invalid pattern: {exc}", line=first_line) from None
    node_lines = [line + offset for line in lines]
    if op_types:
        used = opsets.substitute(function, op_types)
        unused = [name for name in op_types if name not in used]
        if role == "source" and unused:
            raise RuleError(
                f"source: op-type variable '{unused[0]}' is not used as an op type", line=first_line
            )
    try:
        return compile_function(function, role=role, commutative=commutative, node_lines=node_lines)
    except RuleError as exc:
        raise exc.prefixed(role).located(line=first_line) from None


# Parsed pattern texts with their node lines: an op-set family parses one text per
# member (its op types are substituted after parsing). Bounded, like the guard cache.
_PARSED: dict[str, tuple[onnx.FunctionProto, list[int]]] = {}
_MAX_PARSED = 4096


def _parse_function(text: str, *, private: bool) -> tuple[onnx.FunctionProto, list[int]]:
    """``text`` parsed and each node's line in it. Compiling a pattern only reads the
    function; a ``private`` copy is for substituting op types into."""
    found = _PARSED.get(text)
    if found is None:
        function = onnx.parser.parse_function(text)
        found = (function, _node_lines(text, function, 0))
        if len(_PARSED) >= _MAX_PARSED:
            _PARSED.clear()
        _PARSED[text] = found
    if not private:
        return found
    copy = onnx.FunctionProto()
    copy.CopyFrom(found[0])
    return copy, found[1]


def _parse_error(exc: onnx.parser.ParseError) -> tuple[str, int | None]:
    raw = exc.args[0] if exc.args else b""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    line_match = re.search(r"line: (\d+)", text)
    detail = [part.strip() for part in text.splitlines()[1:] if part.strip()]
    message = "; ".join(detail) or text.strip()
    return message, int(line_match.group(1)) if line_match else None


def _node_lines(text: str, function: onnx.FunctionProto, offset: int) -> list[int]:
    """Best-effort line of each node: the line where its first output is assigned."""
    lines = text.splitlines()
    found: list[int] = []
    start = 0
    for node in function.node:
        target = node.output[0] if node.output else node.op_type
        for index in range(start, len(lines)):
            if _assigns(lines[index], target) or node.op_type in lines[index]:
                found.append(index + offset)
                start = index + 1
                break
        else:
            found.append(offset)
    return found


def _assigns(line: str, name: str) -> bool:
    r"""Whether ``name`` is assigned in ``line``: after the start, a space or a comma,
    before a comma or '=' (spaces aside). The regular expression
    ``(^|[\s,])name\s*(,|=)`` without compiling one per name (0.08 s per start)."""
    found = line.find(name)
    while found >= 0:
        before = line[found - 1] if found else ","
        after = line[found + len(name) :].lstrip()[:1]
        if (before == "," or before.isspace()) and after in (",", "="):
            return True
        found = line.find(name, found + 1)
    return False


def build_rule(
    *,
    name: str,
    sources: list[Pattern],
    replacement: Pattern,
    lines: dict[str, int | None] | None = None,
    **metadata: Any,
) -> Rule:
    """Check a rule's parts against each other and the op schemas."""
    lines = lines or {}
    written = metadata.get("family") or name
    if not isinstance(written, str) or not _NAME.match(written):
        raise RuleError(
            f"rule name {written!r} must start with a letter and use letters, digits, _ . -",
            line=lines.get("name"),
        )
    rule = Rule(name=name, sources=sources, replacement=replacement, **metadata)
    _check_signatures(rule, lines)
    opset = rule.opset.get("", (None, None))
    copied = frozenset(rule.copy_attributes)
    for source in rule.sources:
        _check_ops(
            source, "source", lines.get("source"), opset, strict_attributes=True, copied=copied
        )
    _check_ops(
        rule.replacement,
        "replacement",
        lines.get("target"),
        opset,
        strict_attributes=True,
        copied=frozenset(rule.copy_attributes.values()),
    )
    for source in rule.sources:
        for node in source.nodes:
            node.structure  # noqa: B018 - computed with the rule, kept with it in the load cache
    return rule


def _check_signatures(rule: Rule, lines: dict[str, int | None]) -> None:
    first = rule.sources[0]
    for source in rule.sources[1:]:
        if set(source.input_names()) != set(first.input_names()):
            raise RuleError(
                "all alternative sources must take the same variables "
                f"({', '.join(first.input_names())})",
                line=lines.get("source"),
            )
        if len(source.outputs) != len(first.outputs):
            raise RuleError(
                "all alternative sources must have the same number of outputs",
                line=lines.get("source"),
            )
        if set(source.attribute_vars) != set(first.attribute_vars):
            raise RuleError(
                "all alternative sources must bind the same attributes", line=lines.get("source")
            )
    if len(rule.replacement.outputs) != len(first.outputs):
        raise RuleError(
            f"replacement has {len(rule.replacement.outputs)} output(s), "
            f"source has {len(first.outputs)}",
            line=lines.get("target"),
        )
    source_vars = set(first.input_names())
    for name in rule.replacement.input_names():
        if name not in source_vars:
            raise RuleError(
                f"replacement input '{name}' is not a variable of the source",
                line=lines.get("target"),
            )
    for name in rule.optional:
        if name not in source_vars:
            raise RuleError(
                f"optional variable '{name}' is not a variable of the source",
                line=lines.get("optional"),
            )
    attribute_names = set(first.attribute_vars) | set(rule.lets)
    for node in rule.replacement.nodes:
        for attr in node.attributes.values():
            if isinstance(attr, AttrRef) and attr.var not in attribute_names:
                raise RuleError(
                    f"replacement {node.op_type} refers to @{attr.var}, which is neither a "
                    "source attribute nor a 'let' name",
                    line=lines.get("target"),
                )
    for source_value, target_value in rule.copy_attributes.items():
        for source in rule.sources:
            found = source.values.get(source_value)
            if found is None or found.kind != "node":
                raise RuleError(
                    f"copy_attributes: '{source_value}' is not a node output of every source",
                    line=lines.get("copy_attributes"),
                )
        found = rule.replacement.values.get(target_value)
        if found is None or found.kind != "node":
            raise RuleError(
                f"copy_attributes: '{target_value}' is not a node output of the replacement",
                line=lines.get("copy_attributes"),
            )
    _check_keep(rule, lines.get("keep"))
    for source in rule.sources:
        used = {
            a.var for n in source.nodes for a in n.attributes.values() if isinstance(a, AttrRef)
        }
        for declared in source.attribute_vars:
            if declared not in used:
                raise RuleError(
                    f"source attribute variable '{declared}' is declared but never bound",
                    line=lines.get("source"),
                )


def _check_keep(rule: Rule, line: int | None) -> None:
    """Kept intermediates: node outputs of every source whose producers read only
    variables, constants or other kept values (the rewrite removes everything else)."""
    for name in rule.keep:
        for source in rule.sources:
            found = source.values.get(name)
            if found is None or found.kind != "node" or found in source.outputs:
                raise RuleError(
                    f"keep: '{name}' is not an intermediate value of every source", line=line
                )
            assert found.producer is not None
            for pvalue in found.producer.inputs:
                if pvalue is not None and pvalue.kind == "node" and pvalue.name not in rule.keep:
                    raise RuleError(
                        f"keep: '{name}' is computed from '{pvalue.name}', which the rewrite "
                        "removes; keep it too",
                        line=line,
                    )


def _check_ops(
    pattern: Pattern,
    role: str,
    line: int | None,
    opset: tuple[int | None, int | None],
    *,
    strict_attributes: bool,
    copied: frozenset[str] = frozenset(),
) -> None:
    """Ops must exist; attributes must exist in a schema version the rule can meet.

    Input and output counts must fit the op. A node whose output is in
    ``copy_attributes`` takes whatever attributes its source node has, so it need not
    name the required ones (an op set's Cast keeps its `to`).
    """
    for node in pattern.nodes:
        known = schemas.known_op(node.domain, node.op_type)
        where = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        if known is False:
            raise RuleError(f"{role}: unknown op '{where}'", line=line)
        low, high = opset if node.domain == "" else (None, None)
        versions = schemas.schemas_in_range(node.domain, node.op_type, low, high)
        if not versions:
            if node.domain in schemas.ONNX_DOMAINS:
                raise RuleError(
                    f"{role}: {where} does not exist in the rule's opset range", line=line
                )
            continue
        for attr_name, spec in node.attributes.items():
            if not any(attr_name in v.attributes for v in versions):
                raise RuleError(
                    f"{role}: {where} has no attribute '{attr_name}' in the rule's opset range",
                    line=line,
                )
            if isinstance(spec, AttrLiteral):
                found = [v.attributes.get(attr_name) for v in versions]
                problem = _literal_problem(attr_name, spec, found)
                if problem is not None:
                    raise RuleError(f"{role}: {where} {attr_name}: {problem}", line=line)
        arity = (len(node.inputs), len(node.outputs))
        if not any(
            v.min_input <= arity[0] <= v.max_input and v.min_output <= arity[1] <= v.max_output
            for v in versions
        ):
            raise RuleError(
                f"{role}: {where} takes no {arity[0]} inputs and {arity[1]} outputs "
                "in the rule's opset range",
                line=line,
            )
        if strict_attributes and not any(o is not None and o.name in copied for o in node.outputs):
            for attr_name, attr_schema in versions[-1].attributes.items():
                if attr_schema.required and attr_name not in node.attributes:
                    raise RuleError(
                        f"{role}: {where} must name its required attribute '{attr_name}' "
                        f"(bind it, e.g. <{attr_name}: TYPE = @{attr_name}>, or give a value)",
                        line=line,
                    )


# A literal written as an int may stand for a float (``alpha = 1``), not the reverse.
_LITERAL_FITS: dict[int, set[int]] = {
    onnx.AttributeProto.INT: {onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT},
    onnx.AttributeProto.INTS: {onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS},
}


def _literal_problem(name: str, spec: AttrLiteral, schemas_of: list[Any]) -> str | None:
    """What is wrong with a literal attribute value for every schema version, if anything:
    a value of another type (a string for an int), or a data type no tensor has."""
    types = {int(a.type) for a in schemas_of if a is not None}
    if not spec.attr_type or not types:
        return None
    fits = _LITERAL_FITS.get(spec.attr_type, {spec.attr_type})
    if not types & fits:
        names = " or ".join(sorted(onnx.AttributeProto.AttributeType.Name(t) for t in types))
        given = onnx.AttributeProto.AttributeType.Name(spec.attr_type)
        return f"takes {names}, not {given} ({spec.value!r})"
    int_type = spec.attr_type == onnx.AttributeProto.INT and onnx.AttributeProto.INT in types
    data_type = name in ("to", "dtype") and int_type  # Cast, EyeLike, RandomNormal, ...
    if data_type and (not spec.value or spec.value not in onnx.TensorProto.DataType.values()):
        return f"{spec.value!r} is not an ONNX data type"
    return None


def compile_guards(
    expressions: list[str],
    known: set[str],
    line: int | None,
    item_lines: list[int | None] | None = None,
) -> list[Guard]:
    """Checked guards; an error names ``line``, or the guard's own line in ``item_lines``."""
    guards = []
    for index, text in enumerate(expressions):
        try:
            guards.append(parse_guard(text, known))
        except RuleError as exc:
            own = item_lines[index] if item_lines is not None else None
            raise exc.prefixed("where").located(line=own or line) from None
    return guards


def commutative_set(extra: list[str], line: int | None) -> frozenset[tuple[str, str]]:
    """The default commutative ops plus those a rule declares ('Op' or 'domain::Op')."""
    result = set(COMMUTATIVE_OPS)
    for item in extra:
        if not isinstance(item, str) or not item:
            raise RuleError("commutative: expected a list of op names", line=line)
        domain, _, op = item.rpartition("::")
        result.add((normalize_domain(domain), op))
    return frozenset(result)
