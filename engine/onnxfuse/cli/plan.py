"""`onnxfuse plan`: plan the arena of a model, check it, optionally verify and embed it."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

from onnxfuse.errors import OnnxfuseError
from onnxfuse.planner.strategies import STRATEGIES

if TYPE_CHECKING:
    import onnx_ir as ir

    from onnxfuse.planner.plan import Plan

# Traced shapes named in the summary; the plan's JSON has them all.
_LISTED = 8


def add_plan_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="place every intermediate tensor at an offset in one arena",
        description=__doc__,
    )
    p.add_argument("model", metavar="IN", help="the ONNX model (never modified)")
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=(
            "bind a symbolic dim, by its name (dims written as expressions of it follow) "
            "or as TENSOR:AXIS for a dim the model does not name (repeatable)"
        ),
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="give a graph input its whole shape, its dims named or not (repeatable)",
    )
    p.add_argument(
        "--input-value",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help=(
            "fix a graph input's value (a sample rate, a flag an If branches on): folded "
            "like a constant; the plan holds for runs with that value (repeatable)"
        ),
    )
    p.add_argument(
        "--trace-shapes",
        action="store_true",
        help=(
            "run the model once on seeded inputs to measure the shapes static inference "
            "cannot give (NonZero counts, ...): the plan holds for runs of those shapes"
        ),
    )
    p.add_argument("--strategy", default="search", help=f"one of: {', '.join(STRATEGIES)}")
    p.add_argument("--align", type=int, default=64, metavar="BYTES", help="default 64")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan as JSON")
    p.add_argument("--embed", metavar="OUT.onnx", help="write the model with the plan embedded")
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the model inside the arena and compare with onnxruntime",
    )
    p.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help=(
            "with --verify: a rule pack or file whose reference/ folder defines ops "
            "onnxruntime has no CPU kernel for (a vendor's; repeatable; the built-in packs' "
            "definitions are always read)"
        ),
    )
    p.add_argument("--schedule", action="store_true", help="reorder nodes to lower the peak first")
    p.add_argument("--no-inplace", action="store_true", help="no in-place reuse")
    p.add_argument(
        "--keep-constants",
        action="store_true",
        help="place values computed from constants only in the arena too",
    )
    p.set_defaults(handler=run_plan)


def parse_dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        # The value is digits: a dim or tensor name may itself hold "=".
        name, sep, value = item.rpartition("=")
        if not sep or not name or not _positive(value):
            raise OnnxfuseError(f"--dim expects NAME=VALUE with a positive integer, not {item!r}")
        dims[name] = int(value)
    return dims


def parse_input_shapes(items: list[str]) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        values = dims.split(",") if dims else []  # NAME= gives a scalar
        if not sep or not name or not all(_positive(v) for v in values):
            raise OnnxfuseError(
                f"--input-shape expects NAME=D1,D2,... with positive integers, not {item!r}"
            )
        if name in shapes:
            raise OnnxfuseError(f"--input-shape {name} is given twice")
        shapes[name] = [int(v) for v in values]
    return shapes


def parse_input_values(items: list[str]) -> dict[str, list[float]]:
    values: dict[str, list[float]] = {}
    for item in items:
        name, sep, text = item.rpartition("=")
        try:
            numbers = [float(v) for v in text.split(",")] if text else []
        except ValueError:
            numbers = []
        if not sep or not name or not numbers or not all(math.isfinite(v) for v in numbers):
            raise OnnxfuseError(f"--input-value expects NAME=V1,V2,... with numbers, not {item!r}")
        if name in values:
            raise OnnxfuseError(f"--input-value {name} is given twice")
        values[name] = numbers
    return values


def _positive(text: str) -> bool:
    return text.strip().isdigit() and 0 < int(text) < 2**63


def run_plan(args: argparse.Namespace) -> int:
    # Imported here: onnxruntime is slow to import and other commands do not need it.
    from onnxfuse.cli.report import warn_repairs
    from onnxfuse.files.input_files import INPUT_FILES_META
    from onnxfuse.files.model_io import load_model, save_model
    from onnxfuse.files.output_paths import check_distinct, check_output, refuse_overwriting
    from onnxfuse.planner.checker import check_plan
    from onnxfuse.planner.embed import embed_plan
    from onnxfuse.planner.plan import plan_model
    from onnxfuse.rewrite.report import REPAIRS_META

    dims = parse_dims(args.dim)
    input_shapes = parse_input_shapes(args.input_shape)
    input_values = parse_input_values(args.input_value)
    check_distinct({"-o": args.output, "--embed": args.embed})
    outputs = [p for p in (args.output, args.embed) if p is not None]
    for output in outputs:
        check_output(output)
    model = load_model(args.model)
    inputs = model.meta.get(INPUT_FILES_META)
    refuse_overwriting(outputs, inputs)
    plan = plan_model(
        model,
        dims=dims,
        strategy=args.strategy,
        alignment=args.align,
        inplace=not args.no_inplace,
        schedule=args.schedule,
        fold_constants=not args.keep_constants,
        input_shapes=input_shapes,
        trace_shapes=args.trace_shapes,
        input_values=input_values,
    )
    check_plan(plan, model)
    print(summary(plan))
    if args.output:
        plan.write_json(args.output)
    if args.embed:
        embedded, _ = embed_plan(model, plan)
        save_model(embedded, args.embed, inputs=inputs)
    result = _verify(model, plan, args.rules) if args.verify else None
    # Once nothing can fail: an error stays one line.
    warn_repairs(model.meta.get(REPAIRS_META, ()))
    if result is not None:
        diffs = json.dumps(result.max_abs_diff)
        if not result.ok:
            print(f"verify: MISMATCH on {', '.join(result.mismatched)} (max abs diff {diffs})")
            return 1
        print(f"verify: outputs match onnxruntime (max abs diff {diffs})")
    return 0


def _verify(model: ir.Model, plan: Plan, rules: list[str]):
    """verify_plan, with the ops that have a reference definition (in the built-in packs
    or in ``rules``) run as it, and a hint where an op has none."""
    import onnx_ir as ir

    from onnxfuse.language.packs import load_packs
    from onnxfuse.planner.arena_executor import verify_plan
    from onnxfuse.proof.reference_ops import missing_definitions, with_reference_definitions

    load_packs(list(rules))  # their reference folders are read from now on
    try:
        return verify_plan(model, plan, runnable=with_reference_definitions)
    except OnnxfuseError as exc:
        hint = missing_definitions(ir.to_proto(model), str(exc))
        if not hint:
            raise
        raise OnnxfuseError(f"{exc}{hint}, and name that pack with --rules") from None


def summary(plan: Plan) -> str:
    arena = plan.arena_bytes
    lines = [
        f"strategy {plan.strategy}, alignment {plan.alignment}, in-place {plan.inplace}, "
        f"order {plan.schedule}, {len(plan.tensors)} tensors in {len(plan.steps)} steps",
        f"arena        {arena:>14,} bytes",
    ]
    for label, value, ratio in (
        ("lower bound", plan.lower_bound_bytes, "arena/bound"),
        ("naive", plan.naive_bytes, "arena/naive"),
        ("ort policy", plan.ort_policy_bytes, "arena/ort"),
    ):
        share = f"{arena / value:.4f}" if value else "n/a"
        lines.append(f"{label:<12} {value:>14,} bytes  {ratio:<11} {share}")
    if plan.traced:
        shapes = {t.name: t.shape for t in plan.entries()}
        named = [name for name in plan.traced[:_LISTED] if name in shapes]
        listed = ", ".join(f"{name} {shapes[name]}" for name in named)
        more = f", ... ({len(plan.traced) - _LISTED} more)" if len(plan.traced) > _LISTED else ""
        lines.append(f"from the traced run: {len(plan.traced)} shapes ({listed}{more})")
    if plan.schedule == "memory":
        lines.append(
            f"scheduling lowered the peak from {plan.graph_order_lower_bound_bytes:,} bytes "
            f"to {plan.lower_bound_bytes:,}"
        )
    return "\n".join(lines)
