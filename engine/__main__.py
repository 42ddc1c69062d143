from onnxfuse.cli import run

run()
