"""`onnxfuse zoo`: every model of a folder or manifest optimized and checked, beside its peers."""

# What `--peers` names, and the tool each runs (onnxfuse.zoo.peers). Here, not in run.py:
# the command line lists them without importing the runner.
PEERS = {
    "ort": "ort-extended",
    "ort-transformers": "ort-transformers",
    "onnxscript": "onnxscript",
    "onnxslim": "onnxslim",
}
