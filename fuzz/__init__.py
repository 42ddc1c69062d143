"""A clone's fuzzing folder: the corpus of minimized failures (corpus/) and
``python -m fuzz``, which runs the fuzzers of ``onnxfuse.fuzz`` with that corpus
(see fuzz/README.md; installed, the same is ``onnxfuse fuzz``)."""
