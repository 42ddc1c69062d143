"""A rule written in Python: onnxscript functions as source and target patterns."""

from onnxscript import opset17 as op
from onnxscript import script

from onnxfuse.language.python_rules import rule_from_functions


@script()
def double_relu(X):
    return op.Relu(op.Relu(X))


@script()
def single_relu(X):
    return op.Relu(X)


RELU_RELU = rule_from_functions("py-relu-relu", double_relu, single_relu, benefit=2)
