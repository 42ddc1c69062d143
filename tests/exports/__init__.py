"""Real exporter output: small torch/transformers models exported by torch.onnx, cached.

`models` builds the models, `export` exports and caches them, `anchors` runs onnxfuse and
the tools it is compared with (onnxruntime's optimizers, onnxscript) on an export.
"""
