"""Limits in machine form, read from the sources' own words (their `notes`).

The reference data states constraints as text ("1D/2D only; bias must be
constant"). Where a constraint is about ranks, attributes, constness or the
number of inputs/outputs of a node, it is written here in the limits
vocabulary of docs/targets.md, next to the words it comes from. What cannot
be stated that way (value ranges, backend feature levels, shapes of runtime
inputs) stays in the entry's `notes` only.

Input indices follow the ONNX schema: Conv (X, W, B), Gemm (A, B, C),
BatchNormalization (X, scale, B, mean, var), Resize (X, roi, scales, sizes),
Slice (data, starts, ends, axes, steps), Pad (data, pads, constant_value, axes).
"""

from __future__ import annotations

from typing import Any

Limits = dict[str, Any]

# Limits a provider states for every op ("Generally input rank <= 4").
PROVIDER_LIMITS: dict[str, Limits] = {
    "coreml": {"max_rank": 5},  # "Every input needs a known shape, rank <= 5"
    "nnapi": {"max_rank": 4},  # "Generally input rank <= 4 (NNAPI limit)"
}

_REDUCE = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
)
_AXES_CONSTANT: Limits = {"input_constant": [1]}
_POOL_2D: Limits = {"input_rank": {0: [4]}, "max_outputs": 1}
_RESIZE_WEB: Limits = {
    "input_rank": {0: [4]},
    "input_constant": [2, 3],
    "attributes": {
        "antialias": [0],
        "exclude_outside": [0],
        "keep_aspect_ratio_policy": ["stretch"],
        "mode": ["linear", "nearest"],
    },
}

