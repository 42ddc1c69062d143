"""onnxfuse: an ONNX graph optimizer whose fusions and foldings are declarative rules."""

from onnxfuse.errors import ModelError, OnnxfuseError, RuleError

__version__ = "0.1.0"

__all__ = ["ModelError", "OnnxfuseError", "RuleError", "__version__"]
