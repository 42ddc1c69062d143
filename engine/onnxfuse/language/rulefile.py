"""Reading rule files (YAML) into Rules, with file:line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnxfuse.errors import RuleError, SourceError
from onnxfuse.language.guards import Guard
from onnxfuse.language.opsets import Member, narrow_opset, parse_members
from onnxfuse.language.pattern import Pattern
from onnxfuse.language.rule import (
    ALTERNATIVE,
    TARGET_PARAMS,
    Rule,
    build_rule,
    commutative_set,
    compile_guards,
    parse_pattern_text,
)
from onnxfuse.language.yaml_lines import LineList, LineMap, load_yaml
from onnxfuse.ops import element_types

RULE_KEYS = {
    "name": "a unique rule name",
    "description": "what the rule does",
    "benefit": "an integer priority; higher fires first",
    "references": "where the fusion comes from",
    "source": "the pattern to find, ONNX text syntax",
    "sources": "alternative patterns with one replacement",
    "replacement": "the pattern that replaces a match, ONNX text syntax",
    "target": "the replacement's older name, still accepted",
    "where": "guard expressions that must all hold",
    "let": "names computed from bindings, usable as @name in the replacement",
    "optional": "source variables that may be absent inputs",
    "commutative": "extra ops whose inputs match in any order",
    "copy_attributes": "source value -> replacement value: copy all attributes of its node",
    "keep": "intermediates that may have uses outside the match; their nodes stay for them",
    "needs_profile": "targets on which the rule fires only where a target profile "
    "(onnxfuse targets calibrate) measured it no slower than what it replaces",
    "keeps_units": "true: the rewrite leaves QDQ node units whole, so it also applies for a "
    "target that consumes them (its Q and DQ nodes outside any unit may change)",
    "opset": "model opset range per domain where the rule applies",
    "imports": "opset version to import for domains the replacement adds",
    "tolerance": "relative tolerance for matching constants",
    "verify": "the verification domain for the rule's property tests",
    "ops": "op-type variables: a name used as an op type, one rule per op of its list",
    "per_op": "keys that differ for one member of an op set: opset, where, verify",
}
FILE_KEYS = {"rules", "description"}


def load_rule_file(path: str | Path, pack: str = "") -> list[Rule]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuleError("no such rule file", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"cannot read rule file: {exc}", str(path)) from None
    return parse_rule_text(text, str(path), pack=pack or path.parent.name)


def parse_rule_text(text: str, path: str = "<rules>", pack: str = "") -> list[Rule]:
    try:
        document = load_yaml(text)
    except SourceError as exc:
        raise RuleError(exc.message, path, exc.line) from None
    if not isinstance(document, LineMap):
        raise RuleError("expected a mapping with a 'rules' list at the top", path, 1)
    for key in document:
        if key not in FILE_KEYS:
            raise RuleError(
                f"unknown top-level key '{key}' (expected: {', '.join(sorted(FILE_KEYS))})",
                path,
                document.line_of(str(key)),
            )
    entries = document.get("rules")
    if not isinstance(entries, LineList) or not entries:
        raise RuleError("'rules' must be a non-empty list", path, document.line_of("rules"))
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for entry, line in zip(entries, entries.item_lines):
        try:
            parsed = _parse_rule(entry, line, pack, path)
        except RuleError as exc:
            raise exc.located(path, line) from None
        for rule in parsed:
            family = rule.family or rule.name
            if rule.name in seen or family in seen:
                first = seen.get(rule.name, seen.get(family))
                raise RuleError(
                    f"rule '{family}' is defined twice (first at line {first})", path, line
                )
        for rule in parsed:
            seen[rule.name] = line
        if parsed[0].family:
            seen[parsed[0].family] = line
        rules.extend(parsed)
    return rules


def _parse_rule(entry: Any, line: int, pack: str, path: str) -> list[Rule]:
    """One rule, or one per member of the rule's op set (`ops:`)."""
    if not isinstance(entry, LineMap):
        raise RuleError("each rule must be a mapping", line=line)
    check_keys(entry)
    members = parse_members(entry)
    if members is None:
        return [_parse_one(entry, line, pack, path, None)]
    return [_parse_one(entry, line, pack, path, member) for member in members]


