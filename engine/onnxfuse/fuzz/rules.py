"""The rule-file fuzzer: mutate rule files; each mutant must load cleanly or fail clearly.

Mutants start from the built-in rule files, single rules cut out of them and
the examples in docs/rules.md, and get one to three mutations: YAML text
(lines deleted, duplicated, swapped, re-indented, truncated, junk inserted),
YAML structure (keys dropped, renamed, values of the wrong type, rules
duplicated, source and target swapped), ONNX text inside source/target
(tokens deleted, swapped, replaced by other ops, names, numbers, attribute
types; lines moved; headers and subgraph attributes added) and guard
expressions (tokens mutated, or replaced by adversarial expressions: deep
nesting, huge numbers, disallowed syntax, unknown names and functions).

A mutant passes if ``parse_rule_text`` raises OnnxfuseError (RuleError) with
a one-line message naming the file, or returns rules; valid rules are then
applied (optimize, no target gating) to a small model where the rule they
came from fires, which must also end in success or an OnnxfuseError. Any
other exception is a crash; no answer within the timeout is a hang (each
mutant runs in a worker process that is killed and restarted). Failures are
reduced (lines, then characters, while the failure stays the same) and saved
in the corpus.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import random
import re
import signal
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from onnxfuse.fuzz import corpus

MUTANT_PATH = "mutant.yaml"
DEFAULT_TIMEOUT = 10.0
# A clone's root (engine/onnxfuse/fuzz/ is three levels down): its docs' examples are
# seeds too; an installed package has none.
REPO_ROOT = Path(__file__).resolve().parents[3]


# -- seeds -----------------------------------------------------------------------------


def seed_texts() -> list[str]:
    """Whole rule files, single rules cut out of them, and the docs' YAML examples."""
    from onnxfuse.language.packs import builtin_rules_dir

    files = sorted(builtin_rules_dir().glob("*/*.yaml"))
    texts = [f.read_text(encoding="utf-8") for f in files]
    singles = []
    for text in texts:
        singles.extend(split_rules(text))
    docs = REPO_ROOT / "docs" / "rules.md"
    examples = []
    if docs.exists():
        for block in re.findall(r"```yaml\n(.*?)```", docs.read_text(encoding="utf-8"), re.S):
            if "rules:" in block:
                examples.append(block)
    return texts + singles + examples + [_FEATURES]


def split_rules(text: str) -> list[str]:
    """Each rule of a file as a file of its own: its lines as written, or re-dumped
    when it uses a YAML alias defined by another rule."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if re.match(r"^  - name:", line)]
    data = _safe_load(text)
    parsed = data.get("rules") if isinstance(data, dict) else None
    pieces = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        piece = "rules:\n" + "".join(lines[start:end])
        if _safe_load(piece) is None and isinstance(parsed, list) and k < len(parsed):
            piece = _dump({"rules": [parsed[k]]})
        pieces.append(piece)
    return pieces


# A rule using the keys the built-in packs do not: sources, optional, commutative, ...
_FEATURES = """\
rules:
  - name: features
    description: every key of the rule language
    benefit: 3
    references: [a, b]
    commutative: [com.example::MyOp]
    optional: [B]
    opset: {"": [11, 21], "com.microsoft": 1}
    imports: {com.microsoft: 1}
    tolerance: 0.001
    copy_attributes: {C: Y}
    sources:
      - |
        f <alpha> (X, W, B) => (Y) {
          C = Conv(X, W, B)
          Y = LeakyRelu<alpha: float = @alpha>(C)
        }
      - |
        g <alpha> (X, W, B) => (Y) {
          C = Conv(X, W, B)
          Y = LeakyRelu<alpha: float = @alpha>(C)
        }
    where:
      - rank(X) == 4 and dtype(X) == "float" and alpha >= 0
      - not present(B) or (is_constant(B) and numel(B) == shape(W)[0])
      - consumers(C) == 1 and not is_graph_input(W) and broadcastable(X, X)
    let:
      params: "[alpha]"
      k: "tuple(range(1, rank(W)))[:2] if all_equal(W, 0) == False else (1, 1)"
    target: |
      f <params> (X, W, B) => (Y) {
        Y = com.microsoft.FusedConv<activation = "LeakyRelu",
                                    activation_params: floats = @params>(X, W, B)
      }
    verify: {dtypes: [float]}