OP_LIMITS: dict[str, dict[str, Limits]] = {
    "coreml": {
        # Modelled for the MLProgram format: the NeuralNetwork-only constraints
        # (PRelu slope, MatMul B constant, ...) do not apply.
        "AveragePool": _POOL_2D,  # "4D input (2D pool) only; single output"
        "MaxPool": {**_POOL_2D, "attributes": {"storage_order": [0]}},  # "storage_order!=1"
        "GlobalAveragePool": {"input_rank": {0: [4]}},  # "4D input only"
        "GlobalMaxPool": {"input_rank": {0: [4]}},
        **{op: _AXES_CONSTANT for op in _REDUCE},  # "axes input must be constant"
        # "4D input only; single output (inference); spatial==1; scale/B/mean/var initializers"
        "BatchNormalization": {
            "input_rank": {0: [4]},
            "max_outputs": 1,
            "input_constant": [1, 2, 3, 4],
            "attributes": {"spatial": [1]},
        },
        # "single output; stash_type==1; scale (and B) must be constant"
        "GroupNormalization": {
            "max_outputs": 1,
            "attributes": {"stash_type": [1]},
            "input_constant": [1, 2],
        },
        "InstanceNormalization": {"input_constant": [1, 2]},  # "scale (and B) must be constant"
        # "single output (no Mean/InvStdDev); stash_type==1; scale (and B) must be constant"
        "LayerNormalization": {
            "max_outputs": 1,
            "attributes": {"stash_type": [1]},
            "input_constant": [1, 2],
        },
        "ArgMax": {"attributes": {"select_last_index": [0]}},  # "select_last_index must be 0"
        "Clip": {"input_constant": [1, 2]},  # "min/max must be constant"
        "Concat": {"min_inputs": 2},  # ">=2 inputs"
        "Conv": {"spatial_dims": [1, 2], "input_constant": [2]},  # "1D/2D only; bias constant"
        # "weight and bias constant; auto_pad SAME_* unsupported; output_shape unsupported"
        "ConvTranspose": {
            "input_constant": [1, 2],
            "attributes": {"auto_pad": ["NOTSET", "VALID"], "output_shape": [None]},
        },
        # "transA==0, alpha==1, beta==1; B must be constant initializer; C (if present) constant"
        "Gemm": {
            "attributes": {"transA": [0], "alpha": [1.0], "beta": [1.0]},
            "input_constant": [1, 2],
        },
        # "1D x ND (and ND x 1D) unsupported"
        "MatMul": {"input_rank": {0: [2, 3, 4, 5], 1: [2, 3, 4, 5]}},
        "GridSample": {"input_rank": {0: [4]}},  # "4D input"
        "Reshape": {"input_constant": [1]},  # "shape input must be constant"
        # "no antialias; mode linear or nearest; exclude_outside=0; stretch; scales or sizes
        # constant. MLProgram: rank 3-5"
        "Resize": {**_RESIZE_WEB, "input_rank": {0: [3, 4, 5]}},
        "Slice": {"input_constant": [1, 2, 3, 4]},  # "starts/ends/axes/steps constant"
        "Split": {"input_constant": [1]},  # "split input (if given) constant"
        "Squeeze": _AXES_CONSTANT,  # "opset>12: axes input must be constant"
        "Unsqueeze": _AXES_CONSTANT,
    },
    "nnapi": {
        # "rank <= 4; single output; spatial=1; scale/B/mean/var constant"
        "BatchNormalization": {
            "max_outputs": 1,
            "input_constant": [1, 2, 3, 4],
            "attributes": {"spatial": [1]},
        },
        "Cast": {"attributes": {"to": [1, 6]}},  # "to must be FLOAT or INT32"
        "Clip": {"input_constant": [1, 2]},  # "constant min/max"
        "DepthToSpace": {"attributes": {"mode": ["DCR"]}},  # "Only DCR mode"
        "DequantizeLinear": {"input_constant": [1, 2]},  # "scales and zero points constant"
        "QuantizeLinear": {"input_constant": [1, 2]},
        "LRN": {"input_rank": {0: [4]}},  # "4D only"
        # "Only constant mode Pad; pads and constant_value constant"
        "Pad": {"attributes": {"mode": ["constant"]}, "input_constant": [1, 2]},
        "Reshape": {"input_constant": [1]},  # "shape must be constant"
        # "4D; no antialias/axes; scales/sizes constant"
        "Resize": {
            "input_rank": {0: [4]},
            "input_constant": [2, 3],
            "attributes": {"antialias": [0], "axes": [None]},
        },
        "Slice": {"input_constant": [1, 2, 3, 4]},  # "starts/ends/axes/steps constant"
        "Split": {"input_constant": [1]},  # "Input split should be constant if provided"
        "Squeeze": _AXES_CONSTANT,  # "Input axes should be constant"
        "Unsqueeze": _AXES_CONSTANT,
        # "4D (2D pool) only; count_include_pad=0; no ceil_mode; single output"
        "AveragePool": {**_POOL_2D, "attributes": {"count_include_pad": [0], "ceil_mode": [0]}},
        "GlobalAveragePool": {"input_rank": {0: [4]}},  # "4D only"
        "GlobalMaxPool": {"input_rank": {0: [4]}},
        # "4D (2D pool) only; no ceil_mode; storage_order 0; single output"
        "MaxPool": {**_POOL_2D, "attributes": {"ceil_mode": [0], "storage_order": [0]}},
        # "Only 2D Conv; Weights and bias should be constant"
        "Conv": {"input_rank": {0: [4]}, "input_constant": [1, 2]},
        # "Weights and bias constant; all quantization scales and zero points constant"
        "QLinearConv": {"input_rank": {0: [4]}, "input_constant": [1, 2, 3, 4, 5, 6, 7, 8]},
        "Gemm": {"attributes": {"transA": [0], "alpha": [1.0], "beta": [1.0]}},
        "MatMul": {"input_constant": [1]},  # "B must be constant"
        "QLinearMatMul": {"input_constant": [1, 2, 4, 5, 6, 7]},
        "QLinearAdd": {"input_constant": [1, 2, 4, 5, 6, 7]},
        "QLinearAveragePool": {"input_rank": {0: [4]}, "input_constant": [1, 2, 3, 4]},
        "QLinearSigmoid": {"input_constant": [1, 2, 3, 4]},
        "Max": {"min_inputs": 2, "max_inputs": 2},  # "exactly 2 inputs"
        "Min": {"min_inputs": 2, "max_inputs": 2},
        # "axes constant; opset>=18 noop_with_empty_axes unsupported"
        "ReduceMean": {"input_constant": [1], "attributes": {"noop_with_empty_axes": [0]}},
    },
    "qnn": {
        "Sum": {"min_inputs": 2, "max_inputs": 2},  # "takes exactly 2 inputs"
        "ScatterND": {"attributes": {"reduction": ["none"]}},  # "does not support reduction"
        "ScatterElements": {"attributes": {"reduction": ["none"]}},
        "LpNormalization": {"attributes": {"p": [2]}},  # "'p' attribute equal to 2"
        # "QNN Pool only supports rank 3, 4, or 5! ... only supports 1 output!"
        **{
            op: {"input_rank": {0: [3, 4, 5]}, "max_outputs": 1}
            for op in ("AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool")
        },
        "Tile": {"input_constant": [1]},  # "doesn't support dynamic repeats input"
        "Expand": {"input_constant": [1]},  # "doesn't support dynamic shape"
        # "doesn't support axes; more than 5 dimensions; dynamic pad / constant_value input"
        "Pad": {"input_constant": [1, 2], "max_inputs": 3, "max_rank": 5},
        # "axis ... input[1] must be a constant; default 0 for exclusive / reverse"
        "CumSum": {"input_constant": [1], "attributes": {"exclusive": [0], "reverse": [0]}},
        # "input ranks of size <= 4; doesn't support dynamic scale; scale 1D"
        "BatchNormalization": {"max_rank": 4, "input_constant": [1], "input_rank": {1: [1]}},
        "LayerNormalization": {"max_outputs": 1},  # "QNN LayerNorm only support 1 output"
        "RMSNormalization": {"max_rank": 4},  # "input rank <= 4; output rank <= 4"
        "LRN": {"input_rank": {0: [3, 4]}},  # "input ranks of size 3 or 4"
        # "doesn't support anti-aliasing; input rank >= 3, maximum 5"
        "Resize": {"input_rank": {0: [3, 4, 5]}, "attributes": {"antialias": [0]}},
        # "rank ... at least 3 and no greater than 5; doesn't support dynamic scales"
        "Upsample": {"input_rank": {0: [3, 4, 5]}, "input_constant": [1]},
    },
    "xnnpack": {
        # "4D static C,H,W; ceil_mode=0; count_include_pad=0 (float)"
        "AveragePool": {
            "input_rank": {0: [4]},
            "attributes": {"ceil_mode": [0], "count_include_pad": [0]},
        },
        # "input rank 3 or 4 (1D/2D); weight constant; bias constant"
        "Conv": {"input_rank": {0: [3, 4]}, "input_constant": [1, 2]},
        "ConvTranspose": {"input_rank": {0: [3, 4]}, "input_constant": [1, 2]},
        "QLinearConv": {"input_rank": {0: [3, 4]}, "input_constant": [1, 2, 3, 4, 5, 6, 7, 8]},
        # "4D; mode linear only; scales/sizes constant; no antialias/axes; extrapolation_value 0"
        "Resize": {
            "input_rank": {0: [4]},
            "input_constant": [2, 3],
            "attributes": {
                "mode": ["linear"],
                "antialias": [0],
                "axes": [None],
                "extrapolation_value": [0.0],
            },
        },
        # "4D with static C,H,W; no Indices output; ceil_mode=0"
        "MaxPool": {**_POOL_2D, "attributes": {"ceil_mode": [0]}},
        # "alpha=1, beta=1; B (and C) constant initializers; A,B,C rank<=2"
        "Gemm": {
            "attributes": {"alpha": [1.0], "beta": [1.0]},
            "input_constant": [1, 2],
            "max_rank": 2,
        },
        # "exactly 2 inputs; B constant with rank<=2"
        "MatMul": {"input_constant": [1], "input_rank": {1: [1, 2]}},
    },
    "tensorrt": {
        "AveragePool": {"spatial_dims": [2, 3]},  # "2D or 3D Pooling only"
        "MaxPool": {"spatial_dims": [2, 3], "max_outputs": 1},  # "`Indices` output unsupported"
        "CumSum": {"input_constant": [1]},  # "`axis` must be an initializer"
        "DeformConv": {"spatial_dims": [1, 2]},  # "1D or 2D spatial dimensions"
        "Dropout": {"input_constant": [2]},  # "`is_traning` must be an initializer"
        "GridSample": {"input_rank": {0: [4]}},  # "Input must be 4D input."
        "LayerNormalization": {"max_outputs": 1},  # "Only the first output `Y` is supported."
        "LSTM": {"attributes": {"input_forget": [0], "layout": [0]}},
        "OneHot": {"input_constant": [1]},  # "`depth` must be a build-time constant"
        "Pad": {"input_constant": [3]},  # "`axes` must be an initializer"
        **{op: _AXES_CONSTANT for op in _REDUCE},  # "`axes` must be an initializer"
        "Resize": {
            "attributes": {
                "coordinate_transformation_mode": [
                    "half_pixel",
                    "pytorch_half_pixel",
                    "tf_half_pixel_for_nn",
                    "asymmetric",
                    "align_corners",
                ],
                "mode": ["nearest", "linear"],
                "nearest_mode": ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"],
                "keep_aspect_ratio_policy": ["stretch"],
                "antialias": [0],
            }
        },
        "ScatterND": {"attributes": {"reduction": ["none"]}},  # "`reduction` is not supported"
        "Slice": {"input_constant": [3]},  # "`axes` must be an initializer"
        "Squeeze": _AXES_CONSTANT,
        "Unsqueeze": _AXES_CONSTANT,
        "TopK": {"attributes": {"sorted": [1]}},  # "`sorted` must be 1"
        # "`sparse_value`, `value_string`, and `value_strings` attributes are unsupported"
        "Constant": {
            "attributes": {"sparse_value": [None], "value_string": [None], "value_strings": [None]}
        },
    },
    "webnn": {
        "AveragePool": {"input_rank": {0: [4]}},  # "Only supports 4-D input"
        # "Only supports 'training_mode' value is 0, one output"
        "BatchNormalization": {"attributes": {"training_mode": [0]}, "max_outputs": 1},
        # "Only supports 3-D or 4-D input and 'W' (weight)"
        **{
            op: {"input_rank": {0: [3, 4], 1: [3, 4]}}
            for op in ("Conv", "ConvInteger", "ConvTranspose")
        },
        "CumSum": {"input_constant": [1]},  # "'axis' input should be a constant"
        "Expand": {"input_constant": [1]},  # "'shape' input should be a constant"
        "GatherND": {"attributes": {"batch_dims": [0]}},  # "Only supports 'batch_dims' == 0"
        "GlobalAveragePool": {"input_rank": {0: [4]}},  # "Only supports 4-D input"
        "GlobalMaxPool": {"input_rank": {0: [4]}},
        "GlobalLpPool": {"input_rank": {0: [4]}, "attributes": {"p": [2]}},
        "LpPool": {"input_rank": {0: [4]}, "attributes": {"p": [2]}},
        # "Only supports 'layout' == 0 ... 'clip' is not supported"
        "GRU": {"attributes": {"layout": [0], "clip": [None]}},
        "LSTM": {"attributes": {"layout": [0], "input_forget": [0], "clip": [None]}},
        # "Only supports 4-D input, 2-D 'kernel_shape', 'storage_order' != 1, one output"
        "MaxPool": {**_POOL_2D, "attributes": {"storage_order": [0]}},
        "Pad": {"attributes": {"mode": ["constant", "reflect", "edge"]}},  # "'wrap' unsupported"
        **{op: _AXES_CONSTANT for op in _REDUCE},  # "Input 'axes' if present ... constant"
        "Reshape": {"input_constant": [1]},  # "Input 'shape' should be a constant"
        "Resize": _RESIZE_WEB,
        "ScatterElements": {"attributes": {"reduction": ["none"]}},
        "ScatterND": {"attributes": {"reduction": ["none"]}},
        "Slice": {"input_constant": [1, 2, 3, 4]},  # "'starts', 'ends', 'axes', 'steps' constant"
        "Split": {"input_constant": [1]},  # "Input 'split' if present should be a constant"
        "Squeeze": _AXES_CONSTANT,
        "Tile": {"input_constant": [1]},  # "Input 'repeats' should be a constant"
        "Trilu": {"input_constant": [1]},  # "Input 'k' ... if present should be a constant"
        # "Inputs 'B' and 'zero_points' (if present) should be constants, only bits=4"
        "MatMulNBits": {"input_constant": [1, 3], "attributes": {"bits": [4]}},
    },
    "js": {
        "Conv": {"spatial_dims": [1, 2]},  # "conv3d is not supported"
        "ConvTranspose": {"spatial_dims": [1, 2]},  # "ConvTranspose3d is not supported"
    },
}

