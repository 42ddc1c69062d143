from onnxfuse.cli.main import run

run()
