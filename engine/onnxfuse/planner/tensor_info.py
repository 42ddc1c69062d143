"""A tensor's element type and concrete shape: what the planner needs to size it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's element type and concrete shape."""

    dtype: ir.DataType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        # Sub-byte types (int4, float4) pack two elements a byte: round up.
        return math.ceil(self.dtype.itemsize * math.prod(self.shape))
