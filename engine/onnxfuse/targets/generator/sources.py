"""Capability files from the reference data in targets/sources/ (one JSON per provider).

Each provider's JSON lists ops with domain, op type, opset range, element
types and the source's notes (targets/sources/PROVENANCE.md says where each
came from). Turning an entry into a target-file op:

- kernel registries (CUDA, DML, XNNPACK, WebGPU, JS) and the WebNN op table
  give opset ranges of the model's opset import: taken as they are;
- op builders (CoreML, NNAPI, QNN) look ops up by op type and compare the
  builder's [min, max] with the *schema version* of the node; here that
  becomes the range of model opsets whose schema version falls inside it,
  for the ai.onnx op only (a com.microsoft op of the same name is not meant);
- the TensorRT parser supports models of opset 9 to 20: every op's range is
  cut to that;
- element types are keyed by the schema's type variable (the sources write
  `T` for "the type of input 0"); limits come from targets_gen_limits.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx.defs

from onnxfuse.targets.generator.limits import (
    OP_TYPES,
    WEB_FLOAT_CONTRIB_OPS,
    WEB_FLOAT_TYPES,
    limits_for,
)

# The repository's targets/ folder: the generator runs from a checkout, not an install.
TARGETS_DIR = Path(__file__).resolve().parents[4] / "targets"
SOURCES = TARGETS_DIR / "sources"
ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")
TENSORRT_OPSETS = (9, 20)  # "inclusive range of opset 9 to opset 20 (model opset)"


@dataclass(frozen=True)
class Provider:
    name: str
    file: str
    kind: str  # "kernels", "builders" or "parser"
    description: str


PROVIDERS = (
    Provider("cuda", "CUDAExecutionProvider", "kernels", "onnxruntime CUDAExecutionProvider"),
    Provider(
        "dml", "DmlExecutionProvider", "kernels", "onnxruntime DmlExecutionProvider (DirectML)"
    ),
    Provider(
        "coreml",
        "CoreMLExecutionProvider",
        "builders",
        "onnxruntime CoreMLExecutionProvider, MLProgram format",
    ),
    Provider("nnapi", "NnapiExecutionProvider", "builders", "onnxruntime NnapiExecutionProvider"),
    Provider("qnn", "QNNExecutionProvider", "builders", "onnxruntime QNNExecutionProvider"),
    Provider(
        "xnnpack", "XnnpackExecutionProvider", "kernels", "onnxruntime XnnpackExecutionProvider"
    ),
    Provider(
        "webgpu",
        "WebGpuExecutionProvider",
        "kernels",
        "onnxruntime WebGpuExecutionProvider (native WebGPU)",
    ),
    Provider(
        "js", "JsExecutionProvider", "kernels", "onnxruntime-web JSEP (WebGPU JavaScript kernels)"
    ),
    Provider("webnn", "WebNNExecutionProvider", "kernels", "onnxruntime-web WebNN provider"),
    Provider(
        "tensorrt",
        "TensorrtExecutionProvider",
        "parser",
        "onnxruntime TensorrtExecutionProvider (onnx-tensorrt 10.1 parser)",
    ),
)


# Spellings in the sources that are not ONNX's: C++ names, a typo in TensorRT's doc.
_SPELLINGS = {"MLFloat16": "float16", "INF64": "int64"}


def short_type(type_name: str) -> str:
    """'tensor(float)' -> 'float'; sequence and map types keep their spelling (no spaces)."""
    name = type_name.replace(" ", "")
    if name.startswith("tensor(") and name.endswith(")"):
        name = name[len("tensor(") : -1]
    name = _SPELLINGS.get(name, name)
    name = re.sub(r"map\((\w+),tensor\((\w+)\)\)", r"map(\1,\2)", name)  # onnxruntime's
    if name.endswith("_t") and name[:-2] in ("int8", "uint8", "int16", "int32", "int64"):
        name = name[:-2]
    return name


# -- schemas (onnx's for ONNX domains, onnxruntime's for the others) ----------------


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], list[Any]]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    found: dict[tuple[str, str], list[Any]] = {}
    for schema in state.get_all_operator_schema():
        found.setdefault((schema.domain, schema.name), []).append(schema)
    for versions in found.values():
        versions.sort(key=lambda s: s.since_version)
    return found


@functools.cache
def _onnx_history() -> dict[tuple[str, str], list[onnx.defs.OpSchema]]:
    found: dict[tuple[str, str], list[onnx.defs.OpSchema]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        found.setdefault((schema.domain, schema.name), []).append(schema)
    for versions in found.values():
        versions.sort(key=lambda s: s.since_version)
    return found


def schema_versions(domain: str, op_type: str) -> list[int]:
    if domain in ONNX_DOMAINS and (domain, op_type) in _onnx_history():
        return [s.since_version for s in _onnx_history()[(domain, op_type)]]
    return [s.since_version for s in _ort_schemas().get((domain, op_type), [])]


def _schema(domain: str, op_type: str, until: int | None) -> Any | None:
    """The newest schema version in force at ``until`` (onnx's, else onnxruntime's)."""
    if domain in ONNX_DOMAINS and (domain, op_type) in _onnx_history():
        versions: list[Any] = _onnx_history()[(domain, op_type)]
    else:
        versions = _ort_schemas().get((domain, op_type), [])
    fitting = [s for s in versions if until is None or s.since_version <= until]
    return fitting[-1] if fitting else (versions[0] if versions else None)


def _type_str(formal: Any) -> str:
    return getattr(formal, "type_str", None) or formal.typeStr


def _is_variadic(formal: Any) -> bool:
    return "Variadic" in str(formal.option)


def signature(domain: str, op_type: str, until: int | None) -> dict[str, list[str]] | None:
    """Formal inputs/outputs -> type variables, for ops onnx itself does not define.

    Stored in the target file so that gating needs no onnxruntime at run time;
    a trailing ``...`` marks a variadic formal.
    """
    if domain in ONNX_DOMAINS and onnx.defs.has(op_type, domain):
        return None
    schema = _schema(domain, op_type, until)
    if schema is None:
        return None

    def describe(formals: list[Any]) -> list[str]:
        return [_type_str(f) + ("..." if _is_variadic(f) else "") for f in formals]

    return {"inputs": describe(schema.inputs), "outputs": describe(schema.outputs)}


def schema_types(
    domain: str, op_type: str, since: int, until: int | None
) -> dict[str, set[str]] | None:
    """Element types the op's schema allows per type variable, in any version in force
    at opsets [since, until] (None: no schema known)."""
    if domain in ONNX_DOMAINS and (domain, op_type) in _onnx_history():
        versions: list[Any] = _onnx_history()[(domain, op_type)]
    else:
        versions = _ort_schemas().get((domain, op_type), [])
    if not versions:
        return None
    allowed: dict[str, set[str]] = {}
    for index, schema in enumerate(versions):
        ends = versions[index + 1].since_version - 1 if index + 1 < len(versions) else None
        if (until is not None and schema.since_version > until) or (
            ends is not None and ends < since
        ):
            continue
        for constraint in schema.type_constraints:
            types = {short_type(t) for t in _allowed(constraint)}
            allowed.setdefault(constraint.type_param_str, set()).update(types)
    return allowed


def _allowed(constraint: Any) -> list[str]:
    return list(getattr(constraint, "allowed_type_strs", None) or constraint.allowed_type_strs)


def restrict_to_schema(
    domain: str, op_type: str, since: int, until: int | None, types: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Kernel types the schema also allows: a kernel registered for a type the op's
    schema rejects (onnxruntime's CPU SkipLayerNormalization for double) is unusable,
    since a model using it fails graph resolution."""
    allowed = schema_types(domain, op_type, since, until)
    if allowed is None:
        return types
    return {k: [t for t in v if k not in allowed or t in allowed[k]] for k, v in types.items()}


