"""The Python API: ``optimize`` for any kind of model, and what the command line runs."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import onnx
import onnx_ir as ir

from onnxfuse.errors import InvariantError, ModelError, OnnxfuseError, one_line
from onnxfuse.files.input_files import INPUT_FILES_META, InputFiles
from onnxfuse.files.model_io import check_model, load_model_and_types, save_model
from onnxfuse.files.model_size import input_bytes, size_change
from onnxfuse.files.output_paths import check_output, model_file, refuse_overwriting
from onnxfuse.files.repair import repair_computed_outputs
from onnxfuse.fold.spill import spilling
from onnxfuse.graph.traversal import all_graphs
from onnxfuse.language.packs import check_unique, load_builtin_packs, load_packs, resolve_packs
from onnxfuse.language.rule import Rule
from onnxfuse.passes import pipeline
from onnxfuse.passes.normalize import normalize
from onnxfuse.passes.pipeline import Options
from onnxfuse.rewrite.explain import Explanation, explain_rule
from onnxfuse.rewrite.report import Report, RuleStats
from onnxfuse.support.heap import long_lived_objects_frozen
from onnxfuse.targets.capabilities import Target, resolve_target
from onnxfuse.targets.params import BLOCK_SIZE_METADATA, NCHWC_DOMAIN


def sample_model_path() -> Path:
    """The small ResNet-style CNN shipped with the package."""
    return Path(str(resources.files("onnxfuse") / "data" / "sample_resnet.onnx"))


ModelLike = TypeVar("ModelLike", onnx.ModelProto, ir.Model, str, os.PathLike)


def optimize(
    model: ModelLike,
    target: Target | str | None = "cpu",
    rules: Sequence[str | os.PathLike | Rule] = (),
    *,
    output: str | os.PathLike | None = None,
    builtin: bool = True,
    disable: Sequence[str] = (),
    return_report: bool = False,
    **options: Any,
) -> Any:
    """Optimize ``model`` for ``target`` and return the same kind of model.

    - an ``onnx.ModelProto`` gives a new ``ModelProto`` (the argument is left as it was);
    - an ``onnx_ir.Model`` is optimized in place and returned;
    - a path is read and the result written atomically to ``output`` (required), whose
      path is returned.

    ``rules``: rule files, pack folders or loaded ``Rule``s, added to the built-in packs
    (``builtin=False`` leaves those out); ``disable``: rule or op-set family names left
    out. ``options``: the fields of ``Options`` (``max_iterations``, ``max_rewrites``,
    ``fold_limit_bytes``, ``progress``). ``return_report=True`` returns ``(result,
    Report)``. The result is checked as the command line checks it.
    """
    known = {f.name for f in fields(Options)} - {"target"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise OnnxfuseError(f"optimize: unknown option {', '.join(unknown)}")
    resolved = resolve_target(target)
    paths = [r for r in rules if not isinstance(r, Rule)]
    chosen = select_rules(paths, list(disable), builtin=builtin, target=resolved)
    chosen += [r for r in rules if isinstance(r, Rule)]
    run_options = Options(target=resolved, **options)
    result: Any
    if isinstance(model, ir.Model):
        report = pipeline.optimize(model, chosen, run_options)
        report.repairs += repair_computed_outputs(model)
        record_layout_assumptions(model, resolved)
        try:
            check_model(model, resolved)
        except InvariantError as exc:
            fired = sorted(n for n, s in report.rules.items() if s.applied)
            culprits = rules_creating(str(exc), fired)
            if not culprits:
                raise
            # Optimized in place: there is no model left to run again without them.
            raise InvariantError(
                f"rule {', '.join(culprits)} created nodes the ONNX checker rejects (the "
                f"model is left as optimized; a copy, a ModelProto or a file is optimized "
                f"again without the rule): {exc}"
            ) from None
        result = model
    elif isinstance(model, onnx.ModelProto):
        with tempfile.TemporaryDirectory(prefix="onnxfuse-") as folder:
            source, written = Path(folder) / "in.onnx", Path(folder) / "out.onnx"
            onnx.save(model, source)
            report = optimize_file(source, written, chosen, run_options)
            result = onnx.load(written)
    elif isinstance(model, (str, os.PathLike)):
        if output is None:
            raise OnnxfuseError("optimize: a model given by its path needs output=")
        report = optimize_file(model, output, chosen, run_options)
        result = Path(output)
    else:
        raise OnnxfuseError(
            f"optimize: expected an onnx.ModelProto, an onnx_ir.Model or a path, "
            f"not {type(model).__name__}"
        )
    return (result, report) if return_report else result


def select_rules(
    extra: Sequence[str | os.PathLike] | None = None,
    disable: list[str] | None = None,
    builtin: bool = True,
    target: Target | str | None = None,
) -> list[Rule]:
    """Built-in packs, then the user's rule files and pack folders, minus disabled rules.

    With a ``target`` (a Target, a target name or a capability file), pack
    manifests apply: a pack for other targets is left out, and an active pack
    drops the packs it ``replaces`` and brings in those it ``extends``.
    """
    packs = load_builtin_packs() if builtin else []
    packs += load_packs([Path(p) for p in extra or []])
    resolved = resolve_target(target)
    target_name = resolved.name if resolved is not None else None
    rules = [rule for pack in resolve_packs(packs, target_name) for rule in pack.rules]
    check_unique(rules)
    if disable:
        # An op-set family's name (transpose-unary) stands for all its members.
        names = {r.name for r in rules} | {r.family for r in rules if r.family}
        unknown = [d for d in disable if d not in names]
        if unknown:
            raise OnnxfuseError(f"--disable: no rule named {', '.join(unknown)}")
        rules = [r for r in rules if r.name not in set(disable) and r.family not in set(disable)]
    return rules


def why_not_selected(
    name: str,
    extra: Sequence[str | os.PathLike] | None = None,
    builtin: bool = True,
    target: Target | str | None = None,
) -> str | None:
    """Why ``select_rules`` for ``target`` leaves out the rule or op-set family ``name``
    that a pack of the selection holds: its pack is for other targets, or another pack
    active there replaces it (None: no pack holds it, or it is selected)."""
    packs = load_builtin_packs() if builtin else []
    packs += load_packs([Path(p) for p in extra or []])
    holding = [p for p in packs if any(name in (r.name, r.family) for r in p.rules)]
    resolved = resolve_target(target)
    if resolved is None or not holding:
        return None
    active = resolve_packs(packs, resolved.name)
    for pack in holding:
        if any(p.name == pack.name for p in active):
            continue
        targets = pack.manifest.targets or []
        if not pack.manifest.applies_to(resolved.name):
            return (
                f"rule '{name}' is in pack '{pack.name}', which is only for target(s) "
                f"{', '.join(targets)}, not '{resolved.name}' (give --target {targets[0]})"
            )
        by = [p.name for p in active if pack.name in p.manifest.replaces]
        return (
            f"rule '{name}' is in pack '{pack.name}', which pack '{', '.join(by)}' replaces "
            f"on target '{resolved.name}'"
        )
    return None


def optimize_file(
    source: str | os.PathLike,
    output: str | os.PathLike | None,
    rules: list[Rule],
    options: Options | None = None,
    also_writes: Sequence[str | os.PathLike] = (),
) -> Report:
    """Optimize a model file; write the result atomically (the input is never touched).
    ``also_writes``: files the caller writes after (a report), refused like ``output``
    if the input reads them.

    A model the checker rejects at the end, in a node a rule created (one whose mistake
    shows only once the rewrite's constants fold), is not written: the run starts again
    from the file without that rule, and the report names it as blocked. Each round
    leaves out at least one rule that fired; a failure in no rule's node is an error."""
    left_out: dict[str, RuleStats] = {}
    while True:
        try:
            report = _optimize_file_once(source, output, rules, options, also_writes)
        except _RulesBrokeTheModel as broke:
            for name in broke.rules:
                left_out[name] = RuleStats(
                    blocked=broke.report.rules[name].applied,
                    blocked_reason=f"left out of the run: with its rewrites the {broke.failure}",
                    ill_typed=broke.failure,
                )
            rules = [r for r in rules if r.name not in broke.rules]
            continue
        report.rules.update(left_out)
        return report


class _RulesBrokeTheModel(Exception):
    """The checker rejects the optimized model in nodes these rules created."""

    def __init__(self, rules: list[str], failure: str, report: Report):
        super().__init__(failure)
        self.rules = rules
        self.failure = failure
        self.report = report


def _optimize_file_once(
    source: str | os.PathLike,
    output: str | os.PathLike | None,
    rules: list[Rule],
    options: Options | None,
    also_writes: Sequence[str | os.PathLike],
) -> Report:
    source = Path(source)
    if output is not None:  # before the work; data files when saving
        check_output(output)
        refuse_overwriting([output], model_file(source))
    target = options.target if options is not None else None
    with long_lived_objects_frozen() as loaded:
        model, inferred = load_model_and_types(source, target)
        loaded()
        refuse_overwriting(also_writes, model.meta.get(INPUT_FILES_META))  # before the work
        # Large folded values wait on disk for the save (from 1 MiB with external weights).
        with spilling(model):
            # With an output, the last shape inference runs on the protobuf the save writes.
            report = pipeline.optimize(
                model, rules, options, inferred, final_inference=output is None
            )
            try:
                report.repairs += repair_computed_outputs(model)
            except ModelError as exc:
                raise ModelError(f"{source}: {exc}") from None
            record_layout_assumptions(model, target)
            try:
                _write_or_check(model, source, output, target)
            except InvariantError as exc:  # a rule's replacement, or onnxfuse
                fired = sorted(n for n, s in report.rules.items() if s.applied)
                culprits = rules_creating(str(exc), fired)
                if culprits:
                    raise _RulesBrokeTheModel(culprits, one_line(str(exc)), report) from None
                names = ", ".join(fired) or "none"
                raise InvariantError(f"{exc} (rules that fired: {names})") from None
    files = model.meta.get(INPUT_FILES_META)
    if output is not None and isinstance(files, InputFiles):
        change = size_change(input_bytes(files), files, Path(output))
        report.bytes_before, report.bytes_after = change.bytes_before, change.bytes_after
        report.larger_because = list(change.reasons)
    return report


def rules_creating(failure: str, fired: list[str]) -> list[str]:
    """The rules among ``fired`` whose rewrites created the nodes a checker ``failure``
    names: a rewrite names its nodes ``ANCHOR/RULE`` (``fresh`` may add ``_N``)."""
    found = []
    for node_name in re.findall(r"node name: ([^)]*)\)", failure):
        last = node_name.rsplit("/", 1)[-1]
        for name in fired:
            if name not in found and re.fullmatch(re.escape(name) + r"(_\d+)?", last):
                found.append(name)
    return found


def _write_or_check(
    model: ir.Model, source: Path, output: str | os.PathLike | None, target: Target | None
) -> None:
    try:
        if output is None:
            check_model(model, target)
        else:
            save_model(model, output, target, infer=True)
    except InvariantError as exc:
        output_name = _declared_output_conflict(model, str(exc))
        if output_name is not None:
            raise ModelError(
                f"{source}: graph output '{output_name}' is declared with a shape the graph "
                f"does not compute (folding made it visible): {exc}"
            ) from None
        raise


def record_layout_assumptions(model: ir.Model, target: Target | None) -> None:
    """A model holding NCHWc ops runs correctly only at the block size it was laid out
    for: record it in the metadata (``onnxfuse.nchwc_block_size``)."""
    block = target.params.get("block") if target is not None else None
    if block is None:
        return
    if any(node.domain == NCHWC_DOMAIN for graph in all_graphs(model) for node in graph):
        model.metadata_props[BLOCK_SIZE_METADATA] = str(block)


def _declared_output_conflict(model: ir.Model, message: str) -> str | None:
    """The graph output whose declared shape or type the checker found wrong, if any."""
    found = re.search(r"node name: ([^)]*)\)", message)
    if found is None or "existing" not in message:
        return None
    for node in model.graph:
        if node.name == found.group(1):
            for output in node.outputs:
                if output.is_graph_output():
                    return output.name
    return None


def explain(
    model: ir.Model, rule: Rule, node_name: str | None = None, target: Target | None = None
) -> list[Explanation]:
    """For each node where ``rule`` could anchor, whether it matches and, if not, why;
    the model is normalized first, so that the rule sees it as optimize does."""
    normalize(model)
    return explain_rule(model, rule, node_name, target)
