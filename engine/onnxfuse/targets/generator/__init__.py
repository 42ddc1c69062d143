"""The generator of `targets/*.yaml`: onnxruntime's kernel registry and the reference data."""