"""


# -- mutations ---------------------------------------------------------------------------

_JUNK = [
    ":",
    "- ",
    "[",
    "]",
    "{",
    "}",
    "|",
    ">",
    "&a ",
    "*a",
    "!!python/object:os.system ",
    "!!binary ",
    "? ",
    "<<: ",
    "'",
    '"',
    "#",
    "%",
    "@",
    "`",
    "\t",
    "\x00",
    "\ufeff",
    "é",
    "𝔁",
    "---\n",
    "...\n",
    "~",
    "null",
    "1e309",
    "-.inf",
    ".nan",
    "0x1F",
    "99999999999999999999999999",
    "yes",
]
_BAD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    float("inf"),
    float("nan"),
    "",
    "x",
    "1",
    [],
    [1, 2],
    ["a", None],
    {},
    {"a": 1},
    {"": [None, 3]},
    [[[[]]]],
    "\n",
    "a" * 300,
]
_KEYS = [
    "name",
    "description",
    "benefit",
    "references",
    "source",
    "sources",
    "replacement",
    "target",
    "where",
    "let",
    "optional",
    "commutative",
    "copy_attributes",
    "opset",
    "imports",
    "tolerance",
    "verify",
    "unknown_key",
    "rules",
]
_ONNX_WORDS = [
    "Relu",
    "Conv",
    "Constant",
    "Identity",
    "If",
    "Loop",
    "Scan",
    "Add",
    "Sum",
    "Split",
    "Dropout",
    "BatchNormalization",
    "Clip",
    "Reshape",
    "Transpose",
    "NoSuchOp",
    "com.microsoft.FusedConv",
    "com.microsoft.NoSuchOp",
    "ai.onnx.Relu",
    "ai.onnx.ml.Normalizer",
    "custom.domain.Op",
    "float",
    "int",
    "ints",
    "floats",
    "string",
    "strings",
    "tensor",
    "graph",
    "float[2]",
    "int64[]",
    "value",
    "value_float",
    "value_int",
    "value_ints",
    "value_string",
    "sparse_value",
    "then_branch",
    "perm",
    "axis",
    "alpha",
    "X",
    "Y",
    "W",
    "T",
    "''",
    '""',
    "@",
    "@eps",
    "@nope",
    "=>",
    "<",
    ">",
    "(",
    ")",
    "{",
    "}",
    ",",
    "=",
    ":",
    "[",
    "]",
]
_NUMBERS = [
    "0",
    "-1",
    "1e309",
    "-1e309",
    "nan",
    "inf",
    "99999999999999999999999",
    "-99999999999999999999999",
    "1.5",
    "0x10",
    "1e-400",
    "2147483648",
    "9223372036854775808",
]
_HEADERS = [
    '<domain: "x", opset_import: ["" : 17]>\n',
    '<domain: "x", opset_import: ["" : 999999999999]>\n',
    '<domain: "x", opset_import: ["" : -3]>\n',
    '<opset_import: ["com.microsoft" : 1]>\n',
    "<>\n",
    '<domain: "">\n',
]
_SUBGRAPH_NODES = [
    "  Z = If(X) <then_branch: graph = g () => (y) { y = Identity(X) }, "
    "else_branch: graph = h () => (y) { y = Identity(X) }>\n",
    "  Z = Loop(X, X) <body: graph = g (i, c) => (c2) { c2 = Identity(c) }>\n",
    "  Z = Constant<sparse_value = float[2] {1, 2}>()\n",
    '  Z = Constant<value_string = "s">()\n',
    "  Z = Constant<value = int64[0] {}>()\n",
    "  Z = Constant<value_ints = []>()\n",
    "  Z = Constant<value_float = 1e309>()\n",
    "  Z = Constant<value = bool[1] {1}>()\n",
    "  Z, W2 = Split(X)\n",
    "  Z = Sum(X, X, X, X, X, X, X, X)\n",
    "  Z = Transpose<perm = [99999999999999999999]>(X)\n",
    "  Z = Softmax<axis = -99999999999999999999>(X)\n",
    "  Z = LeakyRelu<alpha = 1e999>(X)\n",
    "  Z = Cast<to = 999>(X)\n",
]
_GUARDS = [
    "lambda x: x",
    "[i for i in range(3)]",
    "X.shape",
    "__import__('os')",
    "*X",
    "f'{X}'",
    "(y := 1)",
    "{1: 2}",
    "{1, 2}",
    "b'x'",
    "1j",
    "...",
    "X if",
    "not",
    "1 +",
    "((((",
    "'a' * 10**9",
    "[0] * 10**9",
    "9**9**9",
    "((10**64)**64)**64",
    "((((10**64)**64)**64)**64)**64",
    "2 ** 64 ** 1",
    "range(10**12)",
    "list(range(10**9))",
    "sum(range(10**12))",
    "len(range(10**18))",
    "sorted(range(10**7))",
    "tuple(range(10**4)) + tuple(range(10**4))",
    "-" * 3000 + "1",
    "(" * 300 + "1" + ")" * 300,
    "not " * 3000 + "True",
    "[" * 200 + "]" * 200,
    "1 if " * 500 + "1" + " else 1" * 500,
    "+".join(["1"] * 20000),
    "value(X)[::0]",
    "int('1' * 5000)",
    "float('nan') < 1",
    "max()",
    "min([])",
    "len(1)",
    "shape(X)[100]",
    "all_equal(X)",
    "rank()",
    "rank(rank)",
    "shape(1)",
    "value(nope)",
    "unknown(X)",
    "X.__class__",
    "X[0]",
    "abs(-1) == 1 < 2 < 3 < 4",
    "é == 1",
    "True and None or 'x' in 'xyz'",
    "1 / 0",
    "1 // 0 == 0",
    "None + 1",
    "'a' < 1",
    "float('1e309') == float('inf')",
    "range(1, 2, 0)",
    "sorted([1, 'a'])",
    "any(1)",
    "all(X)",
    "int(None)",
    "\x00",
]


class Mutator:
    """Makes mutants from seed texts with a seeded ``random.Random``."""

    def __init__(self, rng: random.Random, seeds: list[str]):
        self.rng = rng
        self.seeds = seeds

    def mutant(self) -> tuple[str, list[str]]:
        text = self.rng.choice(self.seeds)
        applied = []
        for _ in range(self.rng.choice([1, 1, 1, 2, 2, 3])):
            kind = self.rng.choice(["text", "data", "data", "pattern", "pattern", "guard", "guard"])
            mutated = getattr(self, f"_{kind}")(text)
            if mutated is not None:
                text = mutated
                applied.append(kind)
        return text, applied

    # YAML text ---------------------------------------------------------------------

    def _text(self, text: str) -> str:
        rng = self.rng
        lines = text.splitlines(keepends=True) or [""]
        i = rng.randrange(len(lines))
        op = rng.randrange(10)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            lines[i] = " " * rng.choice([1, 2, 4]) + lines[i]
        elif op == 4:
            lines[i] = lines[i].lstrip(" ") if rng.random() < 0.5 else lines[i][1:]
        elif op == 5:
            return text[: rng.randrange(len(text) + 1)]
        elif op == 6:
            position = rng.randrange(len(text) + 1)
            return text[:position] + rng.choice(_JUNK) + text[position:]
        elif op == 7:
            lines[i] = lines[i].replace(":", rng.choice(["", " :", "::", ": :"]), 1)
        elif op == 8:
            lines.insert(i, " " * rng.choice([0, 2, 4, 6]) + rng.choice(_JUNK) + "\n")
        else:
            position = rng.randrange(len(text) + 1)
            return (
                text[:position]
                + chr(rng.choice([0x7F, 0x85, 0x2028, 0xD7FF, 0x1F600]))
                + text[position:]
            )
        return "".join(lines)

    # YAML structure ----------------------------------------------------------------

    def _data(self, text: str) -> str | None:
        data = _safe_load(text)
        if data is None:
            return None
        rng = self.rng
        rules = data.get("rules") if isinstance(data, dict) else None
        if not isinstance(rules, list) or not rules or rng.random() < 0.1:
            data = _mutate_value(rng, data)
            return _dump(data)
        index = rng.randrange(len(rules))
        rule = rules[index]
        op = rng.randrange(8)
        if op == 0 and isinstance(rule, dict) and rule:
            rule.pop(rng.choice(list(rule)))
        elif op == 1 and isinstance(rule, dict) and rule:
            key = rng.choice(list(rule))
            rule[rng.choice(_KEYS)] = rule.pop(key)
        elif op == 2 and isinstance(rule, dict) and rule:
            key = rng.choice(list(rule))
            rule[key] = rng.choice(_BAD_VALUES)
        elif op == 3:
            rules.append(rules[index])  # the same name twice
        elif op == 4 and isinstance(rule, dict) and "source" in rule and _second(rule):
            key = _second(rule)
            rule["source"], rule[key] = rule[key], rule["source"]
        elif op == 5 and isinstance(rule, dict):
            rule[rng.choice(_KEYS)] = rng.choice(_BAD_VALUES)
        elif op == 6 and isinstance(rule, dict) and "source" in rule:
            second = rule.get(_second(rule) or "replacement")
            rule["sources"] = [rule.pop("source"), rng.choice([*_BAD_VALUES, second])]
        else:
            rules[index] = _mutate_value(rng, rule)
        return _dump(data)

    # ONNX text -----------------------------------------------------------------------

    def _pattern(self, text: str) -> str | None:
        data = _safe_load(text)
        slots = _string_slots(data, ("source", "sources", "replacement", "target"))
        if not slots:
            return None
        container, key = self.rng.choice(slots)
        container[key] = self.mutate_pattern(container[key])
        return _dump(data)

    def mutate_pattern(self, pattern: str) -> str:
        rng = self.rng
        op = rng.randrange(8)
        if op <= 2:
            tokens = re.findall(
                r'\s+|[A-Za-z_@][A-Za-z0-9_.]*|\d+\.?\d*(?:[eE][-+]?\d+)?|"[^"\n]*"|=>|.', pattern
            )
            solid = [i for i, t in enumerate(tokens) if not t.isspace()]
            if not solid:
                return pattern + rng.choice(_ONNX_WORDS)
            numbers = [i for i in solid if re.match(r"\d", tokens[i])]
            if numbers and rng.random() < 0.3:
                i = rng.choice(numbers)
                tokens[i] = rng.choice(_NUMBERS)
                return "".join(tokens)
            i = rng.choice(solid)
            choice = rng.randrange(6)
            if choice == 0:
                tokens[i] = ""
            elif choice == 1:
                tokens[i] = tokens[i] + " " + tokens[i]
            elif choice == 2:
                j = rng.choice(solid)
                tokens[i], tokens[j] = tokens[j], tokens[i]
            elif choice == 3 and re.match(r"\d", tokens[i]):
                tokens[i] = rng.choice(_NUMBERS)
            elif choice == 4:
                tokens[i] = rng.choice([t for t in tokens if not t.isspace()])
            else:
                tokens[i] = rng.choice(_ONNX_WORDS)
            return "".join(tokens)
        lines = pattern.splitlines(keepends=True) or [""]
        i = rng.randrange(len(lines))
        if op == 3:
            del lines[i]
        elif op == 4:
            lines.insert(i, lines[i])
        elif op == 5:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 6:
            return rng.choice(_HEADERS) + pattern
        else:
            inner = max(1, min(i, len(lines) - 1))
            lines.insert(inner, rng.choice(_SUBGRAPH_NODES))
        return "".join(lines)

    # guards ----------------------------------------------------------------------------

    def _guard(self, text: str) -> str | None:
        data = _safe_load(text)
        slots = _string_slots(data, ("where", "let"))
        if not slots:
            rules = data.get("rules") if isinstance(data, dict) else None
            if isinstance(rules, list) and rules and isinstance(rules[0], dict):
                rules[0]["where"] = [self.guard_expression("X")]
                return _dump(data)
            return None
        container, key = self.rng.choice(slots)
        container[key] = self.mutate_guard(container[key])
        return _dump(data)

    def mutate_guard(self, expression: str) -> str:
        rng = self.rng
        if rng.random() < 0.4:
            return rng.choice(_GUARDS)
        if rng.random() < 0.3:
            names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expression) or ["X"]
            return self.guard_expression(rng.choice(names))
        tokens = re.findall(
            r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*|\"[^\"]*\"|'[^']*'|.", expression
        )
        if not tokens:
            return rng.choice(_GUARDS)
        i = rng.randrange(len(tokens))
        replacement = rng.choice(
            [
                "",
                "(",
                ")",
                "[",
                "]",
                ",",
                ".",
                "**",
                "*",
                "not",
                "lambda",
                "==",
                "in",
                "is",
                "0",
                *_NUMBERS,
                "rank",
                "shape",
                "value",
                "numel",
                "nope",
                "X",
                "None",
                "'s'",
            ]
        )
        tokens[i] = replacement if rng.random() < 0.8 else tokens[i] * rng.randint(2, 50)
        return "".join(tokens)

    def guard_expression(self, name: str, depth: int = 0) -> str:
        """A random expression of the guard language (sometimes ill-typed)."""
        rng = self.rng
        if depth > 3 or rng.random() < 0.3:
            return rng.choice(
                [name, "0", "1", "-1", "2.5", "'float'", "None", "True", "(1, 2)", "[]", "eps"]
            )
        sub = self.guard_expression
        form = rng.randrange(8)
        if form == 0:
            fn = rng.choice(
                ["rank", "shape", "dtype", "numel", "is_constant", "value", "present", "consumers"]
            )
            return f"{fn}({sub(name, depth + 1)})"
        if form == 1:
            op = rng.choice(["+", "-", "*", "/", "//", "%", "**"])
            return f"({sub(name, depth + 1)} {op} {sub(name, depth + 1)})"
        if form == 2:
            op = rng.choice(["==", "!=", "<", "<=", "in", "not in", "is", "is not"])
            return f"{sub(name, depth + 1)} {op} {sub(name, depth + 1)}"
        if form == 3:
            return f"{sub(name, depth + 1)} {rng.choice(['and', 'or'])} {sub(name, depth + 1)}"
        if form == 4:
            return f"{sub(name, depth + 1)}[{sub(name, depth + 1)}]"
        if form == 5:
            return f"{sub(name, depth + 1)}[{rng.choice(['1:', ':-1', '::2', '::-1'])}]"
        if form == 6:
            fn = rng.choice(["len", "abs", "min", "max", "sum", "sorted", "tuple", "int", "range"])
            return f"{fn}({sub(name, depth + 1)})"
        return f"{sub(name, depth + 1)} if {sub(name, depth + 1)} else {sub(name, depth + 1)}"


def _safe_load(text: str) -> Any:
    try:
        data = yaml.safe_load(text)
    except Exception:
        return None
    return data if isinstance(data, dict) else None


def _mutate_value(rng: random.Random, value: Any, depth: int = 0) -> Any:
    if isinstance(value, dict) and value and depth < 4:
        key = rng.choice(list(value))
        value[key] = _mutate_value(rng, value[key], depth + 1)
        return value
    if isinstance(value, list) and value and depth < 4:
        i = rng.randrange(len(value))
        value[i] = _mutate_value(rng, value[i], depth + 1)
        return value
    return rng.choice(_BAD_VALUES)


def _string_slots(data: Any, keys: tuple[str, ...]) -> list[tuple[Any, Any]]:
    """(container, key) of every string under one of ``keys`` in the rules."""
    slots: list[tuple[Any, Any]] = []
    rules = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rules, list):
        return slots
    for rule in rules:
        if not isinstance(rule, dict):
            continue
        for key in keys:
            value = rule.get(key)
            if isinstance(value, str):
                slots.append((rule, key))
            elif isinstance(value, list):
                slots.extend((value, i) for i, v in enumerate(value) if isinstance(v, str))
            elif isinstance(value, dict):
                slots.extend((value, k) for k, v in value.items() if isinstance(v, str))
    return slots


class _Dumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if "\n" in value and all(c.isprintable() or c in "\n\t" for c in value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _represent_str)


def _dump(data: Any) -> str:
    try:
        return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)
    except Exception:
        return yaml.safe_dump({"rules": []})


# -- checking a mutant (in a worker process) -------------------------------------------------


def check_text(text: str, apply: bool = True) -> dict[str, Any]:
    """Load a rule text; optimize a model with each valid rule. Never raises."""
    from onnxfuse.errors import OnnxfuseError
    from onnxfuse.language.rulefile import parse_rule_text

    try:
        rules = parse_rule_text(text, MUTANT_PATH)
    except OnnxfuseError as exc:
        message = str(exc)
        if not message.strip() or "\n" in message.strip():
            return _result("bad-error", "load", exc, "the error message is not one line")
        if not message.startswith(MUTANT_PATH):
            return _result("bad-error", "load", exc, "the error message does not name the file")
        return {
            "status": "error",
            "message": message,
            "line": bool(re.match(r"^\S+:\d+:", message)),
        }
    except BaseException as exc:
        return _result("crash", "load", exc)
    applied = 0
    if apply:
        for rule in rules:
            try:
                applied += _apply_rule(rule)
            except OnnxfuseError:
                continue
            except BaseException as exc:
                return _result("crash", "apply", exc)
    return {"status": "valid", "rules": len(rules), "applied": applied}


def _result(status: str, stage: str, exc: BaseException, note: str = "") -> dict[str, Any]:
    frames = traceback.extract_tb(exc.__traceback__)
    chosen = None
    for frame in frames:
        if "/engine/" in frame.filename or "/onnxfuse/" in frame.filename:
            chosen = frame
    if chosen is None and frames:
        chosen = frames[-1]
    where = type(exc).__name__
    if chosen is not None:
        where += f"@{Path(chosen.filename).name}:{chosen.name}"
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0][:300] if text else ''}"
    if note:
        message = f"{note}: {message}"
    return {"status": status, "stage": stage, "where": where, "message": message}


def _apply_rule(rule) -> int:
    """Optimize zoo models that contain the rule's anchor op; 1 if it ran on any."""
    import onnx_ir as ir

    from onnxfuse.passes.pipeline import Options, optimize

    ran = 0
    for proto, ops in zoo():
        if not any(key in ops for key in rule.anchor_keys):
            continue
        model = ir.from_proto(proto)
        optimize(model, [rule], Options(target=None, max_iterations=3))
        ran = 1
        break
    return ran


