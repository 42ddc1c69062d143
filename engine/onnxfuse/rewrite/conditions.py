"""The conditions of a rule, checked on each structural match: guards, lets, the target.

``RuleMatcher.match`` is the whole dispatch at one node: the matcher's structural
matches in backtracking order, the first one every condition accepts. A refused
match tells the matcher why, so that ``mismatch`` names the furthest failure.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import onnx_ir as ir

from onnxfuse.language.guards import Guard, GuardUnknown, ValueRef, constant_tensor
from onnxfuse.language.rule import ALTERNATIVE, TARGET_PARAMS, Rule
from onnxfuse.rewrite.matcher import (
    ABSENT,
    Match,
    Matcher,
    Mismatch,
    ModelContext,
    StructureMemo,
)
from onnxfuse.rewrite.plan import plan_match
from onnxfuse.rewrite.qdq_units import QDQ_OPS, unit_breaks
from onnxfuse.targets.capabilities import Target
from onnxfuse.targets.facts import value_facts


class RuleMatcher:
    """One rule at one model context: its structural matcher and its conditions."""

    def __init__(self, rule: Rule, context: ModelContext, target: Target | None = None):
        self.rule = rule
        self.structure = Matcher(rule, context)
        self.conditions = Conditions(rule, context, target)

    @property
    def mismatch(self) -> Mismatch | None:
        """Why the last ``match`` found nothing (None after a match)."""
        return self.structure.mismatch

    def could_match(self, node: ir.Node, memo: StructureMemo | None = None) -> bool:
        return self.structure.could_match(node, memo)

    def match(self, node: ir.Node) -> Match | None:
        """The first structural match at ``node`` that the rule's conditions accept."""
        for candidate in self.structure.candidates(node):
            accepted = self.conditions.accept(candidate)
            if isinstance(accepted, Match):
                return accepted
            self.structure.refuse(accepted.reason, accepted.blocks)
        return None


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a condition refused a structural match; ``blocks``: the target refused it (the
    rule applies, but not on this target)."""

    reason: str | Callable[[], str]
    blocks: bool = False


class Conditions:
    """A rule's guards and lets, and the gate of its target (None: no gating)."""

    def __init__(self, rule: Rule, context: ModelContext, target: Target | None = None):
        self.rule = rule
        self.context = context
        self.target = target
        self._verdicts: dict[Hashable, list[str]] = {}  # the target's, by facts
        self._knows_qdq = any(
            node.domain == "" and node.op_type in QDQ_OPS
            for source in rule.sources
            for node in source.nodes
        )
        self._keeps_units = target is not None and target.keeps_qdq_units

    def accept(self, match: Match) -> Match | Refusal:
        """``match`` with its lets bound, or why a condition refused it."""
        names = _Names(self._guard_names(match), self.rule.lets)
        for guard in self.rule.guards:
            try:
                holds = bool(guard.evaluate(names))
            except GuardUnknown as exc:
                return Refusal(f"guard '{guard.text}' cannot be decided: {exc}")
            if not holds:
                # Built only if explained: guards fail at most nodes of a run.
                return Refusal(functools.partial(_false_guard, guard, names))
        attrs = dict(match.attrs)
        for let_name in self.rule.lets:
            try:
                attrs[let_name] = names[let_name]
            except GuardUnknown as exc:
                return Refusal(f"let {let_name} cannot be computed: {exc}")
        match = dataclasses.replace(match, attrs=attrs)
        broken = unit_breaks(match.nodes, self._knows_qdq, self._keeps_units, self.rule.keeps_units)
        if broken is not None:
            why = (
                f"target '{self.target.name}' consumes QDQ units itself"
                if self.target is not None and self._keeps_units
                else "a rule without Q or DQ in its source leaves units whole"
            )
            return Refusal(
                f"{broken.op_type} '{broken.name}' is part of a QDQ node unit ({why})",
                blocks=self._keeps_units,
            )
        if self.target is not None:
            missing = self._unsupported(match)
            if missing:
                return Refusal(
                    f"target '{self.target.name}' cannot run {', '.join(missing)}", blocks=True
                )
        return match

    def _unsupported(self, match: Match) -> list[str]:
        """What the firing's plan creates that the target cannot run. The verdict follows
        from the facts of the replacement's inputs and outputs and from the attributes
        alone: it is kept per set of facts (a fusion fires once per layer with equal
        facts)."""
        assert self.target is not None
        present = {k: v for k, v in match.attrs.items() if v is not ABSENT}
        key = self._facts_key(match.values, match.outputs, present, match.copied)
        if key is not None and key in self._verdicts:
            return self._verdicts[key]
        missing = self.target.unsupported(plan_match(match, self.context).kernels())
        if key is not None:
            self._verdicts[key] = missing
        return missing

    def _facts_key(
        self,
        values: dict[str, ir.Value | None],
        outputs: list[ir.Value],
        attrs: dict[str, Any],
        copied: dict[str, dict[str, Any]],
    ) -> Hashable | None:
        """What the plan reads of a match, as a key; None if an attribute holds
        something without a plain value (a tensor, a graph)."""
        version = self.context.ir_version
        try:
            return (
                tuple(
                    value_facts(values[name], version) if name in values else "unbound"
                    for name in self.rule.replacement.input_names()
                ),
                tuple(value_facts(value, version) for value in outputs),
                _frozen(attrs),
                _frozen(copied),
            )
        except _NoPlainValue:
            return None

    def _guard_names(self, match: Match) -> dict[str, Any]:
        version = self.context.ir_version
        names: dict[str, Any] = {
            name: ValueRef(name, value, version) for name, value in match.values.items()
        }
        by_index = {p.index: node for p, node in zip(match.source.nodes, match.nodes)}
        for pvalue in match.source.values.values():
            if pvalue.kind == "node" and pvalue.producer is not None:
                node = by_index.get(pvalue.producer.index)
                bound = (
                    node.outputs[pvalue.output_index]
                    if node is not None and pvalue.output_index < len(node.outputs)
                    else None
                )
                names[pvalue.name] = ValueRef(pvalue.name, bound, version)
        for name, value in match.attrs.items():
            names[name] = None if value is ABSENT else value
        index = next(i for i, s in enumerate(self.rule.sources) if s is match.source)
        names.setdefault(ALTERNATIVE, index)
        names.setdefault(TARGET_PARAMS, dict(self.target.params) if self.target else {})
        return names