def _parse_one(entry: LineMap, line: int, pack: str, path: str, member: Member | None) -> Rule:
    commutative = commutative_set(_string_list(entry, "commutative"), entry.line_of("commutative"))
    op_types = member.ops if member else None
    try:
        sources = [
            parse_pattern_text(
                text,
                role="source",
                commutative=commutative,
                first_line=text_line or line,
                op_types=op_types,
            )
            for text, text_line in _source_texts(entry)
        ]
        key = _replacement_key(entry, line)
        replacement = parse_pattern_text(
            entry[key],
            role="replacement",
            commutative=commutative,
            first_line=entry.line_of(key) or line,
            op_types=op_types,
        )
        return rule_from_entry(
            entry, sources, replacement, pack=pack, origin=f"{path}:{line}", member=member
        )
    except RuleError as exc:
        if member is None:
            raise
        # Which member broke it: the schema checks run per op.
        raise exc.prefixed(f"op set member {member.suffix}") from None


def check_keys(entry: LineMap) -> None:
    for key in entry:
        if key not in RULE_KEYS:
            raise RuleError(
                f"unknown rule key '{key}' (expected one of: {', '.join(RULE_KEYS)})",
                line=entry.line_of(str(key)),
            )


def rule_from_entry(
    entry: LineMap,
    sources: list[Pattern],
    replacement: Pattern,
    *,
    pack: str,
    origin: str,
    member: Member | None = None,
) -> Rule:
    """Build a rule from its compiled patterns and the other keys of its mapping;
    for a member of an op set, with that member's `per_op` keys."""
    lines = {key: entry.line_of(key) for key in RULE_KEYS}
    # The replacement's line, under either name it was written with.
    lines["target"] = lines["replacement"] or lines["target"]
    lines["source"] = entry.line_of("sources" if "sources" in entry else "source")
    name = entry.get("name")
    if name is None:
        raise RuleError("rule has no 'name'", line=entry.line)

    # Guards may name any value every alternative defines, the attributes, and
    # `alternative` (which source matched) unless a value of that name shadows it.
    bound = set.intersection(*(set(s.values) for s in sources)) | set(sources[0].attribute_vars)
    bound.add(ALTERNATIVE)
    bound.add(TARGET_PARAMS)
    lets = _parse_lets(entry, bound, lines["let"])
    guards = _compile_where(entry.get("where", []), bound | set(lets), lines["where"])
    if member is None and "ops" in entry:
        raise RuleError("'ops' is only read from rule files", line=lines["ops"])
    overrides = member.overrides if member else {}
    guards += _compile_where(overrides.get("where", []), bound | set(lets), lines["per_op"])
    opset_entry = LineMap({"opset": overrides["opset"]}) if "opset" in overrides else entry
    opset = _parse_opset(opset_entry, lines["per_op" if "opset" in overrides else "opset"])
    check_verify_types(entry.get("verify"), lines["verify"])
    check_verify_types(overrides.get("verify"), lines["per_op"])
    verify = {**_mapping(entry, "verify"), **overrides.get("verify", {})}
    family_keys: dict[str, Any] = {}
    if member is not None:
        opset = narrow_opset(opset, member)
        family_keys = {
            "family": name,
            "op_bindings": dict(zip(member.ops, member.labels)),
        }
        name = f"{name}{member.suffix}"

    return build_rule(
        name=name,
        sources=sources,
        replacement=replacement,
        lines=lines,
        description=_string(entry, "description", ""),
        benefit=_integer(entry, "benefit", 1),
        references=_string_list(entry, "references"),
        guards=guards,
        lets=lets,
        optional=frozenset(_string_list(entry, "optional")),
        opset=opset,
        imports=_parse_imports(entry, lines["imports"]),
        tolerance=_tolerance(entry, lines["tolerance"]),
        verify=verify,
        copy_attributes=_string_map(entry, "copy_attributes"),
        keep=frozenset(_string_list(entry, "keep")),
        needs_profile=frozenset(_string_list(entry, "needs_profile")),
        keeps_units=_boolean(entry, "keeps_units"),
        pack=pack,
        origin=origin,
        **family_keys,
    )