_ZOO: list | None = None


def zoo() -> list:
    """Small models holding instances of the built-in rules' sources (built once)."""
    global _ZOO
    if _ZOO is None:
        from onnxfuse.fuzz.graphs import random_model

        models = []
        for index in range(48):
            proto = random_model(index)
            if proto is not None:
                ops = {(n.domain, n.op_type) for n in proto.graph.node}
                models.append((proto, ops))
        _ZOO = models
    return _ZOO


# -- the worker process ------------------------------------------------------------------


def _worker(connection, apply: bool, trace_path: str) -> None:
    import faulthandler
    import logging
    import signal
    import warnings

    from onnxfuse.proof.hypothesis_home import keep_hypothesis_files_out_of_the_working_directory

    warnings.simplefilter("ignore")
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    keep_hypothesis_files_out_of_the_working_directory()
    # On SIGUSR1 (a hang), dump the Python stack: the parent reads where it hangs.
    trace = open(trace_path, "w")  # noqa: SIM115 - open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=trace, all_threads=False)
    if apply:
        zoo()
    connection.send("ready")
    while True:
        try:
            text = connection.recv()
        except EOFError:
            return
        if text is None:
            return
        connection.send(check_text(text, apply))


class Worker:
    """A process that checks mutants; killed and restarted on a hang or a hard crash."""

    def __init__(self, apply: bool = True):
        self.apply = apply
        self.context = multiprocessing.get_context("spawn")
        self.process: multiprocessing.process.BaseProcess | None = None
        self.connection: multiprocessing.connection.Connection | None = None
        handle, self.trace_path = tempfile.mkstemp(prefix="onnxfuse-fuzz-", suffix=".trace")
        os.close(handle)

    def _start(self) -> None:
        parent, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_worker, args=(child, self.apply, self.trace_path), daemon=True
        )
        self.process.start()
        child.close()
        self.connection = parent
        if not parent.poll(120) or parent.recv() != "ready":
            raise RuntimeError("the rule-fuzzing worker did not start")

    def check(self, text: str, timeout: float) -> dict[str, Any]:
        if self.process is None or not self.process.is_alive():
            self._start()
        assert self.connection is not None and self.process is not None
        try:
            self.connection.send(text)
            if self.connection.poll(timeout):
                return self.connection.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self.process.exitcode if self.process is not None else None
            self.stop()
            return {
                "status": "abort",
                "stage": "?",
                "where": f"exit code {code}",
                "message": f"the worker process died (exit code {code})",
            }
        stage, where = self._hang_site()
        self.stop()
        return {
            "status": "hang",
            "stage": stage,
            "where": where,
            "message": f"no answer within {timeout:g}s (in {where})",
        }

    def _hang_site(self) -> tuple[str, str]:
        """Where the worker is stuck: its stack, dumped by faulthandler on SIGUSR1."""
        assert self.process is not None and self.process.pid is not None
        try:
            Path(self.trace_path).write_text("")
            os.kill(self.process.pid, signal.SIGUSR1)
            time.sleep(0.5)
            trace = Path(self.trace_path).read_text(errors="replace")
        except OSError:
            return "?", "timeout"
        return hang_site(trace)

    def stop(self) -> None:
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5)
        if self.connection is not None:
            self.connection.close()
        self.process = None
        self.connection = None