def _type_variables(schema: Any) -> list[str]:
    return [c.type_param_str for c in schema.type_constraints]


def _input0_variable(schema: Any) -> str | None:
    for formals in (schema.inputs, schema.outputs):
        if formals and _type_str(formals[0]) in _type_variables(schema):
            return _type_str(formals[0])
    return None


# -- opset ranges ------------------------------------------------------------------


def builder_range(
    domain: str, op_type: str, low: int, high: int | None
) -> tuple[int, int | None] | None:
    """Model opsets whose schema version of the op lies in the builder's [low, high]."""
    versions = schema_versions(domain, op_type)
    if not versions:
        return low, high
    inside = [v for v in versions if v >= low and (high is None or v <= high)]
    if not inside:
        return None
    later = [v for v in versions if v > inside[-1]]
    return inside[0], (later[0] - 1 if later else None)


def parser_range(domain: str, op_type: str) -> tuple[int, int | None] | None:
    low, high = TENSORRT_OPSETS
    versions = schema_versions(domain, op_type)
    since = max(low, versions[0]) if versions else low
    return (since, high) if since <= high else None


# -- one provider ------------------------------------------------------------------


def read_source(provider: Provider, directory: Path = SOURCES) -> dict[str, Any]:
    return json.loads((directory / f"{provider.file}.json").read_text(encoding="utf-8"))