def _source_texts(entry: LineMap) -> list[tuple[str, int | None]]:
    if "source" in entry and "sources" in entry:
        raise RuleError("give either 'source' or 'sources', not both", line=entry.line)
    if "source" in entry:
        return [(entry["source"], entry.line_of("source"))]
    sources = entry.get("sources")
    if not isinstance(sources, LineList) or not sources:
        raise RuleError("rule has no 'source'", line=entry.line)
    return list(zip(sources, sources.item_lines))


# Lists of shared guards may nest; deeper than this is a mistake (or a cycle).
_MAX_GUARD_NESTING = 8


def _guard_list(
    where: Any, line: int | None, depth: int = 0, seen: set | None = None
) -> list[tuple[str, int | None]]:
    """`where:` as a flat list of expressions, each with its line where known.

    A nested list is spliced in, so rules can share a list of guards through a
    YAML anchor (`- *shape_guards`). Guards are a conjunction: a list met again (one
    anchor aliased many times) adds nothing and is not walked again, so aliases
    nested in aliases cannot multiply the work.
    """
    seen = set() if seen is None else seen
    if isinstance(where, str):
        return [(where, line)]
    if not isinstance(where, list) or depth > _MAX_GUARD_NESTING:
        raise RuleError("'where' must be an expression or a list of them", line=line)
    flat: list[tuple[str, int | None]] = []
    if id(where) in seen:
        return flat
    seen.add(id(where))
    item_lines = getattr(where, "item_lines", None) or []
    for index, item in enumerate(where):
        item_line = item_lines[index] if index < len(item_lines) else line
        flat.extend(_guard_list(item, item_line, depth + 1, seen))
    return flat


def _compile_where(where: Any, known: set[str], line: int | None) -> list[Guard]:
    listed = _guard_list(where, line)
    texts = [text for text, _ in listed]
    return compile_guards(texts, known, line, [item_line for _, item_line in listed])


def _parse_lets(entry: LineMap, bound: set[str], line: int | None) -> dict[str, Any]:
    raw = entry.get("let", {})
    if not isinstance(raw, dict):
        raise RuleError("'let' must map names to expressions", line=line)
    lets = {}
    known = set(bound)
    for name, text in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or name in known:
            raise RuleError(f"'let' name {name!r} is invalid or already bound", line=line)
        lets[name] = compile_guards([text], known, line)[0]
        known.add(name)
    return lets


def _parse_opset(entry: LineMap, line: int | None) -> dict[str, tuple[int | None, int | None]]:
    raw = entry.get("opset", {})
    if not isinstance(raw, dict):
        raise RuleError("'opset' must map a domain to [min, max] or a minimum", line=line)
    result: dict[str, tuple[int | None, int | None]] = {}
    for domain, bounds in raw.items():
        domain_name = "" if domain in ("", "ai.onnx") else str(domain)
        if isinstance(bounds, int) and not isinstance(bounds, bool):
            result[domain_name] = (bounds, None)
        elif (
            isinstance(bounds, list)
            and len(bounds) == 2
            and all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds)
        ):
            result[domain_name] = (bounds[0], bounds[1])
        else:
            raise RuleError(
                f"opset for domain '{domain}' must be a minimum or [min, max]", line=line
            )
    return result


def _parse_imports(entry: LineMap, line: int | None) -> dict[str, int]:
    raw = entry.get("imports", {})
    if not isinstance(raw, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31 for v in raw.values()
    ):
        raise RuleError("'imports' must map domains to opset versions", line=line)
    return {str(k): v for k, v in raw.items()}


def _string(entry: LineMap, key: str, default: str) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise RuleError(f"'{key}' must be a string", line=entry.line_of(key))
    return value


