"""The fuzzers: a differential graph fuzzer (random models with rule sources inside,
optimized for each target and compared with onnxruntime) and a rule-file mutator.
``onnxfuse fuzz graphs|rules|replay`` runs them (``command``); a clone's
``python -m fuzz`` runs them with the clone's corpus (fuzz/README.md)."""
