"""Capability files of execution providers (data, installed with onnxfuse)."""