def _integer(entry: LineMap, key: str, default: int) -> int:
    value = entry.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RuleError(f"'{key}' must be an integer", line=entry.line_of(key))
    return value


def _boolean(entry: LineMap, key: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise RuleError(f"'{key}' must be true or false", line=entry.line_of(key))
    return value


def _tolerance(entry: LineMap, line: int | None) -> float | None:
    value = entry.get("tolerance")
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise RuleError("'tolerance' must be a number in [0, 1)", line=line)
    return float(value)


def _string_list(entry: LineMap, key: str) -> list[str]:
    value = entry.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuleError(f"'{key}' must be a list of strings", line=entry.line_of(key))
    return list(value)


def _mapping(entry: LineMap, key: str) -> dict[str, Any]:
    value = entry.get(key, {})
    if not isinstance(value, dict):
        raise RuleError(f"'{key}' must be a mapping", line=entry.line_of(key))
    return dict(value)


def _string_map(entry: LineMap, key: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise RuleError(f"'{key}' must map names to names", line=entry.line_of(key))
    return dict(value)


def _replacement_key(entry: LineMap, line: int) -> str:
    """``replacement:``, or ``target:`` as rule files wrote it before; not both."""
    if "replacement" in entry and "target" in entry:
        raise RuleError("rule has both 'replacement' and 'target' (one name)", line=line)
    if "replacement" in entry:
        return "replacement"
    if "target" in entry:
        return "target"
    raise RuleError("rule has no 'replacement'", line=line)


# Keys of a `verify:` tolerance that are not element types.
_TOLERANCE_KEYS = ("rtol", "atol", "reason")


def check_verify_types(verify: Any, line: int | None) -> None:
    """Element types a `verify:` mapping names (``dtypes``, ``inputs.X.dtype``,
    ``negatives[i].dtype``, ``tolerance`` keys) must be ONNX's names: a domain in
    NumPy's spelling would draw no instance. The rest of the domain is the proof's
    to check (onnxfuse.proof.domain), as is anything malformed here."""
    if not isinstance(verify, dict):
        return

    def check(value: Any, where: str, at: int | None) -> None:
        values = value if isinstance(value, list) else [value]
        lines = getattr(value, "item_lines", None) or []
        for index, item in enumerate(values):
            if not element_types.is_name(item):
                item_line = lines[index] if index < len(lines) else at
                raise RuleError(
                    f"verify: {where}: {element_types.unknown(item)}", line=item_line or line
                )

    def line_of(mapping: Any, key: str, default: int | None) -> int | None:
        found = mapping.line_of(key) if isinstance(mapping, LineMap) else None
        return found or default

    if "dtypes" in verify:
        check(verify["dtypes"], "dtypes", line_of(verify, "dtypes", line))
    inputs = verify.get("inputs")
    if isinstance(inputs, dict):
        for name, spec in inputs.items():
            if isinstance(spec, dict) and "dtype" in spec:
                at = line_of(spec, "dtype", line_of(inputs, name, line))
                check(spec["dtype"], f"inputs.{name}.dtype", at)
    negatives = verify.get("negatives")
    if isinstance(negatives, list):
        negative_lines = getattr(negatives, "item_lines", None) or []
        for index, negative in enumerate(negatives):
            if isinstance(negative, dict) and "dtype" in negative:
                own = negative_lines[index] if index < len(negative_lines) else None
                at = line_of(negative, "dtype", own or line_of(verify, "negatives", line))
                check(negative["dtype"], f"negatives[{index}].dtype", at)
    tolerance = verify.get("tolerance")
    if isinstance(tolerance, dict):
        for key in tolerance:
            # A key that looks like an element type (float32, flaot); other keys are the
            # proof's to refuse ('rtl' is no misspelt element type).
            if (
                key not in _TOLERANCE_KEYS
                and not element_types.is_name(key)
                and element_types.suggest(key) is not None
            ):
                at = line_of(tolerance, str(key), line_of(verify, "tolerance", line))
                raise RuleError(f"verify: tolerance: {element_types.unknown(key)}", line=at or line)