def _false_guard(guard: Guard, names: _Names) -> str:
    """The refusal of a false guard, with what it read bound to (``a = 0.2``)."""
    shown = []
    for name in sorted(guard.names):
        try:
            shown.append(f"{name} = {_shown(names[name])}")
        except (GuardUnknown, KeyError):
            continue  # an absent optional input, a let that cannot be computed
    bound = f" ({', '.join(shown)})" if shown else ""
    return f"guard '{guard.text}' is false{bound}"


def _shown(value: Any) -> str:
    """A bound name as a rule author reads it: a small constant by its value, another
    value by its name, type and shape."""
    if isinstance(value, ValueRef):
        if value.value is None:
            return "absent"
        tensor = constant_tensor(value.value, value.ir_version)
        if tensor is not None and tensor.size <= _SHOWN_ELEMENTS:
            return _shown(tensor.numpy())
        described = f"'{value.value.name}'"
        if value.value.type is not None:
            described += f" {value.value.type}"
        if value.value.shape is not None:
            described += f" {value.value.shape}"
        return described
    if isinstance(value, (np.ndarray, np.generic)):
        return np.array2string(np.asarray(value), separator=", ")  # float32 0.2 as 0.2
    if isinstance(value, ir.Attr):
        return _shown(value.value)
    return repr(value)


# Elements of a constant shown by value in a false guard; a larger one is shown by name.
_SHOWN_ELEMENTS = 8


class _Names(dict):
    """Guard names; `let` values are computed on first use, so guards may use them."""

    def __init__(self, bound: dict[str, Any], lets: dict[str, Guard]):
        super().__init__(bound)
        self.lets = lets

    def __missing__(self, name: str) -> Any:
        expression = self.lets[name]
        self[name] = value = expression.evaluate(self)
        return value


class _NoPlainValue(Exception):
    pass


def _frozen(value: Any) -> Hashable:
    """``value`` as a key that equals another's exactly when the values are equal and of
    the same kinds (1, 1.0 and True apart)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        return ("seq", tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("map", tuple((k, _frozen(v)) for k, v in sorted(value.items())))
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind != "O":
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, ir.Attr):
        return ("attr", value.name, value.type, _frozen(value.value))
    raise _NoPlainValue