def provider_target(provider: Provider, directory: Path = SOURCES) -> dict[str, Any]:
    data = read_source(provider, directory)
    notes = list(data.get("provider_notes") or [])
    ops: list[dict[str, Any]] = []
    dropped: list[str] = []
    for entry in data["ops"]:
        op = _convert(provider, entry)
        if op is None:
            dropped.append(entry["op_type"])
        else:
            ops.append(op)
    if dropped:
        notes.append(_dropped_note(provider, sorted(set(dropped))))
    ops.sort(key=lambda o: (o["domain"], o["op"], o["since"]))
    return {
        "name": provider.name,
        "description": provider.description,
        "provider": data["provider"],
        "source": data["source"],
        "source_kind": data.get("kind", ""),
        "generated_by": "python -m onnxfuse.targets.generator.generate",
        "notes": notes,
        "ops": _unique(ops),
    }


def _dropped_note(provider: Provider, ops: list[str]) -> str:
    if provider.name == "coreml":
        why = "NeuralNetwork-only builders, not used in the MLProgram format"
    elif provider.kind == "parser":
        why = f"no schema version inside the parser's opsets {TENSORRT_OPSETS}"
    else:
        why = "no schema version inside the builder's opset range"
    return f"left out ({why}): {', '.join(ops)}"


def _convert(provider: Provider, entry: dict[str, Any]) -> dict[str, Any] | None:
    domain, op_type = entry["domain"], entry["op_type"]
    notes = entry.get("notes") or ""
    if provider.name == "coreml" and notes.startswith("[NeuralNetwork only]"):
        return None
    since, until = int(entry["since"]), entry["until"]
    if provider.kind == "builders":
        found = builder_range(domain, op_type, since, until)
    elif provider.kind == "parser":
        found = parser_range(domain, op_type)
    else:
        found = (since, until)
    if found is None:
        return None
    since, until = found
    op: dict[str, Any] = {"domain": domain, "op": op_type, "since": since, "until": until}
    types = _types(provider, domain, op_type, since, until, entry.get("types") or {})
    if types:
        op["types"] = types
    limits = limits_for(provider.name, op_type)
    if limits:
        op["limits"] = _plain(limits)
    described = signature(domain, op_type, until)
    if described is not None:
        op["signature"] = described
    if notes:
        op["notes"] = notes
    return op


def _types(
    provider: Provider,
    domain: str,
    op_type: str,
    since: int,
    until: int | None,
    raw: dict[str, list[str]],
) -> dict[str, list[str]]:
    stated = {k: sorted({short_type(t) for t in v} - {""}) for k, v in raw.items()}
    extra = OP_TYPES.get(provider.name, {}).get(op_type)
    if extra is None and provider.name in ("webgpu", "js") and domain == "com.microsoft":
        extra = WEB_FLOAT_TYPES if op_type in WEB_FLOAT_CONTRIB_OPS else None
    if extra is not None:
        stated = {"T": sorted(extra)}
    schema = _schema(domain, op_type, until)
    if schema is None:
        return stated
    allowed_by_schema = schema_types(domain, op_type, since, until) or {}
    keyed: dict[str, list[str]] = {k: v for k, v in stated.items() if k in allowed_by_schema}
    for key, listed in stated.items():
        if key in keyed:
            continue
        name = _variable_for(key, listed, schema, allowed_by_schema)
        if name is not None and name not in keyed:
            keyed[name] = listed
    return dict(sorted(restrict_to_schema(domain, op_type, since, until, keyed).items()))


def _variable_for(
    key: str, listed: list[str], schema: Any, allowed: dict[str, set[str]]
) -> str | None:
    """The schema's type variable a source's key means (None: nothing to gate on).

    Kernel tables may key a constraint by the formal parameter's name
    (Reshape's `shape`): that formal's type variable, or nothing if its type is
    fixed. The builder sources write `T` for "the type the provider checks":
    usually input 0's type variable, but not always (QuantizeLinear's uint8
    output), so the variable whose allowed types share most with what they
    list, input 0's on a tie. Other names (onnxruntime's own `V` of an older
    LayerNormalization) mean nothing in this schema.
    """
    for formal in (*schema.inputs, *schema.outputs):
        if formal.name == key:
            type_str = _type_str(formal)
            return type_str if type_str in allowed else None
    if key != "T":
        return None
    first = _input0_variable(schema)
    candidates = [v for v in [first, *allowed] if v is not None]
    candidates = list(dict.fromkeys(candidates))
    overlap = [len(set(listed) & allowed.get(name, set())) for name in candidates]
    if not any(overlap):
        return None
    return candidates[overlap.index(max(overlap))]


def _plain(limits: dict[str, Any]) -> dict[str, Any]:
    """A copy of its own, so that YAML writes no anchors for limits shared between ops."""
    return copy.deepcopy(limits)


def _unique(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    unique = []
    for op in ops:
        key = json.dumps(op, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(op)
    return unique
