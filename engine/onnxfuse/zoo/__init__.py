"""`onnxfuse zoo`: every model of a folder or manifest optimized and checked, beside its peers."""
