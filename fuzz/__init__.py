"""Fuzzers for onnxfuse: a differential graph fuzzer and a rule-file mutator.

``python -m fuzz graphs ...`` and ``python -m fuzz rules ...`` (see fuzz/README.md).
"""
