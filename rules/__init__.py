"""Built-in rule packs, one folder each (data, installed with onnxfuse)."""
