"""onnxfuse: an ONNX graph optimizer whose fusions and foldings are declarative rules.

```python
import onnx, onnxfuse

optimized = onnxfuse.optimize(onnx.load("model.onnx"), target="cpu")
```

Everything a program needs is here; the subpackages are the implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxfuse.errors import ModelError, OnnxfuseError, RuleError, SourceError
from onnxfuse.support.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from onnxfuse.api import explain, optimize, select_rules
    from onnxfuse.language.packs import load_rules
    from onnxfuse.passes.pipeline import OptimizePass, Options
    from onnxfuse.planner.plan import plan_model as plan
    from onnxfuse.proof.check import check_rules
    from onnxfuse.rewrite.report import Report, RuleStats, StopKind, StopReason
    from onnxfuse.targets.capabilities import Target, load_target

__version__ = "0.1.0"

# Imported on first use: `import onnxfuse` stays cheap, and the command line, which
# imports this package first, loads only what its command needs.
_EXPORTS: dict[str, str | tuple[str, str]] = {
    "optimize": "api",
    "explain": "api",
    "select_rules": "api",
    "load_rules": "language.packs",
    "OptimizePass": "passes.pipeline",
    "Options": "passes.pipeline",
    "plan": ("planner.plan", "plan_model"),
    "check_rules": "proof.check",
    "Report": "rewrite.report",
    "RuleStats": "rewrite.report",
    "StopKind": "rewrite.report",
    "StopReason": "rewrite.report",
    "Target": "targets.capabilities",
    "load_target": "targets.capabilities",
}
__all__ = [
    "ModelError",
    "OnnxfuseError",
    "OptimizePass",
    "Options",
    "Report",
    "RuleError",
    "RuleStats",
    "SourceError",
    "StopKind",
    "StopReason",
    "Target",
    "__version__",
    "check_rules",
    "explain",
    "load_rules",
    "load_target",
    "optimize",
    "plan",
    "select_rules",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
