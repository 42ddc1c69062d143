"""What the passes of one run share: the report they fill, fresh names, the folder."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxfuse.fold.folder import DEFAULT_FOLD_LIMIT_BYTES, Folder
from onnxfuse.graph.names import NameSource
from onnxfuse.ops.inference import InferredTypes
from onnxfuse.rewrite.driver import MatcherCache
from onnxfuse.rewrite.report import Report


@dataclass
class RunState:
    """Made by the pipeline for one model; ``folder`` is set by NormalizePass."""

    report: Report
    names: NameSource
    matchers: MatcherCache
    fold_limit_bytes: int = DEFAULT_FOLD_LIMIT_BYTES
    inferred: InferredTypes | None = None  # onnx's inference of the model as loaded
    dequantize: bool = False  # fold DequantizeLinear of constants (Options.dequantize)
    folder: Folder | None = field(default=None)

    @property
    def keeps_qdq_units(self) -> bool:
        """The run's target consumes QDQ node units itself (``quantization: qdq_units``)."""
        target = self.matchers.target
        return target is not None and target.keeps_qdq_units

    def require_folder(self) -> Folder:
        if self.folder is None:
            raise RuntimeError("NormalizePass must run before the passes that fold")
        return self.folder
