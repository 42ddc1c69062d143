"""Reference definitions: ops with no CPU kernel, computed from standard ops.

A rule may create an op that onnxruntime runs only on another provider
(com.microsoft.NhwcConv: CUDA and DirectML). To check such a rewrite on this
machine, a pack ships a *reference definition* of the op: an ONNX function in
the text syntax, in ``rules/<pack>/reference/*.yaml``::

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
from importlib import resources
from pathlib import Path

import onnx
import onnx.inliner
import onnx.parser
import yaml

REFERENCE_FOLDER = "reference"


def _rules_dir() -> Path:
    return Path(str(resources.files("onnxfuse.builtin_rules")))


@functools.cache
def reference_functions() -> dict[tuple[str, str], onnx.FunctionProto]:
    """(domain, op type) -> its definition, from every built-in pack's reference folder."""
    found: dict[tuple[str, str], onnx.FunctionProto] = {}
    for path in sorted(_rules_dir().glob(f"*/{REFERENCE_FOLDER}/*.yaml")):
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for text in document.get("functions") or []:
            function = onnx.parser.parse_function(text)
            key = (function.domain, function.name)
            if key in found:
                raise ValueError(f"{path}: a second reference definition of {key[0]}.{key[1]}")
            found[key] = function
    return found


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