_FLOAT_ONLY = ["float", "float16"]

# Element types the sources state in words rather than as type constraints
# (applied to the type variable of input 0, the one the provider checks).
OP_TYPES: dict[str, dict[str, list[str]]] = {
    "xnnpack": {
        "AveragePool": ["float", "float16", "uint8"],  # "float/float16/uint8(QDQ)"
        "Conv": ["float", "float16", "int8", "uint8"],  # "float/float16/uint8/int8 (QDQ)"
        "ConvTranspose": ["float", "float16", "int8", "uint8"],  # "constraints as Conv"
        "MaxPool": ["float", "float16", "int8", "uint8"],  # "float/float16/uint8/int8"
        "Gemm": _FLOAT_ONLY,  # "A float/float16"
        "MatMul": _FLOAT_ONLY,  # "A float/float16"
        "Softmax": ["float", "float16", "uint8"],  # "float/float16/uint8(QDQ)"
    },
    "coreml": {
        # "MLProgram: in/out types in {int32,int64,float,float16}"
        "Cast": ["float", "float16", "int32", "int64"],
    },
}

# com.microsoft kernels of the WebGPU and JS providers: "WebGPU/JS support
# float32/float16" (the sources extracted no type constraints).
WEB_FLOAT_CONTRIB_OPS = frozenset(
    {
        "Attention",
        "BiasAdd",
        "BiasGelu",
        "BiasSplitGelu",
        "FastGelu",
        "FusedConv",
        "Gelu",
        "GroupQueryAttention",
        "MultiHeadAttention",
        "QuickGelu",
        "RotaryEmbedding",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "MatMulNBits",
    }
)
WEB_FLOAT_TYPES = _FLOAT_ONLY


def limits_for(target: str, op_type: str) -> Limits:
    """The provider's own limits merged with the op's (the op's win where both speak)."""
    merged: Limits = dict(PROVIDER_LIMITS.get(target, {}))
    merged.update(OP_LIMITS.get(target, {}).get(op_type, {}))
    return merged
