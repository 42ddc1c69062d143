"""Reference definitions: ops with no CPU kernel, computed from standard ops.

A rule may create an op that onnxruntime runs only on another provider
(com.microsoft.NhwcConv: CUDA and DirectML), or a vendor's own op (acme.ConvRelu).
To check such a rewrite on this machine, a pack ships a *reference definition* of
the op: an ONNX function in the text syntax, in ``<pack>/reference/*.yaml``, read
from every built-in pack and every pack or rule file loaded in the run
(``language.packs.reference_folders``)::

    description: what the definitions are for
    functions:
      - |
        <domain: "com.microsoft", opset_import: ["" : 17]>
        NhwcConv <group, strides, pads, dilations, auto_pad, kernel_shape> (X, W, B) => (Y) {
          ...
        }

Before a model runs in the proof harness or the fuzz oracle, every node of
such an op is inlined as its definition. This checks the rewrite against *our
definition* of the op, not against the provider's kernel.
"""

from __future__ import annotations

import functools
from pathlib import Path

import onnx
import onnx.inliner
import onnx.parser

from onnxfuse.errors import RuleError, SourceError
from onnxfuse.language.packs import reference_folders
from onnxfuse.language.yaml_lines import LineList, LineMap, load_yaml

# What onnxruntime says when a model holds an op it has no kernel or schema for.
_NO_KERNEL = ("is not a registered function/op", "Could not find an implementation")
_STANDARD = ("", "ai.onnx")


def reference_functions() -> dict[tuple[str, str], onnx.FunctionProto]:
    """(domain, op type) -> its definition, from the reference folders of the packs in use."""
    return _definitions_in(tuple(reference_folders()))


@functools.cache
def _definitions_in(folders: tuple[Path, ...]) -> dict[tuple[str, str], onnx.FunctionProto]:
    found: dict[tuple[str, str], onnx.FunctionProto] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            for key, function in _read_definitions(path):
                if key in found:
                    raise RuleError(
                        f"a second reference definition of {key[0]}.{key[1]}", str(path)
                    )
                found[key] = function
    return found


def _read_definitions(path: Path) -> list[tuple[tuple[str, str], onnx.FunctionProto]]:
    try:
        document = load_yaml(path.read_text(encoding="utf-8"))
    except SourceError as exc:
        raise RuleError(exc.message, str(path), exc.line) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"cannot read reference definitions: {exc}", str(path)) from None
    functions = document.get("functions") if isinstance(document, LineMap) else None
    if not isinstance(functions, LineList):
        raise RuleError(
            "a reference file is a mapping with a 'functions' list of ONNX functions", str(path), 1
        )
    found = []
    for text, line in zip(functions, functions.item_lines):
        try:
            function = onnx.parser.parse_function(str(text))
        except Exception as exc:  # onnx's parser raises its own error types
            raise RuleError(f"not an ONNX function: {exc}", str(path), line) from None
        found.append(((function.domain, function.name), function))
    return found


def missing_definitions(model: onnx.ModelProto, error: str) -> str:
    """How to run the ops onnxruntime could not (``error``, its message) by giving them a
    reference definition; "" when the error is not about an op it lacks."""
    if not any(text in error for text in _NO_KERNEL):
        return ""
    definitions = reference_functions()
    wanted = sorted(
        f"{domain}.{op}"
        for domain, op in _used_ops(model)
        if domain not in _STANDARD and (domain, op) not in definitions and op in error
    )
    if not wanted:
        return ""
    return (
        f"; onnxruntime has no kernel for {', '.join(wanted)}: give "
        f"{'it' if len(wanted) == 1 else 'each'} a reference definition, an ONNX function "
        "computing it from standard ops, in <your pack>/reference/*.yaml (docs/rules.md, "
        '"Ops with no CPU kernel")'
    )


def _used_ops(model: onnx.ModelProto) -> set[tuple[str, str]]:
    used: set[tuple[str, str]] = set()

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            used.add((node.domain, node.op_type))
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(model.graph)
    for function in model.functions:
        used.update((node.domain, node.op_type) for node in function.node)
    return used


def needs_reference(model: onnx.ModelProto) -> bool:
    definitions = reference_functions()
    return any(key in definitions for key in _used_ops(model))


def with_reference_definitions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every op that has a reference definition inlined as it (a copy);
    the model itself when it holds none."""
    definitions = reference_functions()
    wanted = [key for key in sorted(_used_ops(model)) if key in definitions]
    if not wanted:
        return model
    _check_attributes(model, definitions)
    expanded = onnx.ModelProto()
    expanded.CopyFrom(model)
    imports = {o.domain: o.version for o in expanded.opset_import}
    local = {(f.domain, f.name) for f in expanded.functions}
    for key in wanted:
        if key in local:  # the model defines it itself: its own definition stands
            continue
        function = onnx.FunctionProto()
        function.CopyFrom(definitions[key])
        # Definitions use ops whose meaning does not change across the opsets a
        # rule builds at (Transpose, Conv): they run at the model's versions.
        for entry in function.opset_import:
            if entry.domain in imports:
                entry.version = imports[entry.domain]
            else:
                expanded.opset_import.add(domain=entry.domain, version=entry.version)
                imports[entry.domain] = entry.version
        expanded.functions.append(function)
    return onnx.inliner.inline_selected_functions(expanded, wanted)


class DefinitionMismatch(ValueError):
    """A node of a defined op that the definition (and the op) does not allow."""


def _check_attributes(
    model: onnx.ModelProto, definitions: dict[tuple[str, str], onnx.FunctionProto]
) -> None:
    """Every attribute of a defined op's node is one the definition declares: inlining
    would silently drop any other, and the provider's kernel rejects it."""
    nodes = list(model.graph.node) + [n for f in model.functions for n in f.node]
    for node in nodes:
        definition = definitions.get((node.domain, node.op_type))
        if definition is None:
            continue
        allowed = set(definition.attribute) | {a.name for a in definition.attribute_proto}
        unknown = sorted(a.name for a in node.attribute if a.name not in allowed)
        if unknown:
            raise DefinitionMismatch(
                f"{node.domain}.{node.op_type} node '{node.name}' has attributes its "
                f"definition does not declare: {', '.join(unknown)}"
            )


def with_reference_definitions_bytes(model_bytes: bytes) -> bytes:
    """As with_reference_definitions, for a serialized model (unparsed when no op name
    with a definition occurs in its bytes)."""
    names = {name.encode() for _domain, name in reference_functions()}
    if not any(name in model_bytes for name in names):
        return model_bytes
    model = onnx.load_from_string(model_bytes)
    expanded = with_reference_definitions(model)
    return model_bytes if expanded is model else expanded.SerializeToString()