def hang_site(trace: str) -> tuple[str, str]:
    """(stage, innermost onnxfuse frame) from a faulthandler dump (most recent call first)."""
    frames = re.findall(r'File "([^"]+)", line \d+ in (\S+)', trace)
    names = [name for _, name in frames]
    stage = "load" if "parse_rule_text" in names else "apply" if "_apply_rule" in names else "?"
    for path, name in frames:
        if "/engine/" in path or "/onnxfuse/" in path:
            return stage, f"{Path(path).name}:{name}"
    return stage, f"{Path(frames[0][0]).name}:{frames[0][1]}" if frames else "timeout"


def failed(result: dict[str, Any]) -> bool:
    return result["status"] not in ("error", "valid")


def signature(result: dict[str, Any]) -> str:
    return f"{result['status']}:{result.get('stage', '?')}:{result.get('where', '')}"


# -- reduction -------------------------------------------------------------------------------


def reduce_text(text: str, still_fails: Callable[[str], bool], deadline: float) -> str:
    """Delta-debug ``text``: drop chunks of lines, then of characters, while it still fails."""

    def pieces_pass(pieces: list[str], joiner: str) -> list[str]:
        size = max(1, len(pieces) // 2)
        while size >= 1 and time.monotonic() < deadline:
            start = 0
            while start < len(pieces) and time.monotonic() < deadline:
                trial = pieces[:start] + pieces[start + size :]
                if trial and still_fails(joiner.join(trial)):
                    pieces = trial
                else:
                    start += size
            size //= 2
        return pieces

    lines = pieces_pass(text.splitlines(keepends=True), "")
    text = "".join(lines)
    chars = pieces_pass(list(text), "")
    return "".join(chars)


# -- the campaign --------------------------------------------------------------------------


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    valid: int = 0
    applied: int = 0
    without_line: int = 0
    failures: Counter = field(default_factory=Counter)
    cases: list[corpus.Case] = field(default_factory=list)  # new failures, to save

    def merge(self, other: Tally) -> None:
        for name in ("passed", "failed", "errors", "valid", "applied", "without_line"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures.update(other.failures)
        self.cases.extend(other.cases)


def derive_seed(*parts: object) -> int:
    text = ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


# Mutants per job when a campaign is spread over workers (each mutant is seeded by its
# index, so any cut gives the same mutants).
CHUNK_SIZE = 25


def run(
    iterations: int,
    fuzz_seed: int,
    timeout: float = DEFAULT_TIMEOUT,
    known: Collection[str] | None = None,
    apply: bool = True,
    shrink_seconds: float = 120.0,
    progress: Callable[[Tally], None] | None = None,
    command: str = "",
    start: int = 0,
) -> Tally:
    """Mutants ``start`` to ``start + iterations``; new failures (signature not in
    ``known``, the corpus's) reduced and returned in ``Tally.cases``; with ``known``
    None (no corpus) nothing is reduced."""
    seeds = seed_texts()
    tally = Tally()
    reduce = known is not None
    known = set(known or ())
    worker = Worker(apply)
    try:
        for iteration in range(start, start + iterations):
            rng = random.Random(derive_seed("rules", fuzz_seed, iteration))
            text, mutations = Mutator(rng, seeds).mutant()
            result = worker.check(text, timeout)
            if not failed(result):
                tally.passed += 1
                if result["status"] == "error":
                    tally.errors += 1
                    tally.without_line += not result.get("line")
                else:
                    tally.valid += 1
                    tally.applied += result.get("applied", 0)
            else:
                tally.failed += 1
                sig = signature(result)
                tally.failures[sig] += 1
                if reduce and sig not in known:
                    known.add(sig)
                    context = {"seed": fuzz_seed, "iteration": iteration, "mutations": mutations}
                    tally.cases.append(
                        _reduced_case(
                            worker, text, result, timeout, shrink_seconds, context, command
                        )
                    )
            if progress is not None:
                progress(tally)
    finally:
        worker.stop()
    return tally


def run_job(job: tuple, progress: Callable[[Tally], None] | None = None) -> Tally:
    """``run`` over one slice of a campaign's mutants (a worker's unit of work)."""
    fuzz_seed, start, count, timeout, known, apply, shrink_seconds, command = job
    return run(
        count,
        fuzz_seed,
        timeout=timeout,
        known=known,
        apply=apply,
        shrink_seconds=shrink_seconds,
        progress=progress,
        command=command,
        start=start,
    )


def _reduced_case(
    worker: Worker,
    text: str,
    result: dict[str, Any],
    timeout: float,
    seconds: float,
    context: dict[str, Any],
    command: str,
) -> corpus.Case:
    sig = signature(result)
    reduced = _reduce(worker, text, sig, timeout, seconds)
    final = worker.check(reduced, timeout)
    if signature(final) != sig:
        reduced, final = text, result
    data = {
        **context,
        "found_by": command,
        "failure": {
            "kind": final["status"],
            "stage": final.get("stage", "?"),
            "where": final.get("where", ""),
            "signature": sig,
            "message": final.get("message", ""),
        },
    }
    return corpus.Case("rule", reduced.encode(), ".yaml", data)


def _reduce(worker: Worker, text: str, sig: str, timeout: float, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    # A hang costs a full timeout per trial: reduce with a shorter one.
    trial_timeout = min(timeout, 3.0) if sig.startswith("hang") else timeout

    def still_fails(candidate: str) -> bool:
        return signature(worker.check(candidate, trial_timeout)) == sig

    return reduce_text(text, still_fails, deadline)


def replay_entry(
    entry: corpus.Entry, timeout: float = DEFAULT_TIMEOUT, worker: Worker | None = None
) -> str | None:
    """Check a saved rule mutant again: None if it now loads or fails clearly."""
    text = entry.payload.read_text(encoding="utf-8")
    own = worker is None
    worker = worker or Worker(apply=True)
    try:
        result = worker.check(text, timeout)
    finally:
        if own:
            worker.stop()
    return f"{signature(result)}: {result.get('message', '')}" if failed(result) else None


def _second(rule: dict) -> str | None:
    """The key a rule's replacement is written under (``target`` is its older name)."""
    return next((key for key in ("replacement", "target") if key in rule), None)
